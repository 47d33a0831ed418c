// The bucket/overlap engine of DataParallel: which contiguous ranges of the flat gradient buffer form
// buckets, when each bucket is ready during backward (its last parameter's grad-ready hook), the
// collective each bucket launched (Work), waiting for them, and the overlap of those collectives with
// backward. It knows nothing of what a bucket's collective is (all-reduce, reduce-scatter, in which
// dtype): the caller's launch function decides (parallel/dp_sharding.h).
//
// Layouts (element ranges of the flat buffer, highest offset first, tiling [0, n)):
//   reverse_order_buckets  PyTorch DDP's: parameters in reverse order (the order backward produces their
//                          gradients) appended to the current bucket until it holds >= cap elements; the
//                          first bucket closes at first_cap (PyTorch: 1 MiB) so its all-reduce starts
//                          early in backward, every later one at cap (PyTorch's bucket_cap_mb = 25).
//   fixed_chunks           chunks of C elements from the top (zero2: C a multiple of N, so only the lowest
//                          chunk is partial); a chunk is ready once every parameter overlapping it is.
//   unit_buckets           given ranges (zero3: the parameters one model block owns).
//
// Ownership: plain data plus the Works it holds. Thread-safety: one thread (the training loop); the
// Works complete on the group's worker. Errors: Work::wait() rethrows a collective's failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "trident/comm/process_group.h"
#include "trident/nn/model.h"

namespace trident::parallel {

// When one bucket's gradient collective ran (CLOCK_MONOTONIC ns, trident::Timeline::now_ns()).
struct BucketTiming {
  int64_t launched_ns = 0;  // posted to the process group (0: no collective in that step, e.g. 1 rank)
  int64_t started_ns = 0;   // the group began running it (backends that do not say: launched_ns)
  int64_t finished_ns = 0;  // it completed
};

// Gradient communication against backward for one synced step, or summed over steps (overlap_totals()).
// comm_s = hidden_s + the collectives' time after the window; that remainder lies inside
// [window_end, sync_end] (the worker runs one collective at a time), so it is <= exposed_s.
struct OverlapStats {
  int64_t window_begin_ns = 0;  // first grad-ready hook of the syncing micro-step (start of its backward)
  int64_t window_end_ns = 0;    // finish_gradient_sync() called: end of backward
  int64_t sync_end_ns = 0;      // finish_gradient_sync() returned
  double backward_s = 0;        // window_end - window_begin
  double comm_s = 0;            // sum of the bucket collectives' run times (finished - started)
  double hidden_s = 0;          // the part of comm_s inside [window_begin, window_end]
  double exposed_s = 0;         // sync_end - window_end: how long finish_gradient_sync() blocked
  int steps = 0;                // steps summed (1 for one step's stats)
  double hidden_fraction() const { return comm_s > 0 ? hidden_s / comm_s : 0.0; }
};

struct GradBucket {
  size_t begin = 0, end = 0;  // element range of the flat gradient buffer
  int params = 0;             // parameters (overlapping it) whose gradients it waits for
  int pending = 0;            // of those, not yet ready in this micro-step
  std::shared_ptr<Work> work;   // its collective in this step (none: nothing to run, e.g. one rank)
  bool launched = false;        // launch ran in this step
  bool grads_released = false;  // its full-gradient pages went back to the OS in this step
  int64_t launched_ns = 0;      // when `work` was posted
};

struct BucketLayout {
  std::vector<GradBucket> buckets;  // highest offset first
  // Per parameter: the buckets [first, last] its gradient belongs to ({-1, -1}: none, e.g. empty).
  std::vector<std::pair<int, int>> of_param;
};

BucketLayout reverse_order_buckets(const std::vector<nn::Parameter>& params, size_t n, size_t first_cap, size_t cap);
BucketLayout fixed_chunks(const std::vector<nn::Parameter>& params, size_t n, size_t chunk);
// ranges[i] = [begin, end) with params_in[i] parameters; unit_of[k] the range of parameter k (-1: none).
BucketLayout unit_buckets(const std::vector<std::pair<size_t, size_t>>& ranges, const std::vector<int>& params_in,
                          const std::vector<int>& unit_of);

class BucketEngine {
 public:
  using Launch = std::function<void(size_t bucket)>;  // posts bucket's collective (sets its work)

  BucketEngine(BucketLayout layout, bool overlap, Launch launch);

  // The grad-ready hook of a syncing micro-step: counts parameter `param` in, launching (with overlap)
  // each bucket it completes. The first call of a step opens the backward window.
  void on_grad_ready(size_t param);
  // End of backward: launches every bucket not launched yet (when `launch_rest`), then waits for all,
  // records the step's overlap, and resets the buckets for the next step. Rethrows a failed collective.
  void finish(bool launch_rest, const std::function<void()>& before_wait = {});
  // Calls release(bucket) for each bucket whose collective has completed (all of them, waiting, when
  // `wait`) and whose gradients were not released yet; marks them released.
  void release_finished(bool wait, const std::function<void(const GradBucket&)>& release);

  std::vector<GradBucket>& buckets() { return buckets_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  const OverlapStats& last_overlap() const { return last_overlap_; }
  const OverlapStats& overlap_totals() const { return overlap_totals_; }
  const std::vector<BucketTiming>& timings() const { return timings_; }
  void reset_overlap_totals() { overlap_totals_ = OverlapStats{}; }
  // Waits for every outstanding collective, swallowing errors (destruction).
  void drain() noexcept;

 private:
  void launch(GradBucket& b);
  void record_overlap(int64_t window_end, int64_t sync_end);

  std::vector<GradBucket> buckets_;
  std::vector<std::pair<int, int>> of_param_;
  bool overlap_;
  Launch launch_;
  int64_t window_begin_ns_ = 0;
  std::vector<BucketTiming> timings_;  // sized once, like buckets_
  OverlapStats last_overlap_, overlap_totals_;
};

}  // namespace trident::parallel
