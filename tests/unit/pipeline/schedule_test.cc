// Pipeline schedules as data: completeness and ordering of every generator, FIFO consistency of the
// messages they imply, in-flight microbatches (activation memory), and the bubble of an event-driven
// replay against the closed forms (GPipe/1F1B: (P-1)/(m+P-1) of the makespan, (P-1)/m of the ideal time;
// interleaved: (P-1)/(v m) of the ideal time), plus deadlock detection.
#include <gtest/gtest.h>

#include <string>

#include "trident/core/error.h"
#include "trident/parallel/schedule.h"

namespace trident::parallel {
namespace {

constexpr double kEps = 1e-12;

TEST(Schedule, ParseNamesAndErrors) {
  EXPECT_EQ(parse_schedule("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(parse_schedule("1f1b"), ScheduleKind::k1F1B);
  EXPECT_EQ(parse_schedule("interleaved"), ScheduleKind::kInterleaved);
  try {
    parse_schedule("zero-bubble");
    FAIL() << "accepted an unknown schedule";
  } catch (const InvalidArgument& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("zero-bubble"), std::string::npos) << w;
    EXPECT_NE(w.find("gpipe, 1f1b, interleaved"), std::string::npos) << w;
  }
}

TEST(Schedule, ArgumentValidation) {
  EXPECT_THROW(make_schedule(ScheduleKind::kGPipe, 0, 4, 1), InvalidArgument);
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 2, 0, 1), InvalidArgument);
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved, 2, 4, 0), InvalidArgument);
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 2, 4, 2), InvalidArgument);
  EXPECT_THROW(make_schedule(ScheduleKind::kGPipe, 2, 4, 2), InvalidArgument);
  try {
    make_schedule(ScheduleKind::kInterleaved, 4, 6, 2);
    FAIL() << "accepted m % P != 0";
  } catch (const InvalidArgument& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("--microbatches 4 or 8"), std::string::npos) << w;
  }
  try {
    make_schedule(ScheduleKind::kInterleaved, 4, 3, 2);
    FAIL() << "accepted m < P";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--microbatches 4"), std::string::npos) << e.what();
  }
}

struct Cfg {
  ScheduleKind kind;
  int P, m, v;
};

std::vector<Cfg> all_configs() {
  std::vector<Cfg> out;
  for (int P : {1, 2, 3, 4, 5, 8})
    for (int m : {1, 2, 3, 4, 6, 8, 16}) {
      out.push_back({ScheduleKind::kGPipe, P, m, 1});
      out.push_back({ScheduleKind::k1F1B, P, m, 1});
      for (int v : {1, 2, 3, 4})
        if (m % P == 0) out.push_back({ScheduleKind::kInterleaved, P, m, v});
    }
  return out;
}

std::string name(const Cfg& c) {
  return std::string(schedule_name(c.kind)) + " P=" + std::to_string(c.P) + " m=" + std::to_string(c.m) +
         " v=" + std::to_string(c.v);
}

TEST(Schedule, EveryActionOnceBackwardAfterForwardFifoConsistent) {
  for (const Cfg& c : all_configs()) {
    SCOPED_TRACE(name(c));
    Schedule s = make_schedule(c.kind, c.P, c.m, c.v);
    ASSERT_EQ(static_cast<int>(s.size()), c.P);
    for (const auto& r : s) EXPECT_EQ(r.size(), static_cast<size_t>(2 * c.m * c.v));
    EXPECT_NO_THROW(check_schedule(s, c.P, c.m, c.v));
    EXPECT_NO_THROW(check_fifo_order(s, c.P, c.v));
    EXPECT_NO_THROW(check_schedule(forward_only(s), c.P, c.m, c.v, false));
    // Completes (no deadlock) under any durations.
    EXPECT_NO_THROW(replay(s, c.P, c.v, ReplayTimes{{1.0}, {2.0}, 0.1}));
  }
}

TEST(Schedule, CheckScheduleCatchesBrokenLists) {
  Schedule s = make_schedule(ScheduleKind::k1F1B, 3, 4, 1);
  Schedule dup = s;
  dup[1][2] = dup[1][1];
  EXPECT_THROW(check_schedule(dup, 3, 4, 1), InvalidArgument);
  Schedule early = s;
  std::swap(early[2][0], early[2][1]);  // rank 2 (last): F0 B0 ... -> B0 F0
  EXPECT_THROW(check_schedule(early, 3, 4, 1), InvalidArgument);
  Schedule missing = s;
  missing[0].pop_back();
  EXPECT_THROW(check_schedule(missing, 3, 4, 1), InvalidArgument);
}

TEST(Schedule, GPipeAndOneFOneBByHand) {
  // 1F1B, P = 3, m = 4, rank 0: warm-up 2 forwards, then steady 1F1B, then cool-down.
  Schedule s = make_schedule(ScheduleKind::k1F1B, 3, 4, 1);
  std::vector<Action> r0 = {{Action::kForward, 0, 0}, {Action::kForward, 0, 1}, {Action::kForward, 0, 2},
                            {Action::kBackward, 0, 0}, {Action::kForward, 0, 3}, {Action::kBackward, 0, 1},
                            {Action::kBackward, 0, 2}, {Action::kBackward, 0, 3}};
  EXPECT_EQ(s[0], r0);
  std::vector<Action> r2 = {{Action::kForward, 0, 0}, {Action::kBackward, 0, 0}, {Action::kForward, 0, 1},
                            {Action::kBackward, 0, 1}, {Action::kForward, 0, 2}, {Action::kBackward, 0, 2},
                            {Action::kForward, 0, 3}, {Action::kBackward, 0, 3}};
  EXPECT_EQ(s[2], r2);
  Schedule g = make_schedule(ScheduleKind::kGPipe, 2, 2, 1);
  std::vector<Action> g0 = {{Action::kForward, 0, 0}, {Action::kForward, 0, 1}, {Action::kBackward, 0, 0},
                            {Action::kBackward, 0, 1}};
  EXPECT_EQ(g[0], g0);
  EXPECT_EQ(g[1], g0);
}

TEST(Schedule, InterleavedMatchesMegatronOrder) {
  // P = 2, v = 2, m = 4: Megatron's chunk/microbatch order k -> (chunk (k%4)/2, mb (k/4)*2 + k%2);
  // rank 0 warm-up = (P-0-1)*2 + (v-1)*P = 4 forwards, rank 1: 2.
  Schedule s = make_schedule(ScheduleKind::kInterleaved, 2, 4, 2);
  auto F = [](int c, int mb) { return Action{Action::kForward, c, mb}; };
  auto B = [](int c, int mb) { return Action{Action::kBackward, c, mb}; };
  std::vector<Action> r0 = {F(0, 0), F(0, 1), F(1, 0), F(1, 1), F(0, 2), B(1, 0), F(0, 3), B(1, 1),
                            F(1, 2), B(0, 0), F(1, 3), B(0, 1), B(1, 2), B(1, 3), B(0, 2), B(0, 3)};
  EXPECT_EQ(s[0], r0);
  std::vector<Action> r1 = {F(0, 0), F(0, 1), F(1, 0), B(1, 0), F(1, 1), B(1, 1), F(0, 2), B(0, 0),
                            F(0, 3), B(0, 1), F(1, 2), B(1, 2), F(1, 3), B(1, 3), B(0, 2), B(0, 3)};
  EXPECT_EQ(s[1], r1);
}

TEST(Schedule, InFlightMicrobatches) {
  for (int P : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      SCOPED_TRACE("P=" + std::to_string(P) + " m=" + std::to_string(m));
      Schedule f = make_schedule(ScheduleKind::k1F1B, P, m, 1);
      Schedule g = make_schedule(ScheduleKind::kGPipe, P, m, 1);
      for (int p = 0; p < P; ++p) {
        EXPECT_EQ(max_in_flight(f[p]), std::min(m, P - p)) << "rank " << p;
        EXPECT_EQ(max_in_flight(g[p]), m) << "rank " << p;
      }
    }
}

// Uniform durations f (forward) and b (backward): GPipe and 1F1B take (m+P-1)(f+b), so the bubble is
// (P-1)/(m+P-1) of the makespan and (P-1)/m of the ideal time m(f+b), exactly.
TEST(Schedule, ReplayBubbleGPipeAnd1F1BExact) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B})
    for (int P : {1, 2, 3, 4, 5, 8})
      for (int m : {1, 2, 3, 4, 8, 16})
        for (auto [f, b] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}, std::pair{0.3, 0.7}}) {
          SCOPED_TRACE(std::string(schedule_name(k)) + " P=" + std::to_string(P) + " m=" + std::to_string(m) +
                       " f=" + std::to_string(f) + " b=" + std::to_string(b));
          Schedule s = make_schedule(k, P, m, 1);
          ReplayResult r = replay(s, P, 1, ReplayTimes{{f}, {b}, 0});
          EXPECT_NEAR(r.makespan, (m + P - 1) * (f + b), kEps);
          EXPECT_NEAR(r.bubble_fraction, double(P - 1) / (m + P - 1), kEps);
          EXPECT_NEAR(r.bubble_ratio, double(P - 1) / m, kEps);
          for (int p = 0; p < P; ++p) EXPECT_NEAR(r.busy[p], m * (f + b), kEps);
        }
}

// Interleaved with v chunks per rank, each chunk taking 1/v of a stage's time: Megatron's bubble/ideal
// ratio (P-1)/(v m). Exact for b = 2f (Megatron's assumption when it derives the warm-up length) and for
// b = f.
TEST(Schedule, ReplayBubbleInterleavedMegatronRatio) {
  for (int P : {2, 3, 4, 8})
    for (int mult : {1, 2, 4})
      for (int v : {2, 3, 4})
        for (double bf : {1.0, 2.0}) {
          int m = P * mult;
          SCOPED_TRACE("P=" + std::to_string(P) + " m=" + std::to_string(m) + " v=" + std::to_string(v) +
                       " b/f=" + std::to_string(bf));
          Schedule s = make_schedule(ScheduleKind::kInterleaved, P, m, v);
          double f = 1.0 / v, b = bf / v;
          ReplayResult r = replay(s, P, v, ReplayTimes{{f}, {b}, 0});
          EXPECT_NEAR(r.bubble_ratio, double(P - 1) / (v * m), 1e-9);
          double ideal = m * (1.0 + bf);
          EXPECT_NEAR(r.makespan, ideal * (1.0 + double(P - 1) / (v * m)), 1e-9);
        }
}

TEST(Schedule, ReplayLatencyAndPerStageTimes) {
  // GPipe P = 2, m = 1, latency L: F0(r0) [0,1], F0(r1) [1+L, 2+L], B0(r1) [2+L, 4+L], B0(r0) [4+2L, 6+2L].
  Schedule s = make_schedule(ScheduleKind::kGPipe, 2, 1, 1);
  ReplayResult r = replay(s, 2, 1, ReplayTimes{{1.0}, {2.0}, 0.25});
  EXPECT_NEAR(r.makespan, 6.5, kEps);
  EXPECT_NEAR(r.start[0][1], 4.5, kEps);
  // Per-stage times: the slowest stage sets the pace; its idle is the bubble.
  Schedule g = make_schedule(ScheduleKind::k1F1B, 2, 4, 1);
  ReplayResult q = replay(g, 2, 1, ReplayTimes{{1.0, 3.0}, {1.0, 3.0}, 0});
  EXPECT_NEAR(q.busy[0], 8, kEps);
  EXPECT_NEAR(q.busy[1], 24, kEps);
  EXPECT_NEAR(q.makespan, 1 + 24 + 1, kEps);  // r0's first forward, r1 busy throughout, r0's last backward
  EXPECT_NEAR(q.bubble_fraction, 1 - 24.0 / 26.0, kEps);
}

TEST(Schedule, ReplayDetectsDeadlock) {
  // Rank 0 runs F0 B1 F1 B0: B1 needs rank 1's B1, which needs F1 of rank 1, which needs rank 0's F1, which
  // rank 0 runs only after B1: a cycle.
  Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 2, 1);
  s[0] = {{Action::kForward, 0, 0}, {Action::kBackward, 0, 1}, {Action::kForward, 0, 1}, {Action::kBackward, 0, 0}};
  try {
    replay(s, 2, 1, ReplayTimes{});
    FAIL() << "deadlock not detected";
  } catch (const InvalidArgument& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("deadlock"), std::string::npos) << w;
    EXPECT_NE(w.find("rank 0 at B(c0,mb1)"), std::string::npos) << w;
  }
  // Cross-rank cycle: rank 0 runs B0 first (needs rank 1's B0, which needs rank 0's F0).
  Schedule c = make_schedule(ScheduleKind::kGPipe, 2, 1, 1);
  std::swap(c[0][0], c[0][1]);
  EXPECT_THROW(replay(c, 2, 1, ReplayTimes{}), InvalidArgument);
}

}  // namespace
}  // namespace trident::parallel
