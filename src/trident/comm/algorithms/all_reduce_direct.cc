#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// Phase 1: send block p to rank p, combine every peer's copy of block r into place in a fixed order
// (algo::reduce_in_order: the same bits whatever order they arrive in). Phase 2: send the reduced block r
// to every peer, receive every other block.
void AllReduceDirect::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1 || a.count == 0) return;
  const size_t es = dtype_size(a.dtype);
  auto blk = [&](int b) { return algo::at(a.recv, block_offset(a.count, n, b), es); };
  auto len = [&](int b) { return block_count(a.count, n, b); };
  algo::Pending phase;
  std::vector<int> peers;
  for (int k = 1; k < n; ++k) {
    const int p = (r + k) % n;
    if (len(p) != 0) phase.add(ctx.isend(p, 0, blk(p), len(p) * es));
    peers.push_back(p);
  }
  if (len(r) != 0) algo::reduce_in_order(ctx, peers, 0, blk(r), len(r), a.dtype, a.redop);
  phase.wait(ctx);
  for (int k = 1; k < n; ++k) {
    const int p = (r + k) % n;
    if (len(r) != 0) phase.add(ctx.isend(p, 1, blk(r), len(r) * es));
    if (len(p) != 0) phase.add(ctx.irecv(p, 1, blk(p), len(p) * es));
  }
  phase.wait(ctx);
}

}  // namespace trident
