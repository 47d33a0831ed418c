// The dashboard's reading of run folders: metrics.jsonl read while it grows (a record half written, a line
// that is not JSON, a file rewritten by a restarted run), the thinning of long series, the run's status and
// restarts, and the errors for a folder that is not a run; health.jsonl (the health monitor's rounds) read
// the same way, missing or with a torn last line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/dashboard/run_data.h"
#include "harness/temp_dir.h"
#include "unit/dashboard/synthetic_run.h"

namespace trident::dashboard {
namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& p, const std::string& text, bool append = false) {
  std::ofstream out(p, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
  out << text;
}

std::string step_line(int step, double loss) {
  return nlohmann::json{{"type", "step"}, {"step", step}, {"loss", loss}, {"elapsed", 0.1 * step}}.dump() + "\n";
}

TEST(DashboardMetricsLog, ReadsAppendedLinesAndWaitsForAnIncompleteOne) {
  testing::TempDir d("dash-log");
  const fs::path f = d.path / "metrics.jsonl";
  MetricsLog log(f.string());
  EXPECT_FALSE(log.refresh());  // missing file: empty, no error
  write_file(f, step_line(0, 4.0) + step_line(1, 3.9));
  EXPECT_TRUE(log.refresh());
  ASSERT_EQ(log.records().size(), 2u);
  const uint64_t gen = log.generation();
  // A record half written: not read yet, and not an error.
  const std::string third = step_line(2, 3.8);
  write_file(f, third.substr(0, 10), true);
  EXPECT_FALSE(log.refresh());
  EXPECT_EQ(log.records().size(), 2u);
  EXPECT_EQ(log.bad_lines(), 0u);
  write_file(f, third.substr(10), true);
  EXPECT_TRUE(log.refresh());
  ASSERT_EQ(log.records().size(), 3u);
  EXPECT_EQ(log.records()[2]["step"], 2);
  EXPECT_EQ(log.generation(), gen);  // appends keep the generation
  // A complete line that is not a JSON object is skipped and counted; blank lines are ignored.
  write_file(f, "{not json\n\n[1,2]\n" + step_line(3, 3.7), true);
  EXPECT_TRUE(log.refresh());
  EXPECT_EQ(log.records().size(), 4u);
  EXPECT_EQ(log.bad_lines(), 2u);
}

TEST(DashboardMetricsLog, RewrittenFileIsReadAgainUnderANewGeneration) {
  testing::TempDir d("dash-log");
  const fs::path f = d.path / "metrics.jsonl";
  MetricsLog log(f.string());
  std::string all;
  for (int s = 0; s < 10; ++s) all += step_line(s, 4.0 - 0.1 * s);
  write_file(f, all);
  log.refresh();
  ASSERT_EQ(log.records().size(), 10u);
  const uint64_t gen = log.generation();
  // A restart from the checkpoint at step 5 keeps steps 0-4 and logs again from 5: shorter than before.
  std::string kept;
  for (int s = 0; s < 5; ++s) kept += step_line(s, 4.0 - 0.1 * s);
  write_file(f, kept);
  EXPECT_TRUE(log.refresh());
  EXPECT_EQ(log.records().size(), 5u);
  EXPECT_GT(log.generation(), gen);
  EXPECT_EQ(log.rewrites(), 1);
  // The restarted run appends: its kept prefix is what was read, so reading goes on where it stopped.
  const uint64_t gen2 = log.generation();
  std::string longer = kept;
  for (int s = 5; s < 12; ++s) longer += step_line(s, 4.0 - 0.1 * s);
  write_file(f, longer);
  EXPECT_TRUE(log.refresh());
  EXPECT_EQ(log.records().size(), 12u);
  EXPECT_EQ(log.generation(), gen2);
  // Rewritten again to a longer file whose bytes before the read offset differ (a second restart got
  // further than the reader before it looked again): read from the start, no record lost or doubled.
  std::string other = kept;
  for (int s = 5; s < 14; ++s) other += step_line(s, 9.0 + s);
  write_file(f, other);
  EXPECT_TRUE(log.refresh());
  ASSERT_EQ(log.records().size(), 14u);
  EXPECT_GT(log.generation(), gen2);
  for (int s = 0; s < 14; ++s) EXPECT_EQ(log.records()[s]["step"], s);
  EXPECT_DOUBLE_EQ(log.records()[7]["loss"].get<double>(), 16.0);
}

TEST(DashboardDownsample, KeepsFirstAndLastAndAtMostMaxPoints) {
  EXPECT_EQ(downsample_indices(0, 10).size(), 0u);
  EXPECT_EQ(downsample_indices(5, 10), (std::vector<size_t>{0, 1, 2, 3, 4}));
  for (size_t n : {11u, 100u, 1001u, 123457u})
    for (size_t m : {2u, 3u, 10u, 1000u}) {
      const auto idx = downsample_indices(n, m);
      ASSERT_EQ(idx.size(), std::min(n, m)) << n << " " << m;
      EXPECT_EQ(idx.front(), 0u);
      EXPECT_EQ(idx.back(), n - 1);
      for (size_t k = 1; k < idx.size(); ++k) ASSERT_LT(idx[k - 1], idx[k]) << n << " " << m << " at " << k;
    }
  EXPECT_EQ(downsample_indices(100, 0).size(), 2u);  // fewer than 2 means 2
}

TEST(DashboardRunFolder, RefusesWhatIsNotARunFolder) {
  testing::TempDir d("dash-run");
  EXPECT_THROW(RunFolder((d.path / "missing").string(), 0), InvalidArgument);
  EXPECT_THROW(RunFolder(d.path.string(), 0), InvalidArgument);  // no metrics.jsonl
  write_file(d.path / "file", "x");
  EXPECT_THROW(RunFolder((d.path / "file").string(), 0), InvalidArgument);
  try {
    RunFolder r(d.path.string(), 0);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(d.path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl"), std::string::npos) << e.what();
  }
}

TEST(DashboardRunFolder, SummaryCountsStepsRestartsAndStatus) {
  testing::TempDir d("dash-run");
  const fs::path f = d.path / "metrics.jsonl";
  const std::string run = R"({"type":"run","threads":1})" "\n";
  write_file(f, run + step_line(0, 4.0) + step_line(1, 3.9) + R"({"type":"eval","step":2,"val_loss":3.5})" "\n");
  RunFolder r(d.path.string(), 3);
  auto s = r.summary();
  EXPECT_EQ(s["id"], 3);
  EXPECT_EQ(s["steps"], 2);
  EXPECT_EQ(s["evals"], 1);
  EXPECT_EQ(s["restarts"], 0);
  EXPECT_EQ(s["status"], "running");  // just written
  EXPECT_EQ(r.summary(/*live_s=*/0.0)["status"], "stopped");
  // Resumed from a checkpoint: the earlier run's records kept, a second "run" record.
  write_file(f, run + step_line(0, 4.0) + run + step_line(1, 3.9) + step_line(2, 3.8));
  s = r.summary();
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["steps"], 3);
  write_file(f, R"({"type":"measured","step_s":0.1})" "\n", true);
  EXPECT_EQ(r.summary()["status"], "finished");
}

TEST(DashboardRunFolder, HungRunIsNamedWithInspectsExplanation) {
  testing::TempDir d("dash-run");
  write_file(d.path / "metrics.jsonl", step_line(0, 4.0));
  test::write_hang_dumps(d.path / "flight_recorder");
  RunFolder r(d.path.string(), 0);
  const auto s = r.summary();
  EXPECT_EQ(s["status"], "hung");
  ASSERT_TRUE(s.contains("inspect"));
  EXPECT_NE(s["inspect"].get<std::string>().find("rank 2 never entered all_reduce #3"), std::string::npos)
      << s["inspect"];
}

TEST(DashboardRunFolder, RecordsSinceIsIncrementalAndThinsLongFirstLoads) {
  testing::TempDir d("dash-run");
  const fs::path f = d.path / "metrics.jsonl";
  std::string all = R"({"type":"run"})" "\n";
  for (int s = 0; s < 1000; ++s) all += step_line(s, 1.0);
  write_file(f, all);
  RunFolder r(d.path.string(), 0);
  auto a = r.records_since(0, 0, 100);
  EXPECT_TRUE(a["reset"].get<bool>());
  EXPECT_EQ(a["next"], 1001);
  ASSERT_EQ(a["records"].size(), 101u);  // the run record and 100 of the 1000 steps
  EXPECT_EQ(a["records"][0]["type"], "run");
  EXPECT_EQ(a["records"][1]["step"], 0);
  EXPECT_EQ(a["records"][100]["step"], 999);
  const uint64_t gen = a["generation"];
  write_file(f, step_line(1000, 1.0) + step_line(1001, 1.0), true);
  auto b = r.records_since(gen, 1001, 100);
  EXPECT_FALSE(b["reset"].get<bool>());
  ASSERT_EQ(b["records"].size(), 2u);
  EXPECT_EQ(b["records"][0]["step"], 1000);
  EXPECT_EQ(b["next"], 1003);
  // A stale generation, or an offset past the end, starts over.
  EXPECT_TRUE(r.records_since(gen + 7, 1003, 100)["reset"].get<bool>());
  EXPECT_TRUE(r.records_since(gen, 5000, 100)["reset"].get<bool>());
}

// The health monitor's rounds: a run without health.jsonl answers no rounds (not an error), a torn last
// line (a round being written, or a crash) is not a round until its newline comes, and a first load thins
// the rounds but keeps every one that raised a warning.
TEST(DashboardRunFolder, HealthRoundsMissingTornAndThinned) {
  testing::TempDir d("dash-health");
  write_file(d.path / "metrics.jsonl", step_line(0, 1.0));
  RunFolder r(d.path.string(), 0);
  auto none = r.health_since(0, 0, 100);
  EXPECT_TRUE(none["reset"].get<bool>());
  EXPECT_EQ(none["next"], 0);
  EXPECT_TRUE(none["records"].empty());

  const auto round = [](int step, bool warn) {
    nlohmann::json j = {{"step", step},
                        {"time", 1.7e9 + step},
                        {"links", {{{"src", 0}, {"dst", 1}, {"gbps", 0.5}, {"baseline_gbps", 1.0}}}},
                        {"ranks", {{{"rank", 0}, {"late_ms", 0.0}, {"baseline_ms", 0.0}},
                                   {{"rank", 1}, {"late_ms", 4.0}, {"baseline_ms", 0.0}}}}};
    if (warn) j["events"] = {{{"kind", "slow_link"}, {"src", 0}, {"dst", 1}, {"ratio", 0.5}, {"message", "slow"}}};
    return j.dump() + "\n";
  };
  std::string text;
  for (int s = 0; s < 300; ++s) text += round(s, s == 137);
  const std::string torn = round(300, false);
  write_file(d.path / "health.jsonl", text + torn.substr(0, torn.size() / 2));
  auto a = r.health_since(none["generation"], 0, 50);
  EXPECT_FALSE(a["reset"].get<bool>());  // a file that appeared grew from nothing: the same generation
  EXPECT_EQ(a["next"], 300);
  ASSERT_EQ(a["records"].size(), 51u);  // 50 of the 300 rounds, and the warning's round besides
  EXPECT_EQ(a["records"][0]["step"], 0);
  EXPECT_EQ(a["records"][50]["step"], 299);
  int warned = 0;
  for (const auto& rec : a["records"]) warned += rec.contains("events") && rec["step"] == 137;
  EXPECT_EQ(warned, 1) << "the round that raised a warning was thinned out";
  EXPECT_EQ(a["records"][1]["links"][0]["baseline_gbps"], 1.0);
  EXPECT_EQ(a["records"][1]["ranks"][1]["late_ms"], 4.0);
  // The torn round completes: it comes next, once.
  write_file(d.path / "health.jsonl", torn.substr(torn.size() / 2), true);
  auto b = r.health_since(a["generation"], 300, 50);
  EXPECT_FALSE(b["reset"].get<bool>());
  ASSERT_EQ(b["records"].size(), 1u);
  EXPECT_EQ(b["records"][0]["step"], 300);
  // The metrics records are a log of their own: the health rounds never appear among them.
  EXPECT_EQ(r.records_since(0, 0, 100)["records"].size(), 1u);
}

}  // namespace
}  // namespace trident::dashboard
