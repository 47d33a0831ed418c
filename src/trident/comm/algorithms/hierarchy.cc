// HostLayout, predict_seconds (algorithm.h) and SubContext (hierarchical.h).
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trident/comm/algorithms/hierarchical.h"
#include "trident/core/error.h"

namespace trident {

HostLayout HostLayout::from_hosts(std::vector<int> host_of) {
  HostLayout l;
  std::map<int, int> dense;  // given host id -> host index by first appearance
  for (int h : host_of) {
    auto it = dense.find(h);
    if (it == dense.end()) {
      it = dense.emplace(h, static_cast<int>(l.members.size())).first;
      l.members.emplace_back();
    }
    l.members[it->second].push_back(static_cast<int>(l.host_of.size()));
    l.host_of.push_back(it->second);
  }
  return l;
}

HostLayout HostLayout::of(const AlgoContext& ctx) {
  std::vector<int> h(ctx.size());
  for (int r = 0; r < ctx.size(); ++r) h[r] = ctx.host_of(r);
  return from_hosts(std::move(h));
}

int HostLayout::local_index(int r) const {
  const auto& m = members[host_of[r]];
  return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
}

int HostLayout::min_local() const {
  int v = members.empty() ? 0 : static_cast<int>(members[0].size());
  for (const auto& m : members) v = std::min(v, static_cast<int>(m.size()));
  return v;
}

int HostLayout::max_local() const {
  int v = 0;
  for (const auto& m : members) v = std::max(v, static_cast<int>(m.size()));
  return v;
}

std::string HostLayout::describe() const {
  if (uniform()) return fmt::format("{} host(s) x {} rank(s)", hosts(), max_local());
  std::vector<size_t> sizes;
  for (const auto& m : members) sizes.push_back(m.size());
  return fmt::format("{} hosts ({} ranks)", hosts(), fmt::join(sizes, "+"));
}

namespace {

// How many times one rank's bytes the busiest host link carries under a flat algorithm, on `l` (hosts
// holding adjacent ranks). A ring leaves each host by one edge: one rank's bytes (1). The patterns that
// exchange with every remote rank, or pair ranks at distances up to n/2, have all L ranks of a host cross
// at once: direct all-gather / reduce-scatter / all-reduce / all-to-all send L (n - L) / n of the buffer
// across per host against one rank's (n - 1) / n; recursive doubling (all-gather) and halving
// (reduce-scatter, Rabenseifner's all-reduce) cross in their steps at distance >= L, whose bytes add up to
// the same; recursive-doubling all-reduce sends the whole buffer in each of its log2 n steps, log2 H of
// them across, L at a time. (2 hosts x 2 ranks, 16 MiB on 1 Gbit/s: all_gather ring 107 ms, direct
// 136-160 ms, rd 148-152 ms; the model's 4/3.)
double host_link_share(const AlgorithmInfo& info, const HostLayout& l) {
  const int n = l.ranks(), L = l.max_local(), H = l.hosts();
  if (n <= 1 || L <= 1 || H <= 1) return 1.0;
  const bool many = info.op == OpKind::kAllReduce || info.op == OpKind::kAllGather ||
                    info.op == OpKind::kAllGatherV || info.op == OpKind::kReduceScatter ||
                    info.op == OpKind::kAllToAll;
  if (!many) return 1.0;
  const double pairwise = static_cast<double>(L) * (n - L) / (n - 1);
  switch (info.algo) {
    case Algo::kDirect:
    case Algo::kRecursiveHalving:
      return pairwise;
    case Algo::kRecursiveDoubling:
      if (info.op != OpKind::kAllReduce) return pairwise;
      return L * std::log2(static_cast<double>(H)) / std::log2(static_cast<double>(n));
    default:
      return 1.0;
  }
}

}  // namespace

double predict_seconds(const AlgorithmInfo& info, size_t bytes, const HostLayout& layout, const LinkCost& intra,
                       const LinkCost& inter) {
  if (info.topo_cost) return info.topo_cost(bytes, layout).time(intra, inter);
  Cost c = info.cost(bytes, layout.ranks());
  if (layout.hosts() <= 1) return c.time(intra);
  c.beta_bytes *= host_link_share(info, layout);
  return c.time(inter);
}

namespace algo {

SubContext::SubContext(AlgoContext& parent, std::vector<int> members, uint32_t tag_base, int slot_base)
    : parent_(parent), members_(std::move(members)), tag_base_(tag_base), slot_base_(slot_base) {
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == parent.rank()) rank_ = static_cast<int>(i);
  TRIDENT_CHECK(rank_ >= 0, InvalidArgument, "SubContext: rank {} is not among its members", parent.rank());
}

uint32_t SubContext::tag(uint32_t step) const {
  // Fold tags (0xFFFF000x) pass through unshifted: sub-contexts with a nonzero base never run a fold.
  if (step >= 0xFFFF0000u) return step;
  TRIDENT_CHECK(step < (1u << 28), InvalidArgument,
                "hierarchical: step tag {} overflows its phase's tag range; raise TRIDENT_CHUNK_BYTES", step);
  return tag_base_ + step;
}

Request SubContext::isend(int peer, uint32_t step, const void* data, size_t nbytes) {
  return parent_.isend(members_[peer], tag(step), data, nbytes);
}
Request SubContext::irecv(int peer, uint32_t step, void* data, size_t nbytes) {
  return parent_.irecv(members_[peer], tag(step), data, nbytes);
}
Request SubContext::irecv_reduce(int peer, uint32_t step, void* dst, size_t count, DType dtype, ReduceOp op,
                                 const void* own) {
  return parent_.irecv_reduce(members_[peer], tag(step), dst, count, dtype, op, own);
}

}  // namespace algo
}  // namespace trident
