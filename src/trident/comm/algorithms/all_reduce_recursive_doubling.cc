#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

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
