#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// Step k: block (r+k)%n goes to rank (r+k)%n while block (r-k)%n arrives from rank (r-k)%n. Needs send
// and recv not to overlap (the process group copies for the in-place form).
void AllToAllPairwise::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  algo::copy_bytes(algo::at(a.recv, r * a.count, es), algo::at(a.send, r * a.count, es), bytes);
  if (n == 1 || a.count == 0) return;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = algo::mod(r - k, n);
    ctx.wait({ctx.isend(to, k, algo::at(a.send, to * a.count, es), bytes),
              ctx.irecv(from, k, algo::at(a.recv, from * a.count, es), bytes)});
  }
}

}  // namespace trident
