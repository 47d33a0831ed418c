#include <cstring>

#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// Steps 0..n-2 reduce-scatter (send block r-s, reduce block r-s-1 into place), steps n-1..2n-3
// all-gather (send the block completed last step, overwrite block r-t). Rank r ends the reduce-scatter
// owning block r+1. Every block is split into the same number of chunks; chunk c of every step rides its
// own pipeline lane (see ring_pipeline).
// Out of place (send != recv, not overlapping; recv need not hold anything): step 0 sends block r from
// send, and each reduce-scatter step combines send's block with the incoming one into recv (every block
// but r is combined exactly once on this rank, and block r is first written by the all-gather), so the
// input is never copied into recv first.
void AllReduceRing::run(AlgoContext& ctx, const CollArgs& args) {
  const int n = ctx.size(), r = ctx.rank();
  if (args.count == 0) return;
  const size_t es = dtype_size(args.dtype);
  CollArgs a = args;
  if (a.send == nullptr) a.send = a.recv;
  if (a.send != a.recv) {
    const auto s0 = reinterpret_cast<uintptr_t>(a.send), r0 = reinterpret_cast<uintptr_t>(a.recv);
    const size_t bytes = a.count * es;
    if (n == 1 || (s0 < r0 + bytes && r0 < s0 + bytes)) {
      std::memmove(a.recv, a.send, bytes);
      a.send = a.recv;
    }
  }
  if (n == 1) return;
  const bool out_of_place = a.send != a.recv;
  const size_t biggest = block_count(a.count, n, 0);
  const size_t chunk = algo::chunk_elems(ctx, biggest * es, es);
  const size_t chunks = algo::ceil_div(biggest, chunk);
  auto plan = [&](int s, size_t c, algo::RingUnit& u) {
    int sb, rb;
    if (s < n - 1) {
      sb = algo::mod(r - s, n);
      rb = algo::mod(r - s - 1, n);
      u.reduce = true;
    } else {
      const int t = s - (n - 1);
      sb = algo::mod(r + 1 - t, n);
      rb = algo::mod(r - t, n);
    }
    const void* from = out_of_place && s == 0 ? a.send : a.recv;
    u.send = algo::at(from, block_offset(a.count, n, sb) + c * chunk, es);
    u.send_elems = algo::chunk_len(block_count(a.count, n, sb), c, chunk);
    u.recv = algo::at(a.recv, block_offset(a.count, n, rb) + c * chunk, es);
    u.recv_elems = algo::chunk_len(block_count(a.count, n, rb), c, chunk);
    if (out_of_place && u.reduce) u.own = algo::at(a.send, block_offset(a.count, n, rb) + c * chunk, es);
  };
  algo::ring_pipeline(ctx, 2 * (n - 1), chunks, es, a.dtype, a.redop, plan);
}

}  // namespace trident
