#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// Round k: a zero-byte message to (r + 2^k) % n and one from (r - 2^k) % n. After ceil(log2 n) rounds
// every rank has transitively heard from every rank.
void BarrierDissemination::run(AlgoContext& ctx, const CollArgs&) {
  const int n = ctx.size(), r = ctx.rank();
  char token = 0;
  uint32_t round = 0;
  for (int d = 1; d < n; d <<= 1, ++round)
    ctx.wait({ctx.isend((r + d) % n, round, &token, 0), ctx.irecv(algo::mod(r - d, n), round, &token, 0)});
}

}  // namespace trident
