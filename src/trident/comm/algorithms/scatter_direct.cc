#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

void ScatterDirect::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  if (n == 1 || a.count == 0) {
    if (r == a.root) algo::copy_bytes(a.recv, algo::at(a.send, r * a.count, es), bytes);
    return;
  }
  if (r != a.root) {
    ctx.recv(a.root, 0, a.recv, bytes);
    return;
  }
  algo::Pending all;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    all.add(ctx.isend(to, 0, algo::at(a.send, to * a.count, es), bytes));
  }
  algo::copy_bytes(a.recv, algo::at(a.send, r * a.count, es), bytes);
  all.wait(ctx);
}

}  // namespace trident
