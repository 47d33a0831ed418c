// Per-process timeline of compute and communication spans, for profiling (Chrome traces, pipeline bubble
// and communication share: parallel/profile.h turns them into reports and one trace file per job).
//
// Recording is off until enable(true); a disabled timeline costs one relaxed load per span. Spans carry
// monotonic nanoseconds (now_ns(), CLOCK_MONOTONIC: comparable across processes on one host).
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

// Records [construction, destruction) as one span when the timeline is enabled.
class ScopedSpan {
 public:
  ScopedSpan(SpanKind kind, const char* name, int microbatch = -1, int chunk = -1, double bytes = 0);
  ~ScopedSpan();
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  bool on_;
  Span span_;
};

}  // namespace trident
