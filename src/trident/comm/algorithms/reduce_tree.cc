#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// The root accumulates in recv, inner ranks in scratch (send is read-only), leaves send straight from send.
void ReduceTree::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype);
  if (n == 1) {
    if (r == a.root) algo::copy_bytes(a.recv, a.send, a.count * es);
    return;
  }
  if (a.count == 0) return;
  const algo::TreeLinks t = algo::binomial_links(r, a.root, n);
  void* acc;
  if (r == a.root) {
    acc = a.recv;
    algo::copy_bytes(acc, a.send, a.count * es);
  } else if (!t.children.empty()) {
    acc = ctx.scratch(a.count * es);
    algo::copy_bytes(acc, a.send, a.count * es);
  } else {
    acc = const_cast<void*>(a.send);  // a leaf only reads it (tree_reduce writes acc only with children)
  }
  algo::tree_reduce(ctx, t, acc, a.count, a.dtype, a.redop, algo::chunk_elems(ctx, a.count * es, es), 0);
}

}  // namespace trident
