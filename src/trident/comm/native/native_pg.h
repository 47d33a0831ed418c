// NativeProcessGroup: trident's own backend — algorithms (comm/algorithms) over shared memory between
// ranks on a host and TCP between hosts (comm/transport), driven by an Engine.
//
// Each group has its own channels, shared-memory segment, sequence numbers and (created on first async
// use) one worker thread, so a rank can use many groups at once. Calls are taken in issue order by one
// driving thread at a time (the worker, or a blocking caller that found the group idle). A collective runs
// to completion before the next call is taken (collectives complete in sequence-number order); a send or
// receive is only started (Engine::start_p2p) and then progressed alongside everything after it, so sends
// and receives never wait in one queue behind each other: a rank may post a receive and then a send on
// one group while its peer does the same (a pipeline stage's two directions need no subgroups). A blocking
// collective with nothing queued, running or pending runs on the caller's thread (no hand-off latency)
// and, through run_blocking, without a Work, a heap allocation or a condition variable: one lock of the
// group's mutex before (sequence number, memoized algorithm) and one after, one clock read (its deadline).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "trident/comm/native/engine.h"
#include "trident/comm/process_group.h"
#include "trident/comm/tuning.h"

namespace trident {

class NativeProcessGroup : public ProcessGroup {
 public:
  // Collective over the `size` ranks that share `store` (a group's own namespace is derived from `name`).
  // `global_ranks[r]` is rank r's rank in the world group (for messages).
  NativeProcessGroup(std::shared_ptr<Store> store, int rank, int size, const GroupOptions& options,
                     std::vector<int> global_ranks);
  ~NativeProcessGroup() override;

  std::string backend_name() const override { return "native"; }
  int global_rank(int r) const override { return global_ranks_[r]; }
  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& ranks, const std::string& name) override;
  std::shared_ptr<ProcessGroup> split(int color, int key) override;
  void abort(const std::string& reason) override;
  Algo choose_algorithm(const CollArgs& args, Algo forced) const override;
  // As above; `source` is set to "forced", "TRIDENT_ALGO", "tuning" or "cost model".
  Algo choose_algorithm(const CollArgs& args, Algo forced, const char** source) const;
  TransportInfo transport_info() const override;
  GroupTraffic traffic() const override { return engine_->traffic(); }
  bool supports_any_source() const override { return true; }
  // A ShmBuffer when the group has a shared-memory window (every rank on this host, no TCP peer).
  std::shared_ptr<RegisteredBuffer> alloc_shared(size_t bytes) override;

 protected:
  std::shared_ptr<Work> post(const CollArgs& args, const CallOptions& opts, bool blocking) override;
  void run_blocking(const CollArgs& args, const CallOptions& opts) override;

 private:
  struct Item {
    CollArgs args;
    std::vector<size_t> counts;
    const AlgorithmInfo* info;  // null for send/recv
    Algo algo;
    uint64_t seq;
    Engine::Clock::time_point deadline;
    std::shared_ptr<Work> work;
  };
  void execute(Item& item);
  // A send or receive: started on the engine, then pending in p2p_ until reap_p2p() finishes its Work.
  void start_p2p(Item& item);
  // Finishes the Works of the point-to-point calls that completed; after a failure of the group, fails
  // every pending one with it. Driving thread only.
  void reap_p2p();
  // Runs on the driving thread (busy_ is held; `lock` holds mu_ on entry and exit): takes queued calls
  // in order and progresses pending point-to-point calls until `done()` (checked under mu_) holds.
  template <class Done>
  void drive(std::unique_lock<std::mutex>& lock, Done done);
  // Runs one call on this thread (the group's executing thread while busy_); returns its error, if any.
  std::exception_ptr run_call(const CollArgs& a, const AlgorithmInfo* info, Algo algo, uint64_t seq,
                              Engine::Clock::time_point deadline);
  // The algorithm for this call, from the memo when it is the same call as last time. Holds mu_.
  // `description` (may be null) receives the Work description.
  const AlgorithmInfo* choose_memoized(const CollArgs& args, Algo forced, Algo* algo, const char** source,
                                       std::string* description);
  void worker_loop();
  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, const std::string& name);

  std::shared_ptr<Store> base_store_;
  std::shared_ptr<Store> store_;  // this group's namespace
  GroupOptions options_;
  std::vector<int> global_ranks_;
  std::unique_ptr<Engine> engine_;
  TransportInfo transport_info_;
  LinkCost intra_link_, inter_link_;  // cost-model links inside a host and across hosts
  HostLayout layout_;                 // which rank is on which host (every rank agrees)
  std::shared_ptr<const TuningTable> tuning_;  // TRIDENT_TUNING_FILE when it covers this group, else null
  int subgroup_counter_ = 0;
  uint64_t termination_hook_ = 0;  // flight_recorder::add_termination_hook: aborts this group on SIGTERM
  bool debug_comm_ = false;  // TRIDENT_DEBUG covers "comm": every call is logged (through post)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Item>> queue_;
  bool busy_ = false;  // a thread drives the engine (worker or inline)
  bool idle_ = false;  // the driver sleeps in Engine::idle_wait: post() wakes it for a new call
  // Started point-to-point calls not yet finished (engine handle, Work); only the driving thread touches it.
  struct PendingP2P {
    int handle;
    std::shared_ptr<Work> work;
  };
  std::vector<PendingP2P> p2p_;
  size_t p2p_count_ = 0;  // p2p_.size(), readable under mu_ (the worker's wait predicate)
  bool stop_ = false;
  uint64_t next_seq_ = 1;
  std::thread worker_;

  // ---- small-message latency: one-entry memo of the last call's algorithm choice and Work description
  // (the cost model and the formatting cost more than a shared-memory all-reduce of a few bytes).
  // Guarded by mu_. ----
  struct ChoiceMemo {
    bool valid = false;
    OpKind op = OpKind::kBarrier;
    size_t count = 0;
    DType dtype = DType::kFloat32;
    ReduceOp redop = ReduceOp::kSum;
    int root = 0;
    Algo forced = Algo::kAuto;
    Algo algo = Algo::kAuto;
    const char* source = nullptr;
    const AlgorithmInfo* info = nullptr;
    std::string description;
  };
  ChoiceMemo memo_;
  // ---- end memo ----
};

}  // namespace trident
