// Hierarchical algorithms (ranks on several hosts): cheap links inside a host, expensive links across hosts.
// Each runs a pattern inside every host (shared memory), across hosts between ranks of the same local
// index (TCP; every host's ranks send in parallel, each a 1/L share), and inside again. The host of each
// rank comes from AlgoContext::host_of (the engine derives it from every rank's host identity: the
// hostname, or TRIDENT_HOST_ID for emulated hosts).
//
//   all_reduce (hier)     ring reduce-scatter inside each host (rank i of a host ends owning block i+1 of
//                         L), all-reduce of that block across hosts (ring, or recursive doubling when the
//                         block is small), ring all-gather inside. Hosts with more ranks than the smallest
//                         host: the extra ranks hand their buffer to a core rank of their host first and
//                         get the result back at the end (correct for any layout).
//   all_gather (hier)     ring all-gather across hosts between same-local-index ranks, then ring
//                         all-gather of those H blocks inside each host, then a local copy into rank order.
//   reduce_scatter (hier) local pack (blocks of same-local-index ranks together), ring reduce-scatter of
//                         the H-block groups inside each host, ring reduce-scatter across hosts.
// all_gather and reduce_scatter need the same number of ranks on every host; on other layouts, on one
// host, or with one rank per host they run the flat ring (never wrong, and the cost model then ranks
// them equal to the ring, which wins the tie).
//
// Ownership: none (static functions; SubContext borrows its parent). Blocking: run() returns when the
// collective is complete on this rank. Thread-safety: as the AlgoContext. Timeouts: the context's.
#pragma once

#include <vector>

#include "trident/comm/algorithms/algorithm.h"

namespace trident {

struct AllReduceHierarchical {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

struct AllGatherHierarchical {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

struct ReduceScatterHierarchical {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

namespace algo {

// A subset of a context's ranks seen as a context of its own: rank i here is members[i] of the parent.
// Step tags are offset by `tag_base` and scratch slots by `slot_base`, so phases of one collective that
// talk between the same pairs, or hold scratch at the same time, do not collide.
class SubContext final : public AlgoContext {
 public:
  SubContext(AlgoContext& parent, std::vector<int> members, uint32_t tag_base, int slot_base);
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  Request isend(int peer, uint32_t step, const void* data, size_t nbytes) override;
  Request irecv(int peer, uint32_t step, void* data, size_t nbytes) override;
  Request irecv_reduce(int peer, uint32_t step, void* dst, size_t count, DType dtype, ReduceOp op,
                       const void* own = nullptr) override;
  void wait(std::span<const Request> reqs) override { parent_.wait(reqs); }
  using AlgoContext::wait;
  void* scratch(size_t nbytes, int slot) override { return parent_.scratch(nbytes, slot_base_ + slot); }
  size_t chunk_bytes() const override { return parent_.chunk_bytes(); }
  int host_of(int r) const override { return parent_.host_of(members_[r]); }

 private:
  uint32_t tag(uint32_t step) const;
  AlgoContext& parent_;
  std::vector<int> members_;
  uint32_t tag_base_;
  int slot_base_;
  int rank_ = -1;
};

// Tag bases of the phases (steps of a phase stay below 2^28; the fold tags of a sub-algorithm are
// 0xFFFF000x and are used only across hosts, where the pairs differ from every intra-host phase's).
inline constexpr uint32_t kIntraFirstTags = 0;
inline constexpr uint32_t kInterTags = 0;
inline constexpr uint32_t kIntraSecondTags = 1u << 28;
inline constexpr uint32_t kExtraTags = 3u << 28;

}  // namespace algo
}  // namespace trident
