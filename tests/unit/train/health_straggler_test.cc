// Live straggler detection end to end: `trident train --nproc 3` on one host. The run first trains
// unthrottled past the health baseline (3 warm-up + 10 baseline steps by default) and a whole judged window
// more: nothing may be named. Then rank 2 is throttled by SIGSTOP/SIGCONT bursts paced by the steps: after
// each step record of rank 0, rank 2 (by then computing its next step) is stopped for 150 ms, as a
// CPU-starved or swapping rank would be. Rank 0's step records must then name rank 2 as the straggler
// ("health": [{"kind": "straggler", "rank": 2, ...}]) and no other rank.
//
// The bursts follow the steps rather than a clock: the detector judges steps (a rank is a straggler when it
// makes the others wait in most steps of its window; late once every few steps, as at a checkpoint, is not),
// and bursts on a fixed clock (100 ms stopped, 30 ms running) put one stop into every third step whenever a
// step is short against the running slice, which never names anyone. Paced by the steps, every step holds
// one stop whatever the step time or the machine's load. The bursts stop as soon as rank 2 is named (at most
// 40 of them); the guards bound a hang, they assert no time.
//
// The same run's unthrottled step records also carry where each rank's step went ("time_ms_ranks": compute,
// comm, bubble, data, optimizer): checked against the step time each rank measured. The run is ZeRO-1, so
// a collective is also waited on inside the optimizer's segment (the parameters' all-gather).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
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

// The step-time split of every step record in `out` after the first (which carries start-up): each part
// >= 0, the parts adding up to the rank's step time, the writer's step time the one its tokens/s says and
// within the wall time between its record and the previous one (the "elapsed" clock), and on 3 ranks some
// exposed communication on every rank (each waits for the gradient all-reduce).
void check_time_split(const std::string& out, int world, double tokens_per_step) {
  int checked = 0;
  double prev_elapsed = -1;
  for (const std::string& line : trident::testing::split_lines(out)) {
    auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded() || rec.value("type", "") != "step") continue;
    const double elapsed = rec["elapsed"].get<double>(), since_prev = 1e3 * (elapsed - prev_elapsed);
    prev_elapsed = elapsed;
    if (rec.value("step", 0) == 0) continue;
    ASSERT_TRUE(rec.contains("time_ms") && rec.contains("time_ms_ranks")) << line;
    ASSERT_EQ(rec["time_ms_ranks"].size(), static_cast<size_t>(world)) << line;
    EXPECT_EQ(rec["time_ms_ranks"][0], rec["time_ms"]) << line;  // rank 0 writes
    const double step_ms = rec["time_ms"]["step"].get<double>();
    EXPECT_NEAR(step_ms, 1e3 * tokens_per_step / rec["tokens_per_s"].get<double>(), 1e-3 * step_ms) << line;
    EXPECT_LE(step_ms, since_prev) << "more time than passed between two records: " << line;
    for (const auto& t : rec["time_ms_ranks"]) {
      double sum = 0;
      for (const char* part : {"compute", "comm", "bubble", "data", "optimizer"}) {
        ASSERT_TRUE(t.contains(part)) << part << " in " << line;
        EXPECT_GE(t[part].get<double>(), 0.0) << part << " in " << line;
        sum += t[part].get<double>();
      }
      EXPECT_NEAR(sum, t["step"].get<double>(), 1e-3 * t["step"].get<double>() + 1e-3) << line;
      EXPECT_GT(t["comm"].get<double>(), 0.0) << line;
      EXPECT_GT(t["compute"].get<double>(), 0.0) << line;
      EXPECT_EQ(t["bubble"].get<double>(), 0.0) << "no pipeline, no bubble: " << line;
    }
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

TEST(HealthStraggler, RankThrottledBySigstopBurstsIsNamed) {
  trident::testing::TempDir d;
  const std::string corpus = trident::testing::write_word_corpus(d.path);
  const int victim = 2;
  ProcessRunner job({TRIDENT_BIN, "train", "--data", corpus, "--out_dir", (d.path / "out").string(), "--n-layer", "4",
                     "--n-head", "2", "--n-embd", "64", "--block-size", "64", "--batch-size", "8", "--max-iters",
                     "1000000", "--eval-interval", "1000000", "--eval-iters", "1", "--sample-tokens", "0", "--threads",
                     "1", "--json", "--nproc", "3", "--parallel", "zero1"},
                    trident::testing::make_env({}, {}));
  // Unthrottled: the baseline (13 steps) and more than a window (8 steps) judged. Nothing is named.
  ASSERT_TRUE(job.read_until([&] { return steps_logged(job.out()) >= 32; }, 120)) << job.out() << job.err();
  {
    std::string unthrottled;
    for (const auto& e : health_events(job.out())) unthrottled += e.dump() + "\n";
    EXPECT_EQ(unthrottled, "") << "named in " << steps_logged(job.out()) << " unthrottled steps";
    check_time_split(job.out(), 3, 8.0 * 64 * 3);  // batch 8 x block 64 x 3 ranks
  }
  pid_t pid = 0;
  for (auto [p, rank] : trident::testing::ranks_of(job.pid()))
    if (rank == victim) pid = p;
  ASSERT_GT(pid, 0) << "rank " << victim << " not found among the launcher's children";
  auto named = [&] {
    for (const auto& e : health_events(job.out()))
      if (e.value("kind", "") == "straggler") return true;
    return false;
  };
  // Throttled: one stop per step. A step record of rank 0 means rank 2 has entered that step's last
  // collective, so the stop lands in its next step (its compute, or the first collective the others wait in).
  const size_t throttled_from = steps_logged(job.out());
  int bursts = 0;
  for (; bursts < 40 && !named(); ++bursts) {
    const size_t seen = steps_logged(job.out());
    if (!job.read_until([&] { return steps_logged(job.out()) > seen; }, 60)) break;
    ASSERT_EQ(::kill(pid, SIGSTOP), 0);
    job.read_until([] { return false; }, 0.15);
    ASSERT_EQ(::kill(pid, SIGCONT), 0);
  }
  const size_t throttled_steps = steps_logged(job.out()) - throttled_from;
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
  std::printf("%d straggler event(s) after %d bursts over %zu steps\n", straggler_events, bursts, throttled_steps);
  EXPECT_GE(straggler_events, 1) << "rank " << victim << " was not named after " << bursts << " bursts ("
                                 << throttled_steps << " steps):\n"
                                 << all << job.err();
  for (const auto& e : events) EXPECT_NE(e.value("kind", ""), "slow_link") << all;  // one host: no TCP link
}

}  // namespace
