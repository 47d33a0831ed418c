// Stamps (core/stamp_clock.h): converted to CLOCK_MONOTONIC they agree with clock_gettime read beside them,
// keep their order, and round-trip through from_ns; threads that stamp at once agree with each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "trident/core/stamp_clock.h"
#include "trident/core/timeline.h"

namespace trident {
namespace {

// The smallest distance between a stamp's converted time and CLOCK_MONOTONIC read on either side of it,
// over `tries` reads (a preemption between the reads widens one try, not the smallest).
int64_t conversion_error_ns(int tries) {
  int64_t best = INT64_MAX;
  for (int i = 0; i < tries; ++i) {
    const int64_t before = Timeline::now_ns();
    const int64_t s = stamp_clock::now();
    const int64_t after = Timeline::now_ns();
    const int64_t ns = stamp_clock::to_ns(s);
    int64_t err = 0;
    if (ns < before) err = before - ns;
    if (ns > after) err = ns - after;
    best = std::min(best, err + (after - before));
  }
  return best;
}

TEST(StampClock, ConvertsToTheMonotonicClock) {
  std::printf("stamp clock: %s, %.4g stamps per second\n", stamp_clock::uses_tsc() ? "time-stamp counter" : "CLOCK_MONOTONIC",
              stamp_clock::ticks_per_second());
  // Stamps taken before a pause, converted after it: still within a few microseconds of the clock.
  std::vector<int64_t> stamps, clocks;
  for (int i = 0; i < 5; ++i) {
    const int64_t c0 = Timeline::now_ns();
    stamps.push_back(stamp_clock::now_anchored());
    clocks.push_back(c0);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  for (size_t i = 0; i < stamps.size(); ++i) {
    const int64_t ns = stamp_clock::to_ns(stamps[i]);
    // A stamp read after clocks[i]: its time is not earlier than that (less the anchors' error, a few us).
    EXPECT_GE(ns, clocks[i] - 20000) << "stamp " << i;
    if (i + 1 < stamps.size()) {
      EXPECT_LT(ns, clocks[i + 1]) << "stamp " << i << " after the next clock read";
    }
  }
  EXPECT_LT(conversion_error_ns(200), 50000);
  EXPECT_EQ(stamp_clock::to_ns(0), 0);  // "no stamp" stays so
  EXPECT_EQ(stamp_clock::from_ns(0), 0);
}

TEST(StampClock, OrderAndRoundTrip) {
  int64_t prev_stamp = 0, prev_ns = 0;
  for (int i = 0; i < 200; ++i) {
    const int64_t s = stamp_clock::now();
    ASSERT_GE(s, prev_stamp);
    const int64_t ns = stamp_clock::to_ns(s);
    ASSERT_GE(ns, prev_ns) << "conversion out of order at " << i;
    // ns -> stamp -> ns loses at most a few nanoseconds to rounding.
    EXPECT_LE(std::abs(stamp_clock::to_ns(stamp_clock::from_ns(ns)) - ns), 4);
    prev_stamp = s;
    prev_ns = ns;
  }
}

// Stamps of different threads (on any core) order as their events do: each thread stamps after it sees the
// previous thread's stamp.
TEST(StampClock, ThreadsAgree) {
  constexpr int kRounds = 200;
  std::atomic<int64_t> last{0};
  std::atomic<int> turn{0};
  std::atomic<int> backwards{0};
  auto body = [&](int me) {
    for (int r = 0; r < kRounds; ++r) {
      while (turn.load(std::memory_order_acquire) % 2 != me) std::this_thread::yield();
      const int64_t seen = last.load(std::memory_order_acquire);
      const int64_t s = stamp_clock::now();
      if (s < seen) backwards.fetch_add(1);
      last.store(s, std::memory_order_release);
      turn.fetch_add(1, std::memory_order_acq_rel);
    }
  };
  std::thread a(body, 0), b(body, 1);
  a.join();
  b.join();
  EXPECT_EQ(backwards.load(), 0);
}

}  // namespace
}  // namespace trident
