#include "trident/comm/work.h"

#include "trident/core/error.h"
#include "trident/core/timeline.h"

namespace trident {

void Work::wait(std::optional<Seconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(*timeout);
    if (!cv_.wait_until(lock, deadline, [&] { return done_; }))
      TRIDENT_THROW(TimeoutError, "Work::wait: {} did not finish within {:.3f}s (it is still running)", description_,
                    timeout->count());
  } else {
    cv_.wait(lock, [&] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::exception_ptr Work::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Work::mark_started() { started_ns_.store(Timeline::now_ns(), std::memory_order_release); }

void Work::finish(std::exception_ptr error) {
  finished_ns_.store(Timeline::now_ns(), std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

}  // namespace trident
