// The shared-memory fast path's collective window (see the class comment).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trident/comm/transport/abort.h"
#include "trident/comm/transport/shm.h"
#include "trident/comm/types.h"

namespace trident {

// ShmWindow: the collective window laid out in a shared-memory segment's window region (the transport
// provides the bytes, the pids and the doorbells; what a collective is, its fingerprint and its mismatch
// checks live here), for the shared-memory fast path (shm_fast_path.cc and shm_cma.cc). Per local rank it holds a phase counter on its own cache line, the
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

  // Over `seg`'s window region, which must hold region_bytes(local size, stage) bytes for some stage size.
  explicit ShmWindow(ShmSegment* seg);
  // Bytes of the window region for `n` local ranks with `stage_bytes` per staging buffer (whole pages).
  static size_t region_bytes(int n, size_t stage_bytes);
  // Staging bytes per rank and buffer: TRIDENT_SHM_WINDOW_BYTES, else a round of the bandwidth path
  // (L2-sized: 1 MiB up to 4 local ranks, 256 KiB beyond), rounded up to whole pages.
  static size_t default_stage_bytes(int n);

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
  static size_t ctl_bytes(int n);
  // Records the failure in the segment (every local rank wakes and raises the same error) and raises it.
  [[noreturn]] void fail(AbortRecord::Kind kind, const std::string& msg, int peer, std::vector<int> missing = {});
  [[noreturn]] void raise_aborted();
  // Spins, then sleeps on the doorbell until ready(); slow checks name the ranks for which behind(p).
  template <class Ready, class Behind>
  void wait_until(Ready ready, Behind behind);
  // wait_until every peer p is no longer behind(p).
  template <class Behind>
  void wait_for_peers(Behind behind);
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

}  // namespace trident
