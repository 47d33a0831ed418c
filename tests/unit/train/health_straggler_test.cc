// Live straggler detection end to end: `trident train --nproc 3` on one host; after the health baseline
// (the first steps), rank 2 is throttled by SIGSTOP/SIGCONT bursts (100 ms stopped, 30 ms running, as a
// CPU-starved or swapping rank would be; a step computes for longer than one burst, so most steps wait for it). Rank 0's step records must name rank 2 as the straggler
// ("health": [{"kind": "straggler", "rank": 2, ...}]) and no other rank. The bursts stop as soon as it is
// named (at most 60 of them: about 10 s); the guards bound a hang, they assert no time.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "unit/launch/process_runner.h"

namespace {

using trident::testing::ProcessRunner;

// The health events in the JSON records of `out`.
std::vector<nlohmann::json> health_events(const std::string& out) {
  std::vector<nlohmann::json> events;
  for (const std::string& line : trident::testing::split_lines(out)) {
    if (line.find("\"health\"") == std::string::npos) continue;
    auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded() || !rec.contains("health")) continue;
    for (auto& e : rec["health"]) events.push_back(e);
  }
  return events;
}

size_t steps_logged(const std::string& out) {
  size_t n = 0;
  for (size_t at = out.find("\"type\":\"step\""); at != std::string::npos; at = out.find("\"type\":\"step\"", at + 1)) ++n;
  return n;
}

TEST(HealthStraggler, RankThrottledBySigstopBurstsIsNamed) {
  trident::testing::TempDir d;
  const std::string corpus = trident::testing::write_word_corpus(d.path);
  const int victim = 2;
  ProcessRunner job({TRIDENT_BIN, "train", "--data", corpus, "--out_dir", (d.path / "out").string(), "--n-layer", "4",
                     "--n-head", "2", "--n-embd", "64", "--block-size", "64", "--batch-size", "8", "--max-iters",
                     "1000000", "--eval-interval", "1000000", "--eval-iters", "1", "--sample-tokens", "0", "--threads",
                     "1", "--json", "--nproc", "3"},
                    trident::testing::make_env({}, {}));
  // Past the health baseline (3 warm-up + 10 baseline steps by default) before throttling.
  ASSERT_TRUE(job.read_until([&] { return steps_logged(job.out()) >= 16; }, 120)) << job.out() << job.err();
  pid_t pid = 0;
  for (auto [p, rank] : trident::testing::ranks_of(job.pid()))
    if (rank == victim) pid = p;
  ASSERT_GT(pid, 0) << "rank " << victim << " not found among the launcher's children";
  auto named = [&] {
    for (const auto& e : health_events(job.out()))
      if (e.value("kind", "") == "straggler") return true;
    return false;
  };
  int bursts = 0;
  for (; bursts < 60 && !named(); ++bursts) {
    ASSERT_EQ(::kill(pid, SIGSTOP), 0);
    job.read_until([] { return false; }, 0.1);
    ASSERT_EQ(::kill(pid, SIGCONT), 0);
    job.read_until(named, 0.03);
  }
  // A record or two more, then end the job (it trains until killed).
  job.read_until([&] { return false; }, 0.3);
  const auto events = health_events(job.out());
  std::string all;
  for (const auto& e : events) all += e.dump() + "\n";
  int straggler_events = 0;
  for (const auto& e : events) {
    if (e.value("kind", "") != "straggler") continue;
    ++straggler_events;
    EXPECT_EQ(e.value("rank", -1), victim) << all;
    EXPECT_GT(e.value("late_ms", 0.0), 0.0) << all;
    EXPECT_NE(e.value("message", "").find(fmt::format("rank {} arrives", victim)), std::string::npos) << all;
  }
  EXPECT_GE(straggler_events, 1) << "rank " << victim << " was not named after " << bursts << " bursts:\n"
                                 << all << job.err();
  for (const auto& e : events) EXPECT_NE(e.value("kind", ""), "slow_link") << all;  // one host: no TCP link
}

}  // namespace
