#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"
#include "trident/comm/algorithms/hierarchical.h"

namespace trident {

void ReduceScatterHierarchical::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const HostLayout lay = host_layout(ctx);
  if (n == 1 || a.count == 0 || !cost::hierarchical_layout(lay)) {
    ReduceScatterRing::run(ctx, a);
    return;
  }
  const int H = lay.hosts(), L = lay.min_local(), li = lay.local_index(r);
  const size_t es = dtype_size(a.dtype), cnt = a.count;
  // packed[j][h] = this rank's contribution to the block of rank members[h][j].
  void* packed = ctx.scratch(static_cast<size_t>(n) * cnt * es, 0);
  for (int j = 0; j < L; ++j)
    for (int h = 0; h < H; ++h)
      algo::copy_bytes(algo::at(packed, (static_cast<size_t>(j) * H + h) * cnt, es),
                       algo::at(a.send, static_cast<size_t>(lay.members[h][j]) * cnt, es), cnt * es);
  // Inside: partial[h] = this host's sum for the block of rank members[h][li].
  void* partial = ctx.scratch(H * cnt * es, 1);
  {
    algo::SubContext intra(ctx, lay.members[lay.host_of[r]], algo::kIntraFirstTags, 4);
    CollArgs g = a;
    g.send = packed;
    g.recv = partial;
    g.count = H * cnt;
    ReduceScatterRing::run(intra, g);
  }
  std::vector<int> peers;
  for (const auto& m : lay.members) peers.push_back(m[li]);
  algo::SubContext inter(ctx, peers, algo::kInterTags, 8);
  CollArgs g = a;
  g.send = partial;
  ReduceScatterRing::run(inter, g);
}

}  // namespace trident
