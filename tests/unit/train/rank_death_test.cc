// The failure users hit most: one rank of `trident train` dies (OOM killer, a node's SIGKILL). For every
// layout, a rank SIGKILLed in the middle of training ends the whole job within 5 s, the launcher's
// message names the dead rank, and nothing of the job is left behind: no process, no shared-memory
// segment in /dev/shm (segments are named /trident-<creator pid>-...).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "unit/launch/process_runner.h"

namespace fs = std::filesystem;
using trident::testing::ProcessRunner;

namespace {

struct Layout {
  const char* name;
  int nproc;
  const char* flags;
};

std::vector<std::string> shm_segments_of(const std::vector<pid_t>& pids) {
  std::vector<std::string> left;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec))
    for (pid_t p : pids)
      if (e.path().filename().string().rfind(fmt::format("trident-{}-", p), 0) == 0) left.push_back(e.path().string());
  return left;
}

class RankDeath : public ::testing::TestWithParam<Layout> {};

TEST_P(RankDeath, KilledRankEndsTheJobNamedAndLeavesNothingBehind) {
  const Layout& l = GetParam();
  trident::testing::TempDir d;
  const std::string corpus = trident::testing::write_word_corpus(d.path);
  std::vector<std::string> argv = {TRIDENT_BIN, "train", "--data", corpus, "--out_dir", (d.path / "out").string(),
                                   "--n-layer", "4", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
                                   "--batch-size", "4", "--max-iters", "1000000", "--eval-interval", "1000000",
                                   "--eval-iters", "1", "--sample-tokens", "0", "--threads", "1", "--json",
                                   "--nproc", std::to_string(l.nproc)};
  std::istringstream flags(l.flags);
  for (std::string f; flags >> f;) argv.push_back(f);
  ProcessRunner job(argv, trident::testing::make_env({}, {}));
  // Training is under way on every rank once rank 0 has logged a few steps.
  auto steps = [&] { return trident::testing::count_of(job.out(), "\"type\":\"step\""); };
  ASSERT_TRUE(job.read_until([&] { return steps() >= 3; }, 120)) << job.out() << job.err();
  const auto ranks = trident::testing::ranks_of(job.pid());
  ASSERT_EQ(static_cast<int>(ranks.size()), l.nproc) << "the launcher's children: " << ranks.size();
  const int victim = l.nproc - 1;
  std::vector<pid_t> pids = {job.pid()};
  pid_t victim_pid = 0;
  for (auto [pid, rank] : ranks) {
    pids.push_back(pid);
    if (rank == victim) victim_pid = pid;
  }
  ASSERT_GT(victim_pid, 0);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(victim_pid, SIGKILL), 0);
  auto status = job.wait(60);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(status.has_value()) << "the job did not end within 60 s of rank " << victim << " dying:\n" << job.err();
  EXPECT_LT(s, 5.0) << "the job took " << s << " s to end after rank " << victim << " was killed:\n" << job.err();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << "status " << *status << "\n" << job.err();
  EXPECT_NE(job.err().find(fmt::format("rank {} (pid {})", victim, victim_pid)), std::string::npos) << job.err();
  EXPECT_NE(job.err().find("SIGKILL"), std::string::npos) << job.err();
  for (pid_t p : pids) {
    errno = 0;
    EXPECT_TRUE(::kill(p, 0) == -1 && errno == ESRCH) << "process " << p << " of the job is still alive";
  }
  EXPECT_EQ(shm_segments_of(pids), std::vector<std::string>{}) << "shared-memory segments left in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RankDeath,
    ::testing::Values(Layout{"ddp", 2, "--parallel ddp"}, Layout{"zero1", 2, "--parallel zero1"},
                      Layout{"zero2", 2, "--parallel zero2"}, Layout{"zero3", 2, "--parallel zero3"},
                      Layout{"tp2", 2, "--tp 2"}, Layout{"pp2_1f1b", 2, "--pp 2 --schedule 1f1b"},
                      Layout{"pp2_interleaved", 2, "--pp 2 --schedule interleaved --virtual_stages 2"},
                      Layout{"tp2_pp2_dp2", 8, "--tp 2 --pp 2"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
