// Per-process timeline of compute and communication spans, for profiling (Chrome traces, pipeline bubble
// and communication share: parallel/profile.h turns them into reports and one trace file per job).
//
// Recording is off until enable(true); a disabled timeline costs one relaxed load per compute or idle span.
// Spans carry monotonic nanoseconds (now_ns(), CLOCK_MONOTONIC: comparable across processes on one host).
//
// Waits: every kComm span, recorded or not, also adds its duration to its thread's wait totals
// (take_thread_waits()): the trainer splits a step's time by what its own thread waited on. A pipeline
// transfer (a span named "send_*"/"recv_*", as the pipeline engine names its waits) counts as a pipeline
// wait, any other kComm span as a collective wait; only the outermost of nested kComm spans counts.
// Ownership: timeline() is a process-wide singleton. Thread-safety: add() may be called from any thread
// (a mutex guards the span list); spans() returns a copy. No blocking beyond that mutex, no timeouts.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace trident {

enum class SpanKind : uint8_t { kCompute = 0, kComm = 1, kIdle = 2 };
const char* span_kind_name(SpanKind k);  // "compute" | "comm" | "idle"

struct Span {
  SpanKind kind = SpanKind::kCompute;
  std::string name;     // e.g. "forward", "backward", "all_reduce(tp)", "send_act", "recv_grad"
  int64_t t0_ns = 0;
  int64_t t1_ns = 0;
  int microbatch = -1;  // -1 when not tied to one
  int chunk = -1;       // model chunk (virtual stage) or -1
  double bytes = 0;     // communication spans: bytes moved by this rank
};

class Timeline {
 public:
  static int64_t now_ns();
  void enable(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void add(Span s);
  std::vector<Span> spans() const;
  void clear();

 private:
  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  std::vector<Span> spans_;
};

Timeline& timeline();

// What the calling thread waited in kComm spans since its last take_thread_waits() (which zeroes them).
struct ThreadWaits {
  int64_t collective_ns = 0;  // collectives (all-reduce, all-gather, ...) the thread blocked in
  int64_t pipeline_ns = 0;    // pipeline sends and receives the thread blocked on
};
ThreadWaits take_thread_waits();

// Records [construction, destruction) as one span when the timeline is enabled.
class ScopedSpan {
 public:
  ScopedSpan(SpanKind kind, const char* name, int microbatch = -1, int chunk = -1, double bytes = 0);
  ~ScopedSpan();
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  bool on_;
  bool comm_ = false;         // a kComm span (it holds one level of its thread's nesting)
  bool counts_wait_ = false;  // the outermost kComm span of its thread: its duration is a wait
  bool pipeline_ = false;     // a pipeline transfer's wait rather than a collective's
  int64_t wait_t0_ns_ = 0;
  Span span_;
};

}  // namespace trident
