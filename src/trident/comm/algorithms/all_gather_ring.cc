#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// Step s: forward block r-s (own block first), receive block r-s-1; chunks pipeline as in all_reduce ring.
void AllGatherRing::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype);
  algo::copy_bytes(algo::at(a.recv, r * a.count, es), a.send, a.count * es);
  if (n == 1 || a.count == 0) return;
  const size_t chunk = algo::chunk_elems(ctx, a.count * es, es);
  auto plan = [&](int s, size_t c, algo::RingUnit& u) {
    const int sb = algo::mod(r - s, n), rb = algo::mod(r - s - 1, n);
    u.send = algo::at(a.recv, sb * a.count + c * chunk, es);
    u.send_elems = algo::chunk_len(a.count, c, chunk);
    u.recv = algo::at(a.recv, rb * a.count + c * chunk, es);
    u.recv_elems = u.send_elems;
  };
  algo::ring_pipeline(ctx, n - 1, algo::ceil_div(a.count, chunk), es, a.dtype, ReduceOp::kSum, plan);
}

}  // namespace trident
