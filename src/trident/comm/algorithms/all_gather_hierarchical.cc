#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"
#include "trident/comm/algorithms/hierarchical.h"

namespace trident {

void AllGatherHierarchical::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const HostLayout lay = host_layout(ctx);
  if (n == 1 || a.count == 0 || !cost::hierarchical_layout(lay)) {
    AllGatherRing::run(ctx, a);
    return;
  }
  const int H = lay.hosts(), L = lay.min_local(), li = lay.local_index(r);
  const size_t es = dtype_size(a.dtype), cnt = a.count;
  std::vector<int> peers;
  for (const auto& m : lay.members) peers.push_back(m[li]);
  // Across: group[h] = the block of the rank with this local index on host h.
  void* group = ctx.scratch(H * cnt * es, 0);
  {
    algo::SubContext inter(ctx, peers, algo::kInterTags, 4);
    CollArgs g = a;
    g.recv = group;
    AllGatherRing::run(inter, g);
  }
  // Inside: all[j][h] = the block of rank members[h][j].
  void* all = ctx.scratch(static_cast<size_t>(n) * cnt * es, 1);
  {
    algo::SubContext intra(ctx, lay.members[lay.host_of[r]], algo::kIntraSecondTags, 8);
    CollArgs g = a;
    g.send = group;
    g.recv = all;
    g.count = H * cnt;
    AllGatherRing::run(intra, g);
  }
  for (int j = 0; j < L; ++j)
    for (int h = 0; h < H; ++h)
      algo::copy_bytes(algo::at(a.recv, static_cast<size_t>(lay.members[h][j]) * cnt, es),
                       algo::at(all, (static_cast<size_t>(j) * H + h) * cnt, es), cnt * es);
}

}  // namespace trident
