#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

bool ReduceScatterRecursiveHalving::applicable(const CollArgs&, int world) { return algo::is_pow2(world); }

// Step mask = n/2 .. 1: keep the half of the current block range selected by bit `mask` of r, send the
// other half to r ^ mask and reduce its copy of the kept half onto ours. The first step reads send (it is
// read-only) and keeps its half in scratch; the last step lands in recv.
void ReduceScatterRecursiveHalving::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  TRIDENT_CHECK(algo::is_pow2(n), InvalidArgument,
                "reduce_scatter rh needs a power-of-two world, got {}; use ring or direct", n);
  const size_t es = dtype_size(a.dtype), cnt = a.count;
  if (n == 1) {
    algo::copy_bytes(a.recv, a.send, cnt * es);
    return;
  }
  if (cnt == 0) return;
  const int base = (r & (n / 2)) ? n / 2 : 0;  // first kept range; every later one lies inside it
  char* work = static_cast<char*>(ctx.scratch(static_cast<size_t>(n / 2) * cnt * es));
  auto work_block = [&](int b) { return algo::at(work, static_cast<size_t>(b - base) * cnt, es); };
  int lo = 0;
  uint32_t tag = 0;
  for (int mask = n / 2; mask >= 1; mask >>= 1, ++tag) {
    const bool first = mask == n / 2;
    const int mid = lo + mask;
    const int slo = (r & mask) ? lo : mid;  // range sent
    const int klo = (r & mask) ? mid : lo;  // range kept
    const void* sent = first ? algo::at(a.send, slo * cnt, es) : work_block(slo);
    void* target = mask == 1 ? a.recv : work_block(klo);
    algo::copy_bytes(target, first ? algo::at(a.send, klo * cnt, es) : work_block(klo), mask * cnt * es);
    ctx.wait({ctx.isend(r ^ mask, tag, sent, mask * cnt * es),
              ctx.irecv_reduce(r ^ mask, tag, target, mask * cnt, a.dtype, a.redop)});
    lo = klo;
  }
}

}  // namespace trident
