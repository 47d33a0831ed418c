// The health detector (train/health.h) on synthetic counter series: a link whose bandwidth drops is named
// after the configured number of bad steps, with the step the drop began and its ratio, and only that link;
// a rank that arrives late is named with its lateness and the fraction of collectives; noise (jitter, lone
// dips, a rank late once in a while) names nothing. Also the options' validation.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <random>

#include "trident/core/error.h"
#include "trident/train/health.h"

namespace trident {
namespace {

std::vector<std::string> names(int n) {
  std::vector<std::string> v;
  for (int r = 0; r < n; ++r) v.push_back(fmt::format("h{}/rank {}", r, r));
  return v;
}

// A ring of n links r -> r+1, each carrying 4 MiB a step at about 1 GB/s (jitter +-`jitter`), link
// (slow_src -> slow_src+1) at `factor` x from step `from` to step `to` (exclusive).
HealthSample ring_step(int64_t step, int n, std::mt19937& rng, double jitter, int slow_src, double factor, int64_t from,
                       int64_t to) {
  std::uniform_real_distribution<double> u(1 - jitter, 1 + jitter);
  HealthSample s;
  s.step = step;
  for (int r = 0; r < n; ++r) {
    const uint64_t bytes = 4 << 20;
    double bw = 1.0 * u(rng);  // bytes per ns
    if (r == slow_src && step >= from && step < to) bw *= factor;
    s.links.push_back({r, (r + 1) % n, bytes, static_cast<uint64_t>(static_cast<double>(bytes) / bw)});
  }
  return s;
}

TEST(HealthDetector, NamesTheSlowLinkAfterTheBadStepsAndItsRecovery) {
  HealthOptions o;  // defaults: 6 bad of 8, ratio 0.5, warm-up 3, baseline 10
  HealthDetector d(o, names(5));
  std::mt19937 rng(7);
  std::vector<std::pair<int64_t, HealthEvent>> events;
  for (int64_t step = 0; step < 80; ++step)
    for (auto& e : d.add(ring_step(step, 5, rng, 0.2, 2, 0.4, 30, 50))) events.emplace_back(step, e);
  ASSERT_EQ(events.size(), 2u);
  const auto& [at, slow] = events[0];
  EXPECT_EQ(slow.kind, HealthEvent::Kind::kSlowLink);
  EXPECT_EQ(slow.src, 2);
  EXPECT_EQ(slow.dst, 3);
  EXPECT_EQ(slow.since_step, 30);
  EXPECT_EQ(at, 30 + o.bad_steps - 1);  // the sixth bad step
  EXPECT_NEAR(slow.ratio, 0.4, 0.12);
  EXPECT_EQ(slow.message, fmt::format("link h2/rank 2 -> h3/rank 3 at {:.2f}x its bandwidth since step 30", slow.ratio));
  EXPECT_EQ(events[1].second.kind, HealthEvent::Kind::kLinkRecovered);
  EXPECT_EQ(events[1].second.src, 2);
  EXPECT_EQ(events[1].first, 50 + o.bad_steps - 1);
}

TEST(HealthDetector, JitterAndLoneDipsNameNothing) {
  HealthOptions o;
  for (int n : {2, 3, 8}) {
    HealthDetector d(o, names(n));
    std::mt19937 rng(11 + n);
    for (int64_t step = 0; step < 400; ++step) {
      HealthSample s = ring_step(step, n, rng, 0.35, -1, 1, 0, 0);
      // Every 4th step one link (rotating) drops to a fifth: bad steps, but never 6 of 8 on one link.
      if (step % 4 == 0) s.links[(step / 4) % n].ns *= 5;
      EXPECT_EQ(d.add(s).size(), 0u) << "n " << n << " step " << step;
    }
  }
}

TEST(HealthDetector, FewerBadStepsThanConfiguredNameNothing) {
  HealthOptions o;
  HealthDetector d(o, names(3));
  std::mt19937 rng(3);
  for (int64_t step = 0; step < 60; ++step) {
    // 5 bad steps in a row (one fewer than bad_steps), then healthy again.
    EXPECT_EQ(d.add(ring_step(step, 3, rng, 0.1, 0, 0.2, 30, 35)).size(), 0u) << step;
  }
}

TEST(HealthDetector, SmallTransfersAreNotJudged) {
  HealthOptions o;
  HealthDetector d(o, names(2));
  for (int64_t step = 0; step < 60; ++step) {
    HealthSample s;
    s.step = step;
    const uint64_t bytes = o.min_bytes - 1;  // below the floor: latency, not bandwidth
    s.links.push_back({0, 1, bytes, step < 20 ? bytes : bytes * 100});
    EXPECT_EQ(d.add(s).size(), 0u);
  }
}

// n ranks, `per_step` collectives a step of ~10 ms each; from step `from`, rank `late` arrives 180 ms late at
// the first `late_at` collectives of every step (the others wait for it: their time inside grows).
HealthSample collectives_step(int64_t step, int n, int per_step, std::mt19937& rng, int late, int late_at,
                              int64_t from) {
  std::uniform_real_distribution<double> jitter(0, 0.008);
  HealthSample s;
  s.step = step;
  for (int c = 0; c < per_step; ++c) {
    std::vector<double> arrive(n), times(n);
    for (int r = 0; r < n; ++r) arrive[r] = jitter(rng);
    if (late >= 0 && step >= from && c < late_at) arrive[late] += 0.18;
    const double leave = *std::max_element(arrive.begin(), arrive.end()) + 0.01;
    for (int r = 0; r < n; ++r) times[r] = leave - arrive[r];
    s.collective_s.push_back(times);
  }
  return s;
}

TEST(HealthDetector, NamesTheLateRankWithItsLatenessAndFraction) {
  HealthOptions o;
  for (int n : {2, 3, 5}) {
    HealthDetector d(o, names(n));
    std::mt19937 rng(5 + n);
    std::vector<std::pair<int64_t, HealthEvent>> events;
    const int late = n - 1;
    for (int64_t step = 0; step < 40; ++step)
      for (auto& e : d.add(collectives_step(step, n, 4, rng, late, 3, 20))) events.emplace_back(step, e);
    ASSERT_EQ(events.size(), 1u) << "n " << n << ": " << (events.empty() ? "" : events[0].second.message);
    const HealthEvent& e = events[0].second;
    EXPECT_EQ(e.kind, HealthEvent::Kind::kStraggler);
    EXPECT_EQ(e.src, late);
    EXPECT_EQ(e.since_step, 20);
    EXPECT_EQ(events[0].first, 20 + o.bad_steps - 1);
    EXPECT_NEAR(e.late_ms, 180, 12);
    EXPECT_NEAR(e.late_fraction, 0.75, 1e-9);
    EXPECT_EQ(e.message, fmt::format("h{}/rank {} arrives {:.0f} ms late at 75% of collectives since step 20", late,
                                     late, e.late_ms));
  }
}

TEST(HealthDetector, ARankLateOnceInAWhileIsNotAStraggler) {
  HealthOptions o;
  HealthDetector d(o, names(3));
  std::mt19937 rng(9);
  for (int64_t step = 0; step < 300; ++step) {
    // Every 3rd step (a checkpoint, an evaluation) rank 0 arrives 180 ms late once: 3 bad steps in 8 at most.
    HealthSample s = collectives_step(step, 3, 4, rng, step % 3 == 0 ? 0 : -1, 1, 0);
    EXPECT_EQ(d.add(s).size(), 0u) << step;
  }
}

TEST(HealthOptions, FromEnvValidatesEachVariable) {
  HealthOptions o = HealthOptions::from_env();
  EXPECT_TRUE(o.enabled);
  EXPECT_DOUBLE_EQ(o.bandwidth_ratio, 0.5);
  EXPECT_DOUBLE_EQ(o.late_s, 0.05);
  EXPECT_FALSE(o.shm_links);
  struct Bad {
    const char* name;
    const char* value;
  };
  for (Bad b : {Bad{"TRIDENT_HEALTH_BANDWIDTH", "1.5"}, Bad{"TRIDENT_HEALTH_BANDWIDTH", "half"},
                Bad{"TRIDENT_HEALTH_LATE", "0"}, Bad{"TRIDENT_HEALTH_WINDOW", "0"},
                Bad{"TRIDENT_HEALTH_BAD_STEPS", "9"}, Bad{"TRIDENT_HEALTH_LINKS", "rdma"}}) {
    ::setenv(b.name, b.value, 1);
    try {
      HealthOptions::from_env();
      ADD_FAILURE() << b.name << "=" << b.value << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(b.name), std::string::npos) << e.what();
    }
    ::unsetenv(b.name);
  }
  ::setenv("TRIDENT_HEALTH_LINKS", "all", 1);
  ::setenv("TRIDENT_HEALTH_LATE", "200ms", 1);
  o = HealthOptions::from_env();
  EXPECT_TRUE(o.shm_links);
  EXPECT_DOUBLE_EQ(o.late_s, 0.2);
  ::unsetenv("TRIDENT_HEALTH_LINKS");
  ::unsetenv("TRIDENT_HEALTH_LATE");
}

}  // namespace
}  // namespace trident
