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

#include "trident/comm/collective.h"
#include "trident/comm/cost/cost.h"
#include "trident/comm/types.h"

namespace trident {

struct Request {
  int32_t id = -1;
};

class ShmWindow;  // shm_window.h: the shared-memory fast path's window

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

  // ---- shared-memory fast path (shm_fast_path.cc, shm_cma.cc; ShmWindow in shm_window.h) ----
  // The group's shared-memory collective window, prepared for the current collective (call at most once
  // per collective), when every rank of the group is on this host and reached over shared memory;
  // nullptr otherwise (the algorithm then falls back to a message-based one).
  virtual ShmWindow* shm_window() { return nullptr; }
  // ---- end shared-memory fast path ----

  // Blocking conveniences.
  void send(int peer, uint32_t step, const void* data, size_t nbytes) { wait({isend(peer, step, data, nbytes)}); }
  void recv(int peer, uint32_t step, void* data, size_t nbytes) { wait({irecv(peer, step, data, nbytes)}); }
};

// The hosts of the context's group, from AlgoContext::host_of.
HostLayout host_layout(const AlgoContext& ctx);

// Block partition of `count` elements over `parts`: the first count % parts blocks get one more.
inline size_t block_count(size_t count, int parts, int i) {
  return count / parts + (static_cast<size_t>(i) < count % parts ? 1 : 0);
}
inline size_t block_offset(size_t count, int parts, int i) {
  return static_cast<size_t>(i) * (count / parts) + std::min<size_t>(i, count % parts);
}

// One algorithm: its pattern (run) and its row of the cost model (comm/cost/cost.h).
struct AlgorithmInfo {
  OpKind op;
  Algo algo;
  void (*run)(AlgoContext& ctx, const CollArgs& args);
  // Optional: whether this algorithm can run this call (e.g. needs a power of two); nullptr = always.
  bool (*applicable)(const CollArgs& args, int world) = nullptr;
  // The (op, algo) row of cost_table(); algorithm_table() fills it and fails on a missing row.
  const AlgoCost* model = nullptr;
  // Flat cost for `bytes` (as size_bytes in comm/collective.h counts them) at `world` ranks.
  Cost cost(size_t bytes, int world) const { return model->cost(bytes, world); }
};

// Predicted seconds of `info` for `bytes` (as size_bytes in comm/collective.h counts them) on `layout` (cost.h).
inline double predict_seconds(const AlgorithmInfo& info, size_t bytes, const HostLayout& layout,
                              const LinkCost& intra, const LinkCost& inter) {
  return predict_seconds(*info.model, bytes, layout, intra, inter);
}

// Every algorithm, for selection, forcing by name, tests and benchmarks. Defined in registry.cc.
const std::vector<AlgorithmInfo>& algorithm_table();
// The algorithms available for `op`.
std::vector<const AlgorithmInfo*> algorithms_for(OpKind op);
// Finds (op, algo); nullptr when that op has no such algorithm.
const AlgorithmInfo* find_algorithm(OpKind op, Algo algo);

}  // namespace trident
