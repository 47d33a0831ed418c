// Work: the handle of one asynchronous collective (c10d's Work).
//
// Ownership: shared between the caller and the group's worker (std::shared_ptr). Thread-safety: all
// methods may be called from any thread. wait(timeout) blocks until the collective finished; it rethrows
// the collective's error (NetworkError, PeerDiedError, MismatchError, TimeoutError) on the caller's thread,
// and throws TimeoutError if `timeout` passes first (the collective itself keeps running until it finishes
// or its own deadline expires; its buffers stay in use until then).
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "trident/comm/types.h"

namespace trident {

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

  // Called by the backend exactly once.
  void finish(std::exception_ptr error = nullptr);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string description_;
};

}  // namespace trident
