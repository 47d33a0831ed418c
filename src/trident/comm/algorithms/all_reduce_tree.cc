#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

void AllReduceTree::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1 || a.count == 0) return;
  const size_t es = dtype_size(a.dtype);
  const size_t chunk = algo::chunk_elems(ctx, a.count * es, es);
  const algo::TreeLinks t = algo::binomial_links(r, 0, n);
  algo::tree_reduce(ctx, t, a.recv, a.count, a.dtype, a.redop, chunk, 0);
  algo::tree_bcast(ctx, t, a.recv, a.count, es, chunk, 0x80000000u);
}

}  // namespace trident
