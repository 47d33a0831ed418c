#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// As all_gather ring with blocks of counts[b] elements at their prefix offsets; blocks are chunked with
// one chunk size, so a small block simply has fewer (possibly zero) chunks.
void AllGatherVRing::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  TRIDENT_CHECK(a.counts != nullptr && a.counts->size() == static_cast<size_t>(n), InvalidArgument,
                "all_gatherv needs one count per rank ({}), got {}", n, a.counts ? a.counts->size() : 0);
  const auto& counts = *a.counts;
  const size_t es = dtype_size(a.dtype);
  std::vector<size_t> off(n + 1, 0);
  for (int b = 0; b < n; ++b) off[b + 1] = off[b] + counts[b];
  algo::copy_bytes(algo::at(a.recv, off[r], es), a.send, counts[r] * es);
  const size_t biggest = *std::max_element(counts.begin(), counts.end());
  if (n == 1 || biggest == 0) return;
  const size_t chunk = algo::chunk_elems(ctx, biggest * es, es);
  auto plan = [&](int s, size_t c, algo::RingUnit& u) {
    const int sb = algo::mod(r - s, n), rb = algo::mod(r - s - 1, n);
    u.send = algo::at(a.recv, off[sb] + c * chunk, es);
    u.send_elems = algo::chunk_len(counts[sb], c, chunk);
    u.recv = algo::at(a.recv, off[rb] + c * chunk, es);
    u.recv_elems = algo::chunk_len(counts[rb], c, chunk);
  };
  algo::ring_pipeline(ctx, n - 1, algo::ceil_div(biggest, chunk), es, a.dtype, ReduceOp::kSum, plan);
}

}  // namespace trident
