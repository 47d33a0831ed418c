#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

Cost AllReduceRing::cost(size_t bytes, int n) {
  if (n <= 1) return {};
  return {2.0 * (n - 1), 2.0 * (n - 1) / n * static_cast<double>(bytes)};
}

// Steps 0..n-2 reduce-scatter (send block r-s, reduce block r-s-1 into place), steps n-1..2n-3
// all-gather (send the block completed last step, overwrite block r-t). Rank r ends the reduce-scatter
// owning block r+1. Every block is split into the same number of chunks; chunk c of every step rides its
// own pipeline lane (see ring_pipeline).
void AllReduceRing::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1 || a.count == 0) return;
  const size_t es = dtype_size(a.dtype);
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
    u.send = algo::at(a.recv, block_offset(a.count, n, sb) + c * chunk, es);
    u.send_elems = algo::chunk_len(block_count(a.count, n, sb), c, chunk);
    u.recv = algo::at(a.recv, block_offset(a.count, n, rb) + c * chunk, es);
    u.recv_elems = algo::chunk_len(block_count(a.count, n, rb), c, chunk);
  };
  algo::ring_pipeline(ctx, 2 * (n - 1), chunks, es, a.dtype, a.redop, plan);
}

}  // namespace trident
