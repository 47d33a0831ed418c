#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// The root sends the whole buffer to each of its ceil(log2 n) children; chunks pipeline down the levels.
Cost BroadcastTree::cost(size_t bytes, int n) {
  if (n <= 1) return {};
  const int k = algo::ceil_log2(n);
  return {static_cast<double>(k), k * static_cast<double>(bytes)};
}

void BroadcastTree::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size();
  if (n == 1 || a.count == 0) return;
  const size_t es = dtype_size(a.dtype);
  algo::tree_bcast(ctx, algo::binomial_links(ctx.rank(), a.root, n), a.recv, a.count, es,
                   algo::chunk_elems(ctx, a.count * es, es), 0);
}

}  // namespace trident
