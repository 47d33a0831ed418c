// The kernels' thread pool (thread_pool.h).
//
// One job at a time. The caller publishes the job (function, context, task count, next = 0), opens the
// gate and bumps the epoch (waking sleeping workers). A worker registers on the gate (a count of users,
// only while the gate is open), claims tasks from `next` until none is left, and deregisters. The caller
// takes tasks as well, then closes the gate and waits until no worker is registered: after that no worker
// can touch the job, so the caller may return (the job lives on its stack) and publish the next one.
// Waiting is a short spin, then a futex.
#include "trident/kernels/cpu/thread_pool.h"

#include "trident/kernels/cpu/ops.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cblas.h>

namespace trident::kernels::cpu {
namespace {

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Spins up to `budget` for pred() to hold; false when it did not.
template <class Pred>
bool spin_until(Pred pred, std::chrono::microseconds budget) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() - start > budget) return pred();
  }
}

// How long an idle worker, and a caller waiting for the last tasks, spin before sleeping: long enough to
// catch the next kernel of a training step without a wake-up, short enough that two cores shared with
// other processes are not held by idle threads.
constexpr std::chrono::microseconds kWorkerSpin{50};
constexpr std::chrono::microseconds kCallerSpin{100};

constexpr uint32_t kOpen = 1u << 31;

int affinity_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
  return 1;
}

thread_local bool t_in_task = false;

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    stop_.store(true);
    epoch_.fetch_add(1);
    futex_wake_all(&epoch_);
    for (auto& t : threads_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int workers() const { return static_cast<int>(threads_.size()); }

  // False when another job is running (the caller then runs its tasks itself).
  bool try_run(int64_t n, detail::TaskFn fn, void* ctx) {
    std::unique_lock<std::mutex> lock(call_mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    error_ = nullptr;
    next_.store(0);
    gate_.store(kOpen);
    epoch_.fetch_add(1);
    if (sleepers_.load() > 0) futex_wake_all(&epoch_);
    run_tasks();
    gate_.fetch_and(~kOpen);
    if (!spin_until([this] { return gate_.load() == 0; }, kCallerSpin)) {
      caller_sleeping_.store(true);
      for (uint32_t g = gate_.load(); g != 0; g = gate_.load()) futex_wait(&gate_, g);
      caller_sleeping_.store(false);
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void run_tasks() {
    t_in_task = true;
    for (int64_t t = next_.fetch_add(1); t < n_; t = next_.fetch_add(1)) {
      try {
        fn_(ctx_, t);
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    t_in_task = false;
  }

  void work() {
    // The epoch the pool was made with: a worker that starts late still sees every later job and stop.
    uint32_t seen = 0;
    for (;;) {
      if (!spin_until([&] { return epoch_.load() != seen; }, kWorkerSpin)) {
        sleepers_.fetch_add(1);
        while (epoch_.load() == seen) futex_wait(&epoch_, seen);
        sleepers_.fetch_sub(1);
      }
      seen = epoch_.load();
      if (stop_.load()) return;
      uint32_t g = gate_.load();
      bool joined = false;
      while ((g & kOpen) != 0 && !(joined = gate_.compare_exchange_weak(g, g + 1))) {
      }
      if (!joined) continue;
      run_tasks();
      if (gate_.fetch_sub(1) == 1 && caller_sleeping_.load()) futex_wake_all(&gate_);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex call_mu_;  // one job at a time
  // The job: written by the caller before the gate opens, read by registered workers.
  detail::TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::mutex error_mu_;
  std::exception_ptr error_;
  // kOpen while workers may join, plus the number of workers registered on the job.
  std::atomic<uint32_t> gate_{0};
  std::atomic<uint32_t> epoch_{0};  // bumped per job; idle workers sleep on it
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
};

std::atomic<int> g_threads{0};  // 0: affinity_cpus(), read once (g_default)
std::atomic<int> g_default{0};
Pool* g_pool = nullptr;  // workers for num_threads() - 1; made on first use
std::mutex g_pool_mu;

// In a fork()ed child the workers do not exist: forget the parent's pool (its memory is leaked, the
// threads cannot be joined) and make a new one on first use. The pool's lock is held across fork() so
// the child never inherits it locked by a thread it does not have.
void lock_pool() { g_pool_mu.lock(); }
void unlock_pool() { g_pool_mu.unlock(); }
void forget_pool_in_child() {
  g_pool = nullptr;
  g_pool_mu.unlock();
}
[[maybe_unused]] const int g_atfork = pthread_atfork(lock_pool, unlock_pool, forget_pool_in_child);
// trident splits the work itself; OpenBLAS (the GEMMs below ISA level avx512) runs inside its tasks.
[[maybe_unused]] const bool g_blas_one_thread = (openblas_set_num_threads(1), true);

Pool* pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  const int want = num_threads() - 1;
  if (g_pool != nullptr && g_pool->workers() == want) return g_pool;
  delete g_pool;
  g_pool = want > 0 ? new Pool(want) : nullptr;
  return g_pool;
}

}  // namespace

void set_num_threads(int n) {
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    g_threads.store(n > 0 ? n : 0);
    if (n <= 0) g_default.store(affinity_cpus());
  }
}

int num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  int d = g_default.load(std::memory_order_relaxed);
  if (d == 0) g_default.store(d = affinity_cpus());
  return d;
}

namespace detail {
namespace {
std::atomic<int> g_divisor{1};
}
void set_task_size_divisor(int d) { g_divisor.store(d > 1 ? d : 1); }
int task_size_divisor() { return g_divisor.load(std::memory_order_relaxed); }

void parallel_for_impl(int64_t n, TaskFn fn, void* ctx) {
  if (!t_in_task && num_threads() > 1) {
    Pool* p = pool();
    if (p != nullptr && p->try_run(n, fn, ctx)) return;
  }
  for (int64_t t = 0; t < n; ++t) fn(ctx, t);
}
}  // namespace detail

}  // namespace trident::kernels::cpu
