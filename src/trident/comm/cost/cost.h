// The alpha-beta cost of every collective algorithm: the one model that the native backend uses to choose
// an algorithm (comm/native) and that `trident plan` / `trident simulate` use to predict step times (plan/).
// One row per (op, algorithm) in cost_table(); algorithms/registry.cc pairs each row with its run().
//
// Pure functions and constant tables: no ownership, no blocking, thread-safe, no timeouts. Depends only on
// comm/types.h (OpKind, Algo, CollArgs), so plan/ can include it without the transports.
//
// time = alpha_terms x alpha + beta_bytes x beta + local_bytes x gamma on one link class; an algorithm
// whose steps cross hosts differently (hierarchical, single-host windows) splits its cost into the part on
// links inside a host and the part across hosts (TopoCost). `bytes` is the size of a call as nccl-tests
// counts it (size_bytes in comm/collective.h): the buffer for broadcast, reduce and all_reduce, the
// whole gathered or scattered buffer for gather, scatter, all_gather(v), reduce_scatter and all_to_all.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "trident/comm/types.h"

namespace trident {

// Latency and bandwidth terms of a link: time(bytes) = alpha + bytes * beta; gamma is the local pass
// (reduce or copy) over bytes that is not overlapped with a transfer.
struct LinkCost {
  double alpha_s = 2e-6;                 // per message
  double beta_s_per_byte = 1.0 / 8e9;    // inverse bandwidth
  double gamma_s_per_byte = 1.0 / 10e9;  // local reduction / copy pass, memory bound
};

// Predicted time of one collective: steps * alpha + bytes_on_critical_path * beta + local_bytes * gamma.
struct Cost {
  double alpha_terms = 0;  // number of sequential message latencies
  double beta_bytes = 0;   // bytes on the critical path (sent by the busiest sender)
  double local_bytes = 0;  // bytes passed over locally outside any transfer (a reduction after a receive)
  double time(const LinkCost& l) const {
    return alpha_terms * l.alpha_s + beta_bytes * l.beta_s_per_byte + local_bytes * l.gamma_s_per_byte;
  }
};

// Hosts of a group: which rank runs where (from AlgoContext::host_of, the process group's peers, or a
// planned cluster's shape).
struct HostLayout {
  std::vector<int> host_of;               // rank -> host index
  std::vector<std::vector<int>> members;  // host -> its ranks, ascending
  static HostLayout from_hosts(std::vector<int> host_of);  // host indices need not be dense
  // `ranks` ranks, `per_host` consecutive ranks on each host (the last host may hold fewer).
  static HostLayout blocks(int ranks, int per_host);
  int hosts() const { return static_cast<int>(members.size()); }
  int ranks() const { return static_cast<int>(host_of.size()); }
  int local_index(int r) const;  // position of r among its host's ranks
  int min_local() const;         // fewest ranks on a host
  int max_local() const;
  bool uniform() const { return min_local() == max_local(); }
  std::string describe() const;  // "2 hosts x 2 ranks", "3 hosts (3+2+1 ranks)"
};

// Cost of a call split by link: the part on links inside a host and the part across hosts. Across hosts
// the terms are per host (all of a host's ranks share its network link), so beta_bytes there is what the
// busiest host sends.
struct TopoCost {
  Cost intra, inter;
  double time(const LinkCost& intra_link, const LinkCost& inter_link) const {
    return intra.time(intra_link) + inter.time(inter_link);
  }
};

// The cost of one algorithm of one op. `cost` is the flat pattern on one link class; `topo_cost`
// (optional) is the cost on a layout of hosts (hierarchical algorithms, single-host windows).
struct AlgoCost {
  OpKind op;
  Algo algo;
  Cost (*cost)(size_t bytes, int world);
  TopoCost (*topo_cost)(size_t bytes, const HostLayout& layout) = nullptr;
  // The pattern runs only on a power-of-two world (the algorithm's applicable() says the same; a test
  // checks both agree).
  bool pow2_only = false;
};

// Every (op, algorithm) the native backend implements, in the registry's order (the tie-break for equal
// costs: the bandwidth algorithm first).
const std::vector<AlgoCost>& cost_table();
// The row of (op, algo); nullptr when that op has no such algorithm.
const AlgoCost* find_cost(OpKind op, Algo algo);

// Predicted seconds of `c` for `bytes` on `layout`: topo_cost when the algorithm has one; otherwise its
// flat cost on the intra-host link (one host) or the inter-host link (several hosts: a flat pattern's
// steps each wait for their slowest, cross-host, message; patterns whose ranks of one host cross at once,
// direct and recursive doubling/halving, are charged that share of the host's link).
double predict_seconds(const AlgoCost& c, size_t bytes, const HostLayout& layout, const LinkCost& intra,
                       const LinkCost& inter);

// ---- integer helpers and thresholds that an algorithm's run() and its cost both read ----
namespace cost {
inline int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}
inline int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
inline bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }
// Hierarchical all-reduce: across hosts, each local index's shard is all-reduced by recursive doubling
// below this size (inter-host latencies dominate small shards) and by the ring above.
inline constexpr size_t kHierInterRingBytes = size_t{64} << 10;
// The shared-memory window's per-rank slot (algorithms/shm_window.h ShmWindow::kSlotBytes; checked in
// shm_fast_path.cc).
inline constexpr size_t kShmSlotBytes = 4096;
// Single-copy broadcast above this size takes the staged shm path (cost and run alike).
inline constexpr size_t kCmaBroadcastMaxBytes = size_t{1} << 20;
// The single-copy path's chunk of one process_vm_readv/writev call.
inline constexpr size_t kCmaChunkBytes = size_t{256} << 10;
// Whether hierarchical all_gather / reduce_scatter apply on `l` (several hosts, the same number >= 2 of
// ranks each); otherwise they run (and cost) the flat ring.
bool hierarchical_layout(const HostLayout& l);
}  // namespace cost

}  // namespace trident
