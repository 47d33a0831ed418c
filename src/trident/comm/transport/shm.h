// Shared-memory transport: one segment per (process group, host) holding a single-producer
// single-consumer ring per ordered pair of local ranks, a doorbell (futex word) per rank, each rank's
// pid for liveness checks, and an abort flag with its reason.
//
// Waiting: a rank that finds nothing to do spins briefly, then sleeps on its doorbell futex; a writer or a
// reader that frees space rings the doorbell of the other side only when that side is asleep (no syscall
// on the fast path). Thread-safety: a ring has exactly one producer and one consumer thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/transport/abort.h"
#include "trident/comm/transport/channel.h"
#include "trident/comm/types.h"

namespace trident {

class Store;
class ShmWindow;

class ShmSegment {
 public:
  // Collective over the local members: `local_rank` of `local_size`; the first creates the segment and
  // publishes its name in `store` under `key`, the others open it, then it is unlinked (nothing leaks
  // when a process dies).
  static std::unique_ptr<ShmSegment> create_or_open(Store& store, const std::string& key, int local_rank,
                                                    int local_size, size_t ring_bytes, double timeout_s,
                                                    size_t window_bytes = 0);
  ~ShmSegment();

  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  size_t ring_bytes() const { return ring_bytes_; }

  std::unique_ptr<Channel> channel_to(int peer_local);
  // The collective window of this segment (see ShmWindow below); owned by the segment.
  ShmWindow* window() { return window_.get(); }

  // Doorbell of this rank.
  std::atomic<uint32_t>& bell(int local);
  std::atomic<uint32_t>& sleeping(int local);
  void ring(int local);  // wakes `local` if it is asleep
  // Sleeps until the bell moves from `seen` or timeout_ms passes.
  void sleep_on_bell(uint32_t seen, int timeout_ms);

  // Abort: first caller wins; its record is readable by all local ranks.
  void set_abort(const AbortRecord& record);
  bool aborted() const;
  AbortRecord abort_record() const;
  void wake_all();

  // pid/starttime of each local rank, published at open.
  int32_t pid(int local) const;
  uint64_t starttime(int local) const;

  struct Layout;

 private:
  ShmSegment() = default;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  int local_rank_ = 0;
  int local_size_ = 0;
  size_t ring_bytes_ = 0;
  size_t window_bytes_ = 0;
  std::unique_ptr<ShmWindow> window_;
};

// ShmWindow: the collective window of a segment, for the shared-memory fast path
// (comm/algorithms/shm_fast_path.cc and shm_cma.cc). Per local rank it holds a phase counter on its own cache line, the
// fingerprint of its current collective (two slots, by call parity), two small payload slots
// (kSlotBytes each, the latency path) and two staging buffers (stage_bytes() each, the bandwidth path).
//
// Protocol: every rank's counter advances by the same number of phases in every call, so counter values
// mean the same on every rank; "peer p finished phase k" is counter(p) >= k. A buffer is reused only after
// every rank's counter passed the phase that released it (release values are kept per buffer).
// Waiting spins, then sleeps on the rank's doorbell; while asleep it checks the abort flag, the peers'
// liveness (pid and start time), the deadline and the engine's poll hook (which reads the message rings,
// so a peer that issued a message-based collective at this sequence number is reported as a mismatch).
// Errors set the segment's abort flag (every local rank wakes and reports the same reason) and throw
// MismatchError, PeerDiedError or TimeoutError. Thread-safety: used by the group's executing thread only.
class ShmWindow {
 public:
  static constexpr size_t kSlotBytes = 4096;
  struct Fingerprint {
    uint64_t seq = 0;
    uint64_t count = 0;
    uint8_t op = 0, dtype = 0, redop = 0, algo = 0;
    int32_t root = 0;
  };

  ShmWindow(ShmSegment* seg, uint8_t* base, size_t stage_bytes);

  // Names used in errors: the group and each local rank's global rank (set once by the engine).
  void set_identity(std::string group, std::vector<int> global_ranks);
  bool has_identity() const { return !global_ranks_.empty(); }
  // Called by the engine at the start of each collective that uses the window (once per call).
  void begin(const Fingerprint& fp, std::chrono::steady_clock::time_point deadline, std::function<void()> poll);

  int rank() const { return me_; }
  int size() const { return n_; }
  size_t stage_bytes() const { return stage_bytes_; }
  uint8_t* slot(int rank, int buf);
  uint8_t* stage(int rank, int buf);

  // Current phase of this rank (the value every rank's counter reaches when it finished the same phase).
  uint64_t phase() const { return phase_; }
  // Finishes one phase: bumps this rank's counter (release) and wakes sleeping peers.
  void publish();
  // Until every rank's counter is >= target.
  void wait_all(uint64_t target);
  // Tiny path (payloads <= kTinyBytes): one cache line per rank and call parity holds a stamp (the call
  // number), the fingerprint and the payload, so a peer's whole contribution arrives in one line transfer.
  // post_tiny writes this rank's line; wait_tiny waits for every peer's line of this call and checks the
  // fingerprints; tiny(r) is rank r's payload. A line is rewritten two calls later, when every peer has
  // already read it (it could not have finished the call in between otherwise): no "done" phase.
  static constexpr size_t kTinyBytes = 32;
  void post_tiny(const void* data, size_t n);
  void wait_tiny();
  const uint8_t* tiny(int r) const;
  // After the first wait_all of a call: every rank issued the same collective (else MismatchError).
  void check_fingerprints();
  // Takes small slot / staging buffer for this round: waits until its last users released it, returns its
  // index; release_*(buf, phase) records the phase after which the current round is done with it.
  int acquire_slot();
  int acquire_stage();
  void release_slot(int buf, uint64_t at) { slot_release_[buf] = at; }
  void release_stage(int buf, uint64_t at) { stage_release_[buf] = at; }

  // For the engine: the fingerprint of a peer currently inside a window collective with sequence number
  // `seq` (a message-based collective at `seq` on this rank is then a mismatch). Returns that peer or -1.
  int peer_at_seq(uint64_t seq, Fingerprint* theirs) const;

  static std::string describe(const Fingerprint& fp);

  // ---- single-copy path (algorithms/shm_cma.cc) ----
  // pid of local rank r, as the segment published it at open (for process_vm_readv/writev).
  int32_t peer_pid(int r) const;
  // An access to local rank `peer`'s memory failed with errno `err` while doing `what`: PeerDiedError when
  // the peer is gone (ESRCH, or not alive any more), NetworkError otherwise; sets the segment's abort flag
  // so every local rank wakes and reports the same reason. Never returns.
  [[noreturn]] void fail_peer_access(int peer, int err, const std::string& what);
  // Throws the recorded error when any local rank has aborted (cheap: one load); called between chunks,
  // so that no rank keeps writing into the buffers of a peer that already left the failed collective.
  void check_abort();
  // Whether cross-memory attach works between every pair of this window's ranks, decided together by
  // the first single-copy call: 0 not tried yet, 1 usable, -1 refused (the staged path is used instead).
  int cma_state = 0;
  // ---- end single-copy path ----

  struct Ctl;  // per-rank control lines (shm.cc)

 private:
  Ctl* ctl(int r) const;
  // Records the failure in the segment (every local rank wakes and raises the same error) and raises it.
  [[noreturn]] void fail(AbortRecord::Kind kind, const std::string& msg, int peer, std::vector<int> missing = {});
  [[noreturn]] void raise_aborted();
  // Spins, then sleeps on the doorbell until ready(); slow checks name the ranks for which behind(p).
  template <class Ready, class Behind>
  void wait_until(Ready ready, Behind behind);
  // `behind(p)` re-reads whether peer p still owes this rank its part: a peer that posted and then exited
  // (it finished the collective) is not a dead peer.
  void slow_checks_for(const std::vector<int>& missing, const std::function<bool(int)>& behind);
  void check_one(int p, const Fingerprint& f);
  std::string who(int r) const;

  ShmSegment* seg_;
  uint8_t* base_;
  int me_, n_;
  size_t stage_bytes_;
  uint64_t phase_ = 0;
  uint64_t calls_ = 0;
  int cur_fp_ = 0;
  uint64_t slot_release_[2] = {0, 0}, stage_release_[2] = {0, 0};
  uint64_t slot_uses_ = 0, stage_uses_ = 0;
  int spin_limit_ = 4000;
  Fingerprint fp_;
  std::chrono::steady_clock::time_point deadline_;
  std::string group_;
  std::vector<int> global_ranks_;
  std::function<void()> poll_;
};

// /proc/<pid>/stat: whether pid is alive (not a zombie) with the given start time (0 = any).
bool process_alive(int32_t pid, uint64_t starttime);
uint64_t process_starttime(int32_t pid);

}  // namespace trident
