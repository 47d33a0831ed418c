// HostLayout, predict_seconds (algorithm.h) and SubContext (hierarchical.h).
#include <algorithm>
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

double predict_seconds(const AlgorithmInfo& info, size_t bytes, const HostLayout& layout, const LinkCost& intra,
                       const LinkCost& inter) {
  if (info.topo_cost) return info.topo_cost(bytes, layout).time(intra, inter);
  Cost c = info.cost(bytes, layout.ranks());
  if (layout.hosts() > 1) {
    // A flat algorithm's cost is one rank's traffic; a host's link carries what all of its ranks send to
    // other hosts. A ring (ranks of a host adjacent) leaves each host by one edge: one rank's bytes. The
    // direct all-to-all patterns send every rank's blocks to every remote rank: L (n - L) / n of the
    // buffer per host against one rank's (n - 1) / n (2 hosts x 2 ranks: 1.33x the ring's, as measured:
    // all_gather 16 MiB direct 136-142 ms, ring 107-113 ms on 1 Gbit/s links).
    const bool all_to_all_pattern =
        info.algo == Algo::kDirect && (info.op == OpKind::kAllReduce || info.op == OpKind::kAllGather ||
                                       info.op == OpKind::kAllGatherV || info.op == OpKind::kReduceScatter ||
                                       info.op == OpKind::kAllToAll);
    const int n = layout.ranks(), L = layout.max_local();
    if (all_to_all_pattern && n > 1) c.beta_bytes *= static_cast<double>(L) * (n - L) / (n - 1);
    return c.time(inter);
  }
  return c.time(intra);
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
