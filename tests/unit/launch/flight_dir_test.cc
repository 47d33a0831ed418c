// The launcher gives every rank one folder for flight-recorder dumps: `trident launch --flight-recorder-dir D`
// and `trident train --nproc N` (its <out_dir>/flight_recorder) set TRIDENT_FLIGHT_RECORDER_DIR for the ranks.
// Three ranks of `trident train`; rank 1 is SIGKILLed mid-run: the survivors dump into that folder (on the
// dead peer's error, or on the launcher's SIGTERM), the launcher's failure report names the folder, and
// `trident inspect` reads it. The guards bound a hang; they assert no time.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "process_runner.h"

namespace {

namespace fs = std::filesystem;
using trident::testing::ProcessRunner;

const std::vector<std::string> kTrainArgs = {"--n-layer",     "1",       "--n-head",        "1",  "--n-embd",
                                             "16",            "--block-size", "16",          "--batch-size", "2",
                                             "--max-iters",   "1000000", "--eval-interval", "1000000",
                                             "--eval-iters",  "1",       "--sample-tokens", "0",  "--threads",
                                             "1",             "--json"};

size_t steps_logged(const std::string& out) {
  size_t n = 0;
  for (size_t at = out.find("\"type\":\"step\""); at != std::string::npos; at = out.find("\"type\":\"step\"", at + 1)) ++n;
  return n;
}

std::vector<std::string> dumps_in(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// `job`: a launcher of 3 ranks of train. SIGKILLs rank 1 once a step is logged; waits for the launcher to end.
void kill_rank_1(ProcessRunner& job) {
  ASSERT_TRUE(job.read_until([&] { return steps_logged(job.out()) >= 1; }, 120)) << job.out() << job.err();
  pid_t pid = 0;
  for (auto [p, rank] : trident::testing::ranks_of(job.pid()))
    if (rank == 1) pid = p;
  ASSERT_GT(pid, 0) << "rank 1 not found among the launcher's children";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto status = job.wait(60);
  ASSERT_TRUE(status.has_value()) << "the launcher did not end after rank 1 was killed\n" << job.err();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 128 + SIGKILL) << job.err();
}

void expect_inspect_reads(const fs::path& dir) {
  ProcessRunner inspect({TRIDENT_BIN, "inspect", dir.string()}, trident::testing::make_env({}, {}));
  const auto status = inspect.wait(60);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << inspect.out() << inspect.err();
  EXPECT_NE(inspect.out().find("rank"), std::string::npos) << inspect.out() << inspect.err();
}

TEST(LaunchFlightDir, LaunchFlagPutsEveryRanksDumpInOneFolder) {
  trident::testing::TempDir d;
  const std::string corpus = trident::testing::write_word_corpus(d.path);
  const fs::path dumps = d.path / "job" / "dumps";  // created by the launcher
  std::vector<std::string> argv = {TRIDENT_BIN, "launch", "-n", "3", "--flight-recorder-dir", dumps.string(), "--",
                                   TRIDENT_BIN, "train", "--data", corpus, "--out_dir", (d.path / "out").string()};
  argv.insert(argv.end(), kTrainArgs.begin(), kTrainArgs.end());
  // The flag wins over a folder in the launcher's own environment.
  ProcessRunner job(argv, trident::testing::make_env({}, {"TRIDENT_FLIGHT_RECORDER_DIR=" + (d.path / "elsewhere").string()}));
  kill_rank_1(job);
  if (HasFatalFailure()) return;
  const auto names = dumps_in(dumps);
  EXPECT_NE(std::find(names.begin(), names.end(), "rank_0.json"), names.end()) << job.err();
  EXPECT_NE(std::find(names.begin(), names.end(), "rank_2.json"), names.end()) << job.err();
  EXPECT_FALSE(fs::exists(d.path / "elsewhere")) << job.err();
  EXPECT_TRUE(dumps_in(d.path / "out" / "flight_recorder").empty()) << job.err();
  EXPECT_NE(job.err().find("flight-recorder dumps are in " + dumps.string()), std::string::npos) << job.err();
  expect_inspect_reads(dumps);
}

TEST(LaunchFlightDir, TrainNprocDumpsIntoItsOutDir) {
  trident::testing::TempDir d;
  const std::string corpus = trident::testing::write_word_corpus(d.path);
  const fs::path out = d.path / "out";
  std::vector<std::string> argv = {TRIDENT_BIN, "train", "--nproc", "3", "--data", corpus, "--out_dir", out.string()};
  argv.insert(argv.end(), kTrainArgs.begin(), kTrainArgs.end());
  ProcessRunner job(argv, trident::testing::make_env({"TRIDENT_FLIGHT_RECORDER_DIR"}, {}));
  kill_rank_1(job);
  if (HasFatalFailure()) return;
  const fs::path dumps = out / "flight_recorder";
  const auto names = dumps_in(dumps);
  EXPECT_NE(std::find(names.begin(), names.end(), "rank_0.json"), names.end()) << job.err();
  EXPECT_NE(std::find(names.begin(), names.end(), "rank_2.json"), names.end()) << job.err();
  EXPECT_NE(job.err().find("flight-recorder dumps are in " + dumps.string()), std::string::npos) << job.err();
  expect_inspect_reads(out);  // the out dir itself: inspect looks in its flight_recorder folder
}

}  // namespace
