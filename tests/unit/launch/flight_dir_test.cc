// The launcher gives every rank one folder for flight-recorder dumps: `trident launch --flight-recorder-dir D`
// and `trident train --nproc N` (its <out_dir>/flight_recorder) set TRIDENT_FLIGHT_RECORDER_DIR for the ranks.
// Three ranks of `trident train`; rank 1 is SIGKILLed mid-run: the survivors dump into that folder (on the
// dead peer's error, or on the launcher's SIGTERM), the launcher's failure report names the folder, and
// `trident inspect` reads it. A hang end to end: three ranks under `trident launch` (this test binary,
// re-executed as the ranks), rank 2 skips a collective; the others fail at the job's deadline
// (TRIDENT_TIMEOUT=3), the launcher stops rank 2 (which dumps on SIGTERM), and `trident inspect` says in one
// sentence that rank 2 never entered that collective's sequence number. The guards bound a hang; they assert
// no time.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "process_runner.h"
#include "trident/comm/process_group.h"
#include "trident/core/env.h"
#include "trident/core/error.h"

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

// ---- A hang: one rank skips a collective ----

constexpr int kBefore = 5;  // all-reduces every rank runs; rank 2 skips the next one (sequence number 6)

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// The lines of `text` that contain `needle`.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  for (const std::string& line : trident::testing::split_lines(text))
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

TEST(LaunchFlightDir, SkippedCollectiveEndsAtTheDeadlineAndInspectNamesTheRankAndSequenceNumber) {
  trident::testing::TempDir d;
  const fs::path dumps = d.path / "dumps";
  // The launcher's own variables come from the launcher; the job's deadline is short.
  const std::vector<std::string> drop = {"RANK",          "WORLD_SIZE",           "LOCAL_RANK",       "LOCAL_WORLD_SIZE",
                                         "GROUP_RANK",    "GROUP_WORLD_SIZE",     "MASTER_ADDR",      "MASTER_PORT",
                                         "TRIDENT_STORE_TOKEN", "TRIDENT_STORE_HOSTED", "TRIDENT_LAUNCH_TEST_CHILD",
                                         "TRIDENT_TIMEOUT", "TRIDENT_FLIGHT_RECORDER_DIR", "TRIDENT_FLIGHT_RECORDER_SIZE"};
  ProcessRunner job({TRIDENT_BIN, "launch", "-n", "3", "--master-port", "0", "--flight-recorder-dir", dumps.string(),
                     "--", self_exe(), "--gtest_also_run_disabled_tests",
                     "--gtest_filter=LaunchFlightDirChild.DISABLED_SkipsACollective"},
                    trident::testing::make_env(drop, {"TRIDENT_LAUNCH_TEST_CHILD=hang", "TRIDENT_TIMEOUT=3"}));
  const auto status = job.wait(90);
  ASSERT_TRUE(status.has_value()) << "the job did not end after the deadline\n" << job.out() << job.err();
  // Rank 0 or 1 failed at the deadline of the collective rank 2 skipped (the first to fail ends the job: the
  // launcher stops the others, so the second may have no time to reach its deadline).
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << job.out() << job.err();
  const auto deadlines = lines_with(job.out(), "deadline rank=");
  EXPECT_FALSE(deadlines.empty()) << job.out() << job.err();
  for (const std::string& line : deadlines)
    EXPECT_TRUE(line.ends_with(fmt::format("deadline rank=0 seq={}", kBefore + 1)) ||
                line.ends_with(fmt::format("deadline rank=1 seq={}", kBefore + 1)))
        << line;
  EXPECT_NE(job.err().find("3 ranks' flight-recorder dumps are in " + dumps.string()), std::string::npos) << job.err();
  // Whole dumps only. A rank whose deadline ends it (_Exit) while its dump thread still writes the SIGTERM
  // dump leaves that dump's temporary file (never renamed into place; `trident inspect` reads *.json only).
  std::vector<std::string> whole;
  for (const std::string& n : dumps_in(dumps))
    if (n.find(".json.tmp.") == std::string::npos) whole.push_back(n);
  EXPECT_EQ(whole, (std::vector<std::string>{"rank_0.json", "rank_1.json", "rank_2.json"})) << job.err();

  ProcessRunner inspect({TRIDENT_BIN, "inspect", dumps.string()}, trident::testing::make_env({}, {}));
  const auto inspected = inspect.wait(60);
  ASSERT_TRUE(inspected.has_value());
  EXPECT_TRUE(WIFEXITED(*inspected) && WEXITSTATUS(*inspected) == 0) << inspect.out() << inspect.err();
  std::printf("%s", inspect.out().c_str());  // what `trident inspect` says, in the test log
  // One sentence (one line) names the rank and the sequence number, and no other rank is said to be missing.
  const auto sentences = lines_with(inspect.out(), "never entered");
  ASSERT_EQ(sentences.size(), 1u) << inspect.out() << inspect.err();
  EXPECT_EQ(sentences[0].rfind(fmt::format("rank 2 never entered all_reduce #{} of group 'world' (ranks 0-2); "
                                           "ranks 0,1 waited ",
                                           kBefore + 1),
                               0),
            0u)
      << inspect.out();
  EXPECT_NE(sentences[0].find("TimeoutError"), std::string::npos) << inspect.out();
}

// Runs only as a rank started by the test above (disabled, so a normal test run neither runs nor skips it).
TEST(LaunchFlightDirChild, DISABLED_SkipsACollective) {
  ASSERT_EQ(trident::env::param_string("TRIDENT_LAUNCH_TEST_CHILD"), "hang")
      << "runs only as a rank under `trident launch` (TRIDENT_LAUNCH_TEST_CHILD=hang)";
  auto pg = trident::init_process_group();
  const int rank = pg->rank();
  std::vector<float> v(7);
  for (int i = 0; i < kBefore; ++i) {
    std::fill(v.begin(), v.end(), static_cast<float>(rank + i));
    pg->all_reduce(v.data(), v.size(), trident::DType::kFloat32, trident::ReduceOp::kSum);
    ASSERT_EQ(v[6], static_cast<float>(3 + 3 * i)) << "all_reduce " << i;
  }
  if (rank == 2) {
    // Busy elsewhere until the launcher's SIGTERM ends it: its recorder's handler wakes a thread that dumps
    // and then terminates the process. A signal cuts a sleep short, so sleep again until then.
    for (int i = 0; i < 600; ++i) ::usleep(100000);
    FAIL() << "rank 2 was not stopped by the launcher";
  }
  try {
    pg->all_reduce(v.data(), v.size(), trident::DType::kFloat32, trident::ReduceOp::kSum);
    FAIL() << "the all_reduce rank 2 skipped completed";
  } catch (const trident::TimeoutError& e) {
    // The dump was written before the error reached this rank; the launcher reports the exit code.
    std::printf("deadline rank=%d seq=%ld\n", rank, e.seq);
    std::fflush(stdout);
    std::_Exit(3);
  }
}

}  // namespace
