#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

void AllToAllDirect::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  algo::copy_bytes(algo::at(a.recv, r * a.count, es), algo::at(a.send, r * a.count, es), bytes);
  if (n == 1 || a.count == 0) return;
  algo::Pending all;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = algo::mod(r - k, n);
    all.add(ctx.isend(to, 0, algo::at(a.send, to * a.count, es), bytes));
    all.add(ctx.irecv(from, 0, algo::at(a.recv, from * a.count, es), bytes));
  }
  all.wait(ctx);
}

}  // namespace trident
