#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// log2(p) exchanges of the whole buffer (each rank sends `bytes` per exchange), each followed by a local
// reduction pass that does not overlap the transfer (charged at the local gamma, not as link bytes: the
// link carries each byte once); the fold adds two steps of `bytes` (its reduction is fused in the receive).
Cost AllReduceRecursiveDoubling::cost(size_t bytes, int n) {
  if (n <= 1) return {};
  const int k = algo::ceil_log2(algo::floor_pow2(n));
  const double fold = algo::is_pow2(n) ? 0.0 : 2.0;
  const double b = static_cast<double>(bytes);
  return {k + fold, (k + fold) * b, k * b};
}

// Survivors of the fold exchange whole buffers with partner newrank ^ 2^k, receiving into scratch and
// reducing locally (the buffer being sent cannot be reduced into while in flight).
void AllReduceRecursiveDoubling::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size();
  if (n == 1 || a.count == 0) return;
  const size_t bytes = a.count * dtype_size(a.dtype);
  const algo::Fold f = algo::fold_in(ctx, a.recv, a.count, a.dtype, a.redop);
  if (f.newrank >= 0) {
    void* tmp = ctx.scratch(bytes);
    uint32_t tag = 1;
    for (int mask = 1; mask < f.p; mask <<= 1, ++tag) {
      const int partner = f.real(f.newrank ^ mask);
      ctx.wait({ctx.isend(partner, tag, a.recv, bytes), ctx.irecv(partner, tag, tmp, bytes)});
      reduce_into(a.recv, tmp, a.count, a.dtype, a.redop);
    }
  }
  algo::fold_out(ctx, f, a.recv, bytes);
}

}  // namespace trident
