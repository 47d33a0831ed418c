#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"
#include "trident/comm/algorithms/hierarchical.h"

namespace trident {

namespace {
// The hierarchy applies when several hosts hold the same number (>= 2) of ranks each.
bool hierarchical_layout(const HostLayout& l) { return l.hosts() > 1 && l.uniform() && l.min_local() > 1; }
}  // namespace

Cost AllGatherHierarchical::cost(size_t bytes, int n) { return AllGatherRing::cost(bytes, n); }

// bytes = the gathered buffer (count * n * element size). Across: H-1 steps; a host's L ranks each send
// H-1 blocks, so its link carries (H-1)/H of bytes. Inside: L-1 steps of H-block groups, (L-1)/L of
// bytes, plus one local pass to put the blocks in rank order.
TopoCost AllGatherHierarchical::topo_cost(size_t bytes, const HostLayout& l) {
  TopoCost t;
  if (l.ranks() <= 1) return t;
  if (!hierarchical_layout(l)) {
    (l.hosts() > 1 ? t.inter : t.intra) = AllGatherRing::cost(bytes, l.ranks());
    return t;
  }
  const int H = l.hosts(), L = l.min_local();
  const double b = static_cast<double>(bytes);
  t.inter = {static_cast<double>(H - 1), (H - 1.0) / H * b, 0};
  t.intra = {static_cast<double>(L - 1), (L - 1.0) / L * b, b};
  return t;
}

void AllGatherHierarchical::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const HostLayout lay = HostLayout::of(ctx);
  if (n == 1 || a.count == 0 || !hierarchical_layout(lay)) {
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
