#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

void BroadcastTree::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size();
  if (n == 1 || a.count == 0) return;
  const size_t es = dtype_size(a.dtype);
  algo::tree_bcast(ctx, algo::binomial_links(ctx.rank(), a.root, n), a.recv, a.count, es,
                   algo::chunk_elems(ctx, a.count * es, es), 0);
}

}  // namespace trident
