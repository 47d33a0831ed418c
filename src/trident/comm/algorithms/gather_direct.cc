#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

void GatherDirect::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  if (r == a.root) algo::copy_bytes(algo::at(a.recv, r * a.count, es), a.send, bytes);
  if (n == 1 || a.count == 0) return;
  if (r != a.root) {
    ctx.send(a.root, 0, a.send, bytes);
    return;
  }
  algo::Pending all;
  for (int k = 1; k < n; ++k) {
    const int from = (r + k) % n;
    all.add(ctx.irecv(from, 0, algo::at(a.recv, from * a.count, es), bytes));
  }
  all.wait(ctx);
}

}  // namespace trident
