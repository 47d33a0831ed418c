// Flight recorder: every process group keeps a ring of its last N calls (collectives and point-to-point):
// what was issued (op, sizes, dtype, reduction, root/peer, sequence number, the algorithm the backend ran),
// when (enqueued, started, ended) and how it ended (completed, or failed with which error). When a job
// hangs or fails, each rank writes its rings as one JSON file; `trident inspect DIR` (comm/flight_inspect.h)
// merges the files and says which rank never entered which collective.
//
// Ownership: ProcessGroup owns its FlightRing (shared: an async Work keeps it alive until it finishes); a
// process-wide registry holds weak references for dumps. Thread-safety: every method may be called from any
// thread; a ring has one mutex, held for a few stores per event (the issuing thread and the group's worker
// are its only writers, so it is rarely contended). Blocking: recording never blocks beyond that mutex and
// never allocates, except to copy the text of an error. Cost: the three stamps of a call are time-stamp
// counter reads (core/stamp_clock.h), converted to CLOCK_MONOTONIC only when a ring is read: a call costs
// about 30 ns on top of the same call unrecorded, where three clock_gettime calls cost 60-90 on a VM.
// Dumps: TRIDENT_FLIGHT_RECORDER_DIR, else the folder the program set (set_dump_dir: `trident train` uses
// <out_dir>/flight_recorder), else none (automatic dumps are skipped with one warning). A dump is written
// (temp file + rename) when a collective fails with a NetworkError (deadline, dead peer, mismatch), on
// SIGUSR1 (the process goes on), on SIGTERM (the process then terminates as it would have), and on dump().
// Signal handlers only write one byte to a pipe; a thread does the dump. They are installed when a process
// group is made. SIGUSR1's only where its disposition is still the default.
// SIGTERM always ends the process within a bounded time, whatever its calls are doing (torchrun, Slurm,
// Kubernetes and Process.terminate() send it first): trident's handler is installed over a handler the
// program set (a Python one, say), which it runs too, but not where the program ignores SIGTERM. After the
// dump, the default action runs at once; a program with a handler of its own first gets 5 s to end by
// itself, its groups aborted (add_termination_hook) so that a call blocked in one returns with an error.
// TRIDENT_FLIGHT_RECORDER_SIZE=0 disables recording: no ring, no SIGUSR1 handler (the SIGTERM guard stays).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trident/comm/types.h"

namespace trident {

enum class CallState : uint8_t { kQueued = 0, kStarted, kCompleted, kFailed };
const char* call_state_name(CallState s);  // "queued" | "started" | "completed" | "failed"

struct FlightRecord {
  uint64_t id = 0;   // 1-based issue number in its group's ring (0: empty slot)
  uint64_t seq = 0;  // the collective's sequence number in its group (0: point-to-point)
  OpKind op = OpKind::kBarrier;
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  Algo algo = Algo::kAuto;  // as the backend chose it (kAuto: not reported)
  CallState state = CallState::kQueued;
  int root = -1;     // rooted collectives
  int peer = -1;     // send/recv
  uint32_t tag = 0;  // send/recv
  uint64_t count = 0;        // elements per rank (all_gatherv: this rank's)
  int64_t enqueue_stamp = 0;  // core/stamp_clock.h stamps (stamp_clock::to_ns: CLOCK_MONOTONIC); 0: not yet
  int64_t start_stamp = 0;
  int64_t end_stamp = 0;
  const char* error_type = nullptr;  // "TimeoutError", "PeerDiedError", ... (static text)
  std::string error;                 // what() of the error
};

class FlightRing {
 public:
  FlightRing(std::string group, int rank, int size, int generation, size_t capacity);

  // Records a call as issued (queued) and returns its id; collectives get the group's next sequence number.
  uint64_t enqueue(const CollArgs& a);
  // The backend began running call `id` as collective `seq` (0: point-to-point) with `algo` at `stamp`
  // (stamp_clock::now()).
  void started(uint64_t id, uint64_t seq, Algo algo, int64_t stamp);
  // The call ended at `stamp`: completed when `error` is null. A NetworkError (deadline, dead peer,
  // mismatch) also triggers a dump (flight_recorder::on_failure).
  void finished(uint64_t id, int64_t stamp, std::exception_ptr error);
  // Who the ranks are and which backend runs them (once, on the group's first call).
  void describe(std::string backend, std::vector<int> global_ranks);

  struct Snapshot {
    std::string group;
    int rank = 0, size = 0, generation = 0;
    std::string backend;
    std::vector<int> global_ranks;
    size_t capacity = 0;
    uint64_t issued = 0;                 // calls recorded since the group was made (older ones overwritten)
    std::vector<FlightRecord> records;   // oldest first
  };
  Snapshot snapshot() const;
  size_t capacity() const { return slots_.size(); }

 private:
  mutable std::mutex mu_;
  std::vector<FlightRecord> slots_;
  uint64_t next_id_ = 1;
  uint64_t next_seq_ = 1;
  std::string group_, backend_;
  int rank_, size_, generation_;
  std::vector<int> global_ranks_;
};

namespace flight_recorder {

// TRIDENT_FLIGHT_RECORDER_SIZE (read once): calls kept per group; 0 = off.
size_t capacity();
// A registered ring for a new group, or nullptr when recording is off. Every call, recording or not, also
// makes sure of the SIGTERM guard (the dump thread and trident's SIGTERM handler, see the top of this file;
// installed over a handler the program set since the last call, too) and, when recording, the SIGUSR1 dump.
std::shared_ptr<FlightRing> make_ring(const std::string& group, int rank, int size);
// Functions the SIGTERM guard calls, on a thread of its own, when the program has a SIGTERM handler of its
// own: a backend aborts its group there, so that calls blocked in it return and the program's handler can
// run. add returns an id for remove; remove waits while the hooks run (call it before the group is torn down).
uint64_t add_termination_hook(std::function<void()> fn);
void remove_termination_hook(uint64_t id);
// The folder of automatic dumps when TRIDENT_FLIGHT_RECORDER_DIR is unset (the run's out dir).
void set_dump_dir(const std::string& dir);
// TRIDENT_FLIGHT_RECORDER_DIR, else set_dump_dir's folder, else "".
std::string dump_dir();
// This process's rings as the JSON text of one dump (`reason`: why it was written).
std::string dump_json(const std::string& reason);
// Writes this process's dump to `dir` (default dump_dir()) as rank_<global rank>.json, atomically, and
// returns its path. Throws InvalidArgument when no folder is known, IoError when it cannot be written.
std::string dump(const std::string& reason, const std::string& dir = {});
// A call failed with `error`: the first failure in this process is dumped at once (before the error
// reaches the caller, who may exit), later ones by the dump thread. No-op without a dump folder.
void on_failure(const std::string& reason);

}  // namespace flight_recorder
}  // namespace trident
