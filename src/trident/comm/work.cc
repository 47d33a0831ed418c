#include "trident/comm/work.h"

#include "trident/comm/flight_recorder.h"
#include "trident/core/error.h"
#include "trident/core/stamp_clock.h"
#include "trident/core/timeline.h"

namespace trident {

void Work::wait(std::optional<Seconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(*timeout);
    if (!cv_.wait_until(lock, deadline, [&] { return done_; }))
      TRIDENT_THROW(TimeoutError, "Timed out waiting {:.0f}ms for {} (Work::wait; the call is still running)",
                    timeout->count() * 1e3, description_);
  } else {
    cv_.wait(lock, [&] { return done_; });
  }
  // A copy made here (copy_error): the caller reads an object of its own thread, and the original may be
  // released by the thread that finished this Work, after this caller's last use of the Work.
  if (error_) std::rethrow_exception(copy_error(error_));
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
  const int64_t t = Timeline::now_ns();
  finished_ns_.store(t, std::memory_order_release);
  std::unique_lock<std::mutex> lock(mu_);
  if (std::shared_ptr<FlightRing> ring = std::move(ring_)) {
    // Before done_: a failure's dump is written before any waiter sees the error (and perhaps exits).
    lock.unlock();
    ring->finished(record_, stamp_clock::now(), error);
    lock.lock();
  }
  done_ = true;
  error_ = error;
  std::function<void(Work&)> then = std::move(on_finish_);
  lock.unlock();
  cv_.notify_all();
  if (then) then(*this);
}

void Work::on_finish(std::function<void(Work&)> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    on_finish_ = std::move(fn);
    return;
  }
  lock.unlock();
  fn(*this);
}

void Work::record_to(std::shared_ptr<FlightRing> ring, uint64_t id) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    ring_ = std::move(ring);
    record_ = id;
    return;
  }
  const std::exception_ptr error = error_;
  lock.unlock();
  ring->finished(id, stamp_clock::from_ns(finished_ns()), error);
}

}  // namespace trident
