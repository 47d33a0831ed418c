// Stamps: a clock for hot paths that record many events and read few of them back (the flight recorder
// stamps every collective three times). now() is the CPU's time-stamp counter where it ticks at a constant
// rate on every core (x86-64 with constant_tsc and nonstop_tsc: one rdtsc, about 11 ns on a kvm-clock VM
// where clock_gettime(CLOCK_MONOTONIC) takes about 30), else CLOCK_MONOTONIC in nanoseconds. A stamp means
// nothing by itself: to_ns() turns it into CLOCK_MONOTONIC nanoseconds (Timeline::now_ns's clock), from
// anchor pairs (stamp, CLOCK_MONOTONIC) taken at most once a second by a caller of now_anchored() and once
// per conversion, interpolated between the two that surround the stamp (so NTP's slewing of
// CLOCK_MONOTONIC is followed to within the anchors' spacing). Differences of stamps are durations in ticks;
// convert the ends, not the difference.
//
// Thread-safety: every function may be called from any thread. Blocking: now() never blocks or allocates;
// now_anchored() and the conversions take a process-wide mutex (now_anchored() only with try_lock, once a
// second). Anchors older than the last 4096 (about an hour of steady calls) are dropped; stamps from before
// the oldest anchor kept are extrapolated from it.
#pragma once

#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace trident::stamp_clock {

namespace detail {
extern std::atomic<int64_t> g_next_anchor;  // now_anchored() takes an anchor once now() passes this stamp
bool tsc_in_use_init();
int64_t monotonic_ns();
void take_anchor(int64_t stamp);
inline bool tsc_in_use() {
  static const bool on = tsc_in_use_init();
  return on;
}
}  // namespace detail

// True where now() reads the time-stamp counter (false: CLOCK_MONOTONIC nanoseconds).
inline bool uses_tsc() { return detail::tsc_in_use(); }

inline int64_t now() {
#if defined(__x86_64__)
  if (detail::tsc_in_use()) return static_cast<int64_t>(__rdtsc());
#endif
  return detail::monotonic_ns();
}

// now(), and an anchor for to_ns() when the last one is over a second old: for the first stamp of each
// call, so that a busy process keeps its anchors fresh at no cost beyond one relaxed load.
inline int64_t now_anchored() {
  const int64_t t = now();
  if (t >= detail::g_next_anchor.load(std::memory_order_relaxed)) detail::take_anchor(t);
  return t;
}

// CLOCK_MONOTONIC nanoseconds of a stamp (0 stays 0: "no stamp").
int64_t to_ns(int64_t stamp);
// The stamp of a CLOCK_MONOTONIC time (for an event timed by Timeline::now_ns; 0 stays 0).
int64_t from_ns(int64_t ns);
// Stamps per second (1e9 without the time-stamp counter), from the anchors (a first estimate until two
// anchors are a second apart).
double ticks_per_second();

}  // namespace trident::stamp_clock
