#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// recv starts as this rank's block r; every peer's block r is combined onto it in a fixed order (ranks
// r-1, r-2, ...), whatever order they arrive in (algo::reduce_in_order).
void ReduceScatterDirect::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  algo::copy_bytes(a.recv, algo::at(a.send, r * a.count, es), bytes);
  if (n == 1 || a.count == 0) return;
  algo::Pending sends;
  std::vector<int> from;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    sends.add(ctx.isend(to, 0, algo::at(a.send, to * a.count, es), bytes));
    from.push_back(algo::mod(r - k, n));
  }
  algo::reduce_in_order(ctx, from, 0, a.recv, a.count, a.dtype, a.redop);
  sends.wait(ctx);
}

}  // namespace trident
