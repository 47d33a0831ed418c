#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// A chain root -> root+1 -> ...: every rank sends the buffer once; the pipeline fills in n-2 chunks.
Cost BroadcastRing::cost(size_t bytes, int n) {
  if (n <= 1) return {};
  constexpr double kChunk = 1 << 20;  // typical chunk (see chunk_elems)
  const double chunks = std::max(1.0, static_cast<double>(bytes) / kChunk);
  const double fill = std::min(static_cast<double>(bytes), kChunk) * (n - 2);
  return {(n - 1) + chunks - 1, static_cast<double>(bytes) + fill};
}

void BroadcastRing::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size();
  if (n == 1 || a.count == 0) return;
  const size_t es = dtype_size(a.dtype);
  algo::tree_bcast(ctx, algo::chain_links(ctx.rank(), a.root, n), a.recv, a.count, es,
                   algo::chunk_elems(ctx, a.count * es, es), 0);
}

}  // namespace trident
