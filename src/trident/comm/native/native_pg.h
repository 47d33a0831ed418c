// NativeProcessGroup: trident's own backend — algorithms (comm/algorithms) over shared memory between
// ranks on a host and TCP between hosts (comm/transport), driven by an Engine.
//
// Each group has its own channels, shared-memory segment, sequence numbers and (created on first async
// use) one worker thread, so a rank can use many groups at once. Async calls run on the worker in issue
// order; a blocking call with nothing queued runs on the caller's thread (no hand-off latency).
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
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name = {}) override;
  std::shared_ptr<ProcessGroup> split(int color, int key) override;
  void abort(const std::string& reason) override;
  Algo choose_algorithm(const CollArgs& args, Algo forced) const override;
  // As above; `source` is set to "forced", "TRIDENT_ALGO", "tuning" or "cost model".
  Algo choose_algorithm(const CollArgs& args, Algo forced, const char** source) const;
  const std::string& transport_summary() const { return transport_summary_; }

 protected:
  std::shared_ptr<Work> post(const CollArgs& args, const CallOptions& opts, bool blocking) override;

 private:
  struct Item {
    CollArgs args;
    std::vector<size_t> counts;
    Algo algo;
    uint64_t seq;
    Engine::Clock::time_point deadline;
    std::shared_ptr<Work> work;
  };
  void execute(Item& item);
  void worker_loop();
  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, const std::string& name);

  std::shared_ptr<Store> base_store_;
  std::shared_ptr<Store> store_;  // this group's namespace
  GroupOptions options_;
  std::vector<int> global_ranks_;
  std::unique_ptr<Engine> engine_;
  std::string transport_summary_;
  LinkCost link_;
  std::shared_ptr<const TuningTable> tuning_;  // TRIDENT_TUNING_FILE when it covers this group, else null
  int subgroup_counter_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Item>> queue_;
  bool busy_ = false;  // an item is executing (worker or inline)
  bool stop_ = false;
  uint64_t next_seq_ = 1;
  std::thread worker_;
  std::mutex exec_mu_;
};

}  // namespace trident
