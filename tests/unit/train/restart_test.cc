// Elastic restart end to end: a 3-rank ZeRO-2 `trident train --max-restarts 2` whose rank R SIGKILLs itself
// at step S (random R and S, printed for reproduction) is restarted from its newest complete checkpoint and
// ends with the uninterrupted run's losses, final evaluation and checkpoint files, byte for byte. Its
// health.jsonl (the health monitor's rounds) then holds each step's round once, every rank in each: the
// restarted job keeps the rounds before the step it resumes at and drops the rest.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "trident/data/file_io.h"
#include "unit/launch/process_runner.h"

namespace fs = std::filesystem;
using trident::testing::ProcessRunner;

namespace {

constexpr int kRanks = 3;
constexpr int kSteps = 10;
constexpr int kInterval = 3;  // checkpoints at steps 3, 6, 9 and the final one at 10

struct TrainRun {
  int exit_code = -1;
  std::string out, err;
  std::map<int64_t, std::string> step_loss;  // the last logged loss of each step, as printed (exact digits)
  nlohmann::json final_record;
};

TrainRun train(const std::string& corpus, const fs::path& out_dir, const std::vector<std::string>& extra_args,
          const std::vector<std::string>& extra_env) {
  std::vector<std::string> argv = {TRIDENT_BIN, "train", "--data", corpus, "--out_dir", out_dir.string(),
                                   "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
                                   "--batch-size", "4", "--max-iters", std::to_string(kSteps), "--eval-interval", "5",
                                   "--eval-iters", "2", "--checkpoint-interval", std::to_string(kInterval),
                                   "--learning-rate", "3e-3", "--warmup-iters", "2", "--lr-decay-iters",
                                   std::to_string(kSteps), "--sample-tokens", "0", "--threads", "1", "--json",
                                   "--nproc", std::to_string(kRanks), "--parallel", "zero2"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  ProcessRunner p(argv, trident::testing::make_env({"RANK", "WORLD_SIZE", "TRIDENT_TEST_KILL_AT"}, extra_env));
  TrainRun r;
  auto status = p.wait(240);
  r.out = p.out();
  r.err = p.err();
  if (status && WIFEXITED(*status)) r.exit_code = WEXITSTATUS(*status);
  for (const auto& line : trident::testing::split_lines(r.out)) {
    if (line.empty() || line[0] != '{') continue;
    auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded()) continue;
    if (rec.value("type", "") == "step") r.step_loss[rec.at("step").get<int64_t>()] = rec.at("loss").dump();
    if (rec.value("type", "") == "final") r.final_record = rec;
  }
  return r;
}

TEST(ElasticRestart, KilledRankOfZero2RunRestartsAndMatchesTheUninterruptedRunBitwise) {
  trident::testing::TempDir d;
  const std::string corpus = trident::testing::write_word_corpus(d.path);
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937 gen(seed);
  const int victim = std::uniform_int_distribution<int>(0, kRanks - 1)(gen);
  const int kill_step = std::uniform_int_distribution<int>(1, kSteps - 1)(gen);
  SCOPED_TRACE(fmt::format("seed {}: rank {} is SIGKILLed at the start of step {}", seed, victim, kill_step));

  const TrainRun ref = train(corpus, d.path / "ref", {}, {});
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  ASSERT_EQ(ref.step_loss.size(), static_cast<size_t>(kSteps)) << ref.out;

  const TrainRun run = train(corpus, d.path / "restarted", {"--max-restarts", "2"},
                        {fmt::format("TRIDENT_TEST_KILL_AT={}:{}", victim, kill_step)});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // The launcher named the killed rank and restarted the job once.
  EXPECT_NE(run.err.find(fmt::format("trident launch: rank {} (pid ", victim)), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("was killed by signal 9 (SIGKILL)"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("(restart 1 of 2)"), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find("(restart 2 of 2)"), std::string::npos) << run.err;
  // Round 1 continued from the newest complete checkpoint before the kill, or from scratch without one. The
  // checkpoint of step 3 is written asynchronously by rank 0, which may die (killed, or stopped by the
  // launcher) before it is complete; the next save (step 6 at the latest) waits for it, so from step 7 on
  // one is always there.
  if (kill_step >= 2 * kInterval + 1) {
    EXPECT_NE(run.err.find("resuming from"), std::string::npos) << run.err;
  }

  // Every step's loss (those of round 1 replace round 0's), the final evaluation, and the checkpoint files.
  EXPECT_EQ(run.step_loss, ref.step_loss);
  ASSERT_FALSE(ref.final_record.is_null()) << ref.out;
  ASSERT_FALSE(run.final_record.is_null()) << run.out;
  for (const char* key : {"step", "val_loss", "train_loss"}) {
    EXPECT_EQ(run.final_record[key], ref.final_record[key]) << key;
  }
  const std::string ckpt = fmt::format("ckpt-{:08d}", kSteps);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const fs::path a = d.path / "ref" / ckpt / file, b = d.path / "restarted" / ckpt / file;
    ASSERT_TRUE(fs::exists(a) && fs::exists(b)) << a << " " << b;
    EXPECT_TRUE(trident::io::read_file(a.string()) == trident::io::read_file(b.string()))
        << file << " differs from the uninterrupted run's";
  }
  // The health rounds: steps 0..kSteps-1 in order, each once, with every rank's lateness.
  {
    std::ifstream in(d.path / "restarted" / "health.jsonl");
    std::vector<int64_t> steps;
    for (std::string line; std::getline(in, line);) {
      const auto h = nlohmann::json::parse(line, nullptr, false);
      ASSERT_TRUE(h.is_object()) << line;
      steps.push_back(h.value("step", int64_t{-1}));
      EXPECT_EQ(h["ranks"].size(), static_cast<size_t>(kRanks)) << line;
    }
    std::vector<int64_t> want;
    for (int64_t s = 0; s < kSteps; ++s) want.push_back(s);
    EXPECT_EQ(steps, want);
  }
  // No half-written checkpoint folder is left behind.
  for (const auto& e : fs::directory_iterator(d.path / "restarted"))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

}  // namespace
