#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

void ReduceDirect::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype);
  if (r == a.root) algo::copy_bytes(a.recv, a.send, a.count * es);
  if (n == 1 || a.count == 0) return;
  void* acc = r == a.root ? a.recv : const_cast<void*>(a.send);  // non-roots only send (read)
  algo::tree_reduce(ctx, algo::star_links(r, a.root, n), acc, a.count, a.dtype, a.redop,
                    algo::chunk_elems(ctx, a.count * es, es), 0);
}

}  // namespace trident
