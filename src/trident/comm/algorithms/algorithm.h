// Algorithms: one class per file, each a pattern of point-to-point steps over an AlgoContext
// (STYLE.md #2, #3). An algorithm knows nothing of transports, processes or deadlines: the context
// stamps every message with the collective's sequence number and fingerprint, moves bytes over shared
// memory or TCP, enforces the deadline and reports failures by throwing from wait().
//
// Contract of run(): called on every rank of the group with the same CollArgs (see comm/types.h for the
// buffer conventions); ReduceOp::kAvg arrives as kSum. It must not return before every request it posted
// has completed (wait on them), and must work for any world size >= 1 and any count >= 0 (counts not
// divisible by the world size and non-power-of-two worlds are normal cases). Step tags only need to be
// unique per (sender, receiver) pair within one collective; messages between a pair are matched in order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "trident/comm/types.h"

namespace trident {

struct Request {
  int32_t id = -1;
};

class ShmWindow;  // transport/shm.h: the shared-memory fast path's window

class AlgoContext {
 public:
  virtual ~AlgoContext() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Non-blocking; `data` must stay valid until the request completes. A zero-byte message is a real
  // message (it synchronizes).
  virtual Request isend(int peer, uint32_t step, const void* data, size_t nbytes) = 0;
  virtual Request irecv(int peer, uint32_t step, void* data, size_t nbytes) = 0;
  // Receives count elements and combines them into dst: dst[i] = dst[i] op incoming[i], or, with `own`
  // (count elements that stay valid until completion; may be dst), dst[i] = own[i] op incoming[i]: an
  // out-of-place algorithm's first combine without copying its input into dst first.
  virtual Request irecv_reduce(int peer, uint32_t step, void* dst, size_t count, DType dtype, ReduceOp op,
                               const void* own = nullptr) = 0;
  // Blocks until all complete (spinning briefly, then sleeping); throws on failure or deadline.
  virtual void wait(std::span<const Request> reqs) = 0;
  void wait(std::initializer_list<Request> reqs) { wait(std::span<const Request>(reqs.begin(), reqs.size())); }
  void wait(const std::vector<Request>& reqs) { wait(std::span<const Request>(reqs.data(), reqs.size())); }

  // Reusable scratch memory, 64-byte aligned, already faulted in; `slot` distinguishes buffers used at
  // the same time. Valid until the collective returns; contents undefined at entry. Algorithms ask for
  // each slot at most once per collective (a second call may move the first buffer).
  virtual void* scratch(size_t nbytes, int slot = 0) = 0;

  // Pipelining chunk of the bandwidth algorithms in bytes; 0 lets each algorithm choose by message size.
  // The engine returns TRIDENT_CHUNK_BYTES; tests shrink it so small messages reach multi-chunk paths.
  virtual size_t chunk_bytes() const { return 0; }

  // Index of the host rank r runs on (0, 1, ... numbered by first appearance in rank order); every rank
  // of the group returns the same for every r. Hierarchical algorithms read it; the default is one host.
  virtual int host_of(int r) const {
    (void)r;
    return 0;
  }

  // ---- shared-memory fast path (shm_fast_path.cc, shm_cma.cc; ShmWindow in transport/shm.h) ----
  // The group's shared-memory collective window, prepared for the current collective (call at most once
  // per collective), when every rank of the group is on this host and reached over shared memory;
  // nullptr otherwise (the algorithm then falls back to a message-based one).
  virtual ShmWindow* shm_window() { return nullptr; }
  // ---- end shared-memory fast path ----

  // Blocking conveniences.
  void send(int peer, uint32_t step, const void* data, size_t nbytes) { wait({isend(peer, step, data, nbytes)}); }
  void recv(int peer, uint32_t step, void* data, size_t nbytes) { wait({irecv(peer, step, data, nbytes)}); }
};

// Latency and bandwidth terms of a link: time(bytes) = alpha + bytes * beta; gamma is the local pass
// (reduce or copy) over bytes that is not overlapped with a transfer.
struct LinkCost {
  double alpha_s = 2e-6;              // per message
  double beta_s_per_byte = 1.0 / 8e9;  // inverse bandwidth
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

// Hosts of a group: which rank runs where (from AlgoContext::host_of, or the process group's peers).
struct HostLayout {
  std::vector<int> host_of;               // rank -> host index
  std::vector<std::vector<int>> members;  // host -> its ranks, ascending
  static HostLayout from_hosts(std::vector<int> host_of);  // host indices need not be dense
  static HostLayout of(const AlgoContext& ctx);
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

// The `bytes` argument of cost() for a call, as nccl-tests counts a collective's size: count * element
// size for broadcast, reduce and all_reduce; the whole gathered/scattered buffer (count * world * element
// size, or sum(counts) for all_gatherv) for gather, scatter, all_gather(v), reduce_scatter and all_to_all.
inline size_t cost_bytes(const CollArgs& a, int world) {
  const size_t es = a.op == OpKind::kBarrier ? 0 : dtype_size(a.dtype);
  switch (a.op) {
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
      return a.count * static_cast<size_t>(world) * es;
    case OpKind::kAllGatherV: {
      size_t total = 0;
      if (a.counts != nullptr)
        for (size_t c : *a.counts) total += c;
      return total * es;
    }
    case OpKind::kBarrier:
      return 0;
    default:
      return a.count * es;
  }
}

// Block partition of `count` elements over `parts`: the first count % parts blocks get one more.
inline size_t block_count(size_t count, int parts, int i) {
  return count / parts + (static_cast<size_t>(i) < count % parts ? 1 : 0);
}
inline size_t block_offset(size_t count, int parts, int i) {
  return static_cast<size_t>(i) * (count / parts) + std::min<size_t>(i, count % parts);
}

struct AlgorithmInfo {
  OpKind op;
  Algo algo;
  // Cost for `bytes` (the per-rank buffer size as nccl-tests counts it) at `world` ranks.
  Cost (*cost)(size_t bytes, int world);
  void (*run)(AlgoContext& ctx, const CollArgs& args);
  // Optional: whether this algorithm can run this call (e.g. needs a power of two); nullptr = always.
  bool (*applicable)(const CollArgs& args, int world) = nullptr;
  // Optional: cost on a layout of hosts (hierarchical algorithms). nullptr = `cost` on the slowest link
  // the group uses (see predict_seconds).
  TopoCost (*topo_cost)(size_t bytes, const HostLayout& layout) = nullptr;
};

// Predicted seconds of `info` for `bytes` (as cost_bytes counts them) on `layout`: topo_cost when the
// algorithm has one; otherwise its flat cost on the intra-host link (one host) or the inter-host link
// (several hosts: a flat pattern's steps each wait for their slowest, cross-host, message; patterns whose
// ranks of one host cross at once, direct and recursive doubling/halving, are charged that share of the
// host's link).
double predict_seconds(const AlgorithmInfo& info, size_t bytes, const HostLayout& layout, const LinkCost& intra,
                       const LinkCost& inter);

// Every algorithm, for selection, forcing by name, tests and benchmarks. Defined in registry.cc.
const std::vector<AlgorithmInfo>& algorithm_table();
// The algorithms available for `op`.
std::vector<const AlgorithmInfo*> algorithms_for(OpKind op);
// Finds (op, algo); nullptr when that op has no such algorithm.
const AlgorithmInfo* find_algorithm(OpKind op, Algo algo);

}  // namespace trident
