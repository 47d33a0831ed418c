// Work: the handle of one asynchronous collective (c10d's Work).
//
// Ownership: shared between the caller and the group's worker (std::shared_ptr). Thread-safety: all
// methods may be called from any thread. wait(timeout) blocks until the collective finished; it rethrows
// the collective's error (NetworkError, PeerDiedError, MismatchError, TimeoutError) on the caller's thread,
// and throws TimeoutError if `timeout` passes first (the collective itself keeps running until it finishes
// or its own deadline expires; its buffers stay in use until then).
// Timing: started_ns()/finished_ns() are when the backend began and ended running the collective
// (CLOCK_MONOTONIC ns, Timeline::now_ns(); 0 while unknown: finish() always records the end, only backends
// that call mark_started() record the start — the native one does, from the thread that runs it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "trident/comm/types.h"

namespace trident {

class FlightRing;

class Work {
 public:
  explicit Work(std::string description = {}) : description_(std::move(description)) {}
  virtual ~Work() = default;

  // Blocks until done; rethrows the error if it failed. Returns normally on success.
  void wait(std::optional<Seconds> timeout = std::nullopt);
  bool completed();                // finished (successfully or not), without blocking
  bool test() { return completed(); }
  std::exception_ptr error();      // null while running or after success
  const std::string& description() const { return description_; }
  // A finished receive: the rank its message came from (a receive from kAnySource learns it here); -1 for
  // other calls and for backends that do not report it.
  int source_rank() const { return source_rank_.load(std::memory_order_acquire); }
  void set_source_rank(int r) { source_rank_.store(r, std::memory_order_release); }  // backend, before finish()

  // Called by the backend exactly once (records finished_ns()).
  void finish(std::exception_ptr error = nullptr);
  // Called by the backend when it begins running the collective (after any queueing); the second form
  // carries a start already taken elsewhere (a Work that stands for another one).
  void mark_started();
  void mark_started(int64_t ns) { started_ns_.store(ns, std::memory_order_release); }
  // Runs fn(*this) once the Work finished: on the thread that calls finish(), after waiters are released, or
  // at once on this thread when it already finished. One callback per Work (a second replaces the first
  // while the Work runs). fn must not throw.
  void on_finish(std::function<void(Work&)> fn);
  int64_t started_ns() const { return started_ns_.load(std::memory_order_acquire); }
  int64_t finished_ns() const { return finished_ns_.load(std::memory_order_acquire); }
  // Reports the start (mark_started) and the end (finish) to call `id` of a flight recorder; when the
  // Work already finished, reports them at once. Called by ProcessGroup once, after post().
  void record_to(std::shared_ptr<FlightRing> ring, uint64_t id);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string description_;
  std::atomic<int64_t> started_ns_{0}, finished_ns_{0};
  std::atomic<int> source_rank_{-1};
  std::shared_ptr<FlightRing> ring_;  // guarded by mu_
  std::function<void(Work&)> on_finish_;  // guarded by mu_
  uint64_t record_ = 0;
};

}  // namespace trident
