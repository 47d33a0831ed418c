#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

void AllGatherVDirect::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  TRIDENT_CHECK(a.counts != nullptr && a.counts->size() == static_cast<size_t>(n), InvalidArgument,
                "all_gatherv needs one count per rank ({}), got {}", n, a.counts ? a.counts->size() : 0);
  const auto& counts = *a.counts;
  const size_t es = dtype_size(a.dtype);
  std::vector<size_t> off(n + 1, 0);
  for (int b = 0; b < n; ++b) off[b + 1] = off[b] + counts[b];
  algo::copy_bytes(algo::at(a.recv, off[r], es), a.send, counts[r] * es);
  algo::Pending all;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = algo::mod(r - k, n);
    if (counts[r] != 0) all.add(ctx.isend(to, 0, a.send, counts[r] * es));
    if (counts[from] != 0) all.add(ctx.irecv(from, 0, algo::at(a.recv, off[from], es), counts[from] * es));
  }
  all.wait(ctx);
}

}  // namespace trident
