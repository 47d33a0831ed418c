// The CPU kernels' own threads: a persistent pool that runs a parallel-for over tasks (GEMM tiles, heads,
// row and element chunks). Ownership: one process-wide pool of num_threads() - 1 workers; the calling
// thread takes tasks too. Blocking: parallel_for returns when every task has run. Workers spin briefly
// (tens of microseconds) after a job, then sleep on a futex: they never busy-wait while idle.
// Thread-safety: parallel_for may be called from any thread; while one caller runs a job, another caller
// (or a task that calls parallel_for itself) runs its tasks serially on its own thread. set_num_threads
// must not race kernel calls. A fork()ed child starts with no workers and makes new ones when needed.
// Errors: the first exception a task throws is rethrown by parallel_for after all tasks have finished.
// No timeouts: tasks are bounded computations.
//
// Determinism: callers split work by the problem's shape only, never by the thread count, and each
// output element is computed by one task with a fixed order of operations, so results are bitwise the
// same for any number of threads.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace trident::kernels::cpu {

// The thread count is set with set_num_threads (ops.h).

namespace detail {
// Testability knob: every task size (GEMM FLOPs per tile, elements and rows per chunk) is divided by it,
// so small tests reach many-task splits. 1 outside tests; values below 1 read as 1.
void set_task_size_divisor(int d);
int task_size_divisor();

using TaskFn = void (*)(void* ctx, int64_t task);
void parallel_for_impl(int64_t n, TaskFn fn, void* ctx);
}  // namespace detail

// Runs f(task) for every task in [0, n), spread over the pool (in any order, on any thread).
template <class F>
void parallel_for(int64_t n, F&& f) {
  if (n <= 0) return;
  if (n == 1) {
    f(int64_t{0});
    return;
  }
  using Fn = std::remove_reference_t<F>;
  detail::parallel_for_impl(
      n, [](void* ctx, int64_t t) { (*static_cast<Fn*>(ctx))(t); }, const_cast<void*>(static_cast<const void*>(&f)));
}

// Runs f(begin, count) over [0, n) in chunks of `grain` items (the last one shorter; grain divided by
// the test knob): the chunks depend on n and grain alone.
template <class F>
void parallel_chunks(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  grain = grain / detail::task_size_divisor() > 0 ? grain / detail::task_size_divisor() : 1;
  if (grain <= 0 || grain >= n) {
    f(int64_t{0}, n);
    return;
  }
  parallel_for((n + grain - 1) / grain, [&](int64_t t) {
    const int64_t b = t * grain;
    f(b, n - b < grain ? n - b : grain);
  });
}

}  // namespace trident::kernels::cpu
