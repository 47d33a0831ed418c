#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// Step s sends the partial of block r-s-1 and receives the partial of block r-s-2, ending with block r.
// send is read-only, so partials live in two scratch slots used alternately by step parity: the slot
// received into at step s is sent from at step s+1 and refilled at step s+2 (ring_pipeline orders this
// per chunk). Before each receive this rank's own contribution is copied into the slot, and the incoming
// partial is reduced onto it; the last step lands in recv.
void ReduceScatterRing::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype), cnt = a.count;
  if (n == 1) {
    algo::copy_bytes(a.recv, a.send, cnt * es);
    return;
  }
  if (cnt == 0) return;
  char* slots = static_cast<char*>(ctx.scratch(2 * cnt * es));
  const size_t chunk = algo::chunk_elems(ctx, cnt * es, es);
  auto plan = [&](int s, size_t c, algo::RingUnit& u) {
    const int sb = algo::mod(r - s - 1, n), rb = algo::mod(r - s - 2, n);
    const size_t off = c * chunk, len = algo::chunk_len(cnt, c, chunk);
    u.send = s == 0 ? algo::at(a.send, sb * cnt + off, es) : algo::at(slots, ((s - 1) % 2) * cnt + off, es);
    u.recv = s == n - 2 ? algo::at(a.recv, off, es) : algo::at(slots, (s % 2) * cnt + off, es);
    algo::copy_bytes(u.recv, algo::at(a.send, rb * cnt + off, es), len * es);
    u.send_elems = u.recv_elems = len;
    u.reduce = true;
  };
  algo::ring_pipeline(ctx, n - 1, algo::ceil_div(cnt, chunk), es, a.dtype, a.redop, plan);
}

}  // namespace trident
