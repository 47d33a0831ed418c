#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// In place, no scratch: the p survivors own block partition [0, p) of the buffer. Reduce-scatter by
// recursive halving (mask p/2 .. 1): keep the half of the current block range selected by bit `mask` of
// newrank, send the other half, reduce the partner's copy of the kept half into place. All-gather by
// recursive doubling (mask 1 .. p/2) in reverse: exchange ranges with the partner.
void AllReduceRabenseifner::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size();
  if (n == 1 || a.count == 0) return;
  const size_t es = dtype_size(a.dtype);
  const algo::Fold f = algo::fold_in(ctx, a.recv, a.count, a.dtype, a.redop);
  if (f.newrank >= 0) {
    const int p = f.p, me = f.newrank;
    auto off = [&](int block) { return block_offset(a.count, p, block); };
    int lo = 0, hi = p;
    uint32_t tag = 1;
    for (int mask = p / 2; mask >= 1; mask >>= 1, ++tag) {
      const int partner = f.real(me ^ mask);
      const int mid = lo + mask;
      int slo = mid, shi = hi, klo = lo, khi = mid;
      if (me & mask) slo = lo, shi = mid, klo = mid, khi = hi;
      algo::Pending step;
      if (off(shi) > off(slo))
        step.add(ctx.isend(partner, tag, algo::at(a.recv, off(slo), es), (off(shi) - off(slo)) * es));
      if (off(khi) > off(klo))
        step.add(ctx.irecv_reduce(partner, tag, algo::at(a.recv, off(klo), es), off(khi) - off(klo), a.dtype, a.redop));
      step.wait(ctx);
      lo = klo, hi = khi;
    }
    for (int mask = 1; mask < p; mask <<= 1, ++tag) {
      const int partner = f.real(me ^ mask);
      const int plo = (me & mask) ? lo - mask : hi;
      const int phi = plo + mask;
      algo::Pending step;
      if (off(hi) > off(lo)) step.add(ctx.isend(partner, tag, algo::at(a.recv, off(lo), es), (off(hi) - off(lo)) * es));
      if (off(phi) > off(plo))
        step.add(ctx.irecv(partner, tag, algo::at(a.recv, off(plo), es), (off(phi) - off(plo)) * es));
      step.wait(ctx);
      lo = std::min(lo, plo), hi = std::max(hi, phi);
    }
  }
  algo::fold_out(ctx, f, a.recv, a.count * es);
}

}  // namespace trident
