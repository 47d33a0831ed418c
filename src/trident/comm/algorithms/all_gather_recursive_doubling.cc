#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

bool AllGatherRecursiveDoubling::applicable(const CollArgs&, int world) { return algo::is_pow2(world); }

// Step k: exchange the 2^k blocks gathered so far with partner r ^ 2^k (contiguous ranges of recv).
void AllGatherRecursiveDoubling::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  TRIDENT_CHECK(algo::is_pow2(n), InvalidArgument,
                "all_gather rd needs a power-of-two world, got {}; use ring or direct", n);
  const size_t es = dtype_size(a.dtype);
  algo::copy_bytes(algo::at(a.recv, r * a.count, es), a.send, a.count * es);
  if (n == 1 || a.count == 0) return;
  uint32_t tag = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++tag) {
    const int partner = r ^ mask;
    const size_t mine = static_cast<size_t>(r & ~(mask - 1)) * a.count;
    const size_t theirs = static_cast<size_t>(partner & ~(mask - 1)) * a.count;
    const size_t bytes = static_cast<size_t>(mask) * a.count * es;
    ctx.wait({ctx.isend(partner, tag, algo::at(a.recv, mine, es), bytes),
              ctx.irecv(partner, tag, algo::at(a.recv, theirs, es), bytes)});
  }
}

}  // namespace trident
