// Several ranks of `trident train --device cuda` on one GPU: the native backend reads peers' device buffers
// through CUDA IPC (or stages them through host memory: TRIDENT_CUDA_IPC=0; comm/device_memory.h), so every
// data-parallel strategy (the GPT and the MLP; ZeRO-3 with activation checkpointing and accumulation), tensor
// and pipeline parallelism, for the GPT and the Llama, run on a machine with a single GPU (NCCL refuses two ranks on one device). Each
// layout reproduces the loss sequence of ONE CUDA process training on the same global batch within 1e-4
// relative, the one-process CUDA run reproduces the CPU run within 1e-4 (float32), the checkpoint of a TP 2 x
// PP 2 run on the GPU evaluates on the CPU in one process to the loss of the one-process GPU run's
// checkpoint, and a rank killed mid-training ends the job with the rank named. The runs are the real command
// (the launcher forks ranks that start CUDA themselves). Skipped without a GPU; the binary is
// TRIDENT_TEST_BIN when set (a test binary copied to a GPU machine), else this build's.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "harness/skip.h"
#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "unit/launch/process_runner.h"

namespace trident::cuda {
namespace {
namespace fs = std::filesystem;
using trident::testing::ProcessRunner;

constexpr int kSteps = 12;

std::string trident_bin() {
  const char* b = std::getenv("TRIDENT_TEST_BIN");
  return b != nullptr && *b != '\0' ? std::string(b) : std::string(TRIDENT_BIN);
}

std::vector<std::string> split(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> v;
  for (std::string w; in >> w;) v.push_back(w);
  return v;
}

class CudaMultiRank : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new trident::testing::TempDir("cuda-mr");
    corpus_ = trident::testing::write_word_corpus(dir_->path);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    refs_.clear();
  }
  void SetUp() override {
    TRIDENT_REQUIRE_GPU();
    if (!fs::exists(trident_bin())) TRIDENT_SKIP_MISSING("the trident binary at " + trident_bin() + " (set TRIDENT_TEST_BIN)");
  }

  // The arguments every run shares: a 4-layer GPT small enough for 4 ranks on one GPU, clipping on every step.
  static std::vector<std::string> base_args(const fs::path& out, int batch) {
    return {trident_bin(), "train", "--data", corpus_, "--out_dir", out.string(), "--n_layer", "4", "--n_head", "4",
            "--n_embd", "32", "--block_size", "16", "--batch_size", std::to_string(batch), "--max_iters",
            std::to_string(kSteps), "--warmup_iters", "2", "--lr_decay_iters", std::to_string(kSteps),
            "--learning_rate", "3e-3", "--min_lr", "3e-4", "--grad_clip", "0.1", "--eval_interval", "1000",
            "--eval_iters", "2", "--sample_tokens", "0", "--threads", "1", "--json"};
  }

  // The per-step losses of one run (metrics.jsonl); fails the test with the run's stderr when it failed.
  static std::vector<double> run(const std::string& name, int batch, const std::string& flags,
                                 const std::vector<std::string>& env = {}) {
    const fs::path out = dir_->path / name;
    std::vector<std::string> argv = base_args(out, batch);
    for (auto& f : split(flags)) argv.push_back(f);
    // Every collective on device buffers takes the device path (not only those above its size crossover),
    // unless the run turns the path off.
    std::vector<std::string> vars = {"TRIDENT_CUDA_IPC_MIN_BYTES=0"};
    vars.insert(vars.end(), env.begin(), env.end());
    ProcessRunner job(argv, trident::testing::make_env({"TRIDENT_CUDA_IPC", "TRIDENT_CUDA_IPC_MIN_BYTES"}, vars));
    auto status = job.wait(300);
    EXPECT_TRUE(status.has_value()) << name << ": did not finish within 300 s\n" << job.err();
    if (!status.has_value()) return {};
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << name << ": status " << *status << "\n"
                                                                  << job.err();
    std::vector<double> losses;
    double val = NAN;  // the last evaluation's validation loss, appended after the step losses
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto r = nlohmann::json::parse(line, nullptr, false);
      if (!r.is_object()) continue;
      if (r.value("type", "") == "step" && r.contains("loss")) losses.push_back(r["loss"].get<double>());
      if (r.value("type", "") == "eval" && r.contains("val_loss")) val = r["val_loss"].get<double>();
    }
    final_val_[name] = val;
    EXPECT_EQ(losses.size(), static_cast<size_t>(kSteps)) << name << "\n" << job.err();
    return losses;
  }

  // One CUDA process at global batch `batch` with `model` flags (run once per pair).
  static const std::vector<double>& reference(int batch, const std::string& model = "") {
    auto& r = refs_[fmt::format("{}|{}", batch, model)];
    if (r.empty()) r = run(reference_name(batch, model), batch, "--device cuda " + model);
    return r;
  }
  static std::string reference_name(int batch, const std::string& model) {
    std::string n = fmt::format("ref{}", batch);
    for (char ch : model)
      if (std::isalnum(static_cast<unsigned char>(ch))) n += ch;
    return n;
  }

  static void expect_same(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double rel = std::abs(got[i] - want[i]) / std::abs(want[i]);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-4) << what << ": step " << i << " loss " << got[i] << " want " << want[i];
    }
    std::printf("%s: worst relative loss difference %.3g over %zu steps\n", what.c_str(), worst, got.size());
  }

  // `nproc` ranks of `flags` at per-rank batch 4 against one process at the global batch 4 x dp.
  // `model` flags (the model, checkpointing, accumulation) apply to the reference too.
  static void check_layout(const std::string& name, int nproc, int dp, const std::string& flags,
                           const std::vector<std::string>& env = {}, const std::string& model = "") {
    auto got = run(name, 4, fmt::format("--device cuda --nproc {} {} {}", nproc, flags, model), env);
    const auto& want = reference(4 * dp, model);
    expect_same(got, want, name);
    const double v = final_val_[name], w = final_val_[reference_name(4 * dp, model)];
    EXPECT_LE(std::abs(v - w), 1e-4 * std::abs(w)) << name << ": final validation loss " << v << " want " << w;
  }

  // `trident eval` of the checkpoint in run `name`'s folder on `device`: the validation loss.
  static double eval_checkpoint(const std::string& name, const std::string& device) {
    ProcessRunner job({trident_bin(), "eval", "--checkpoint", (dir_->path / name).string(), "--windows", "16",
                       "--json", "--device", device},
                      trident::testing::make_env({}, {}));
    auto status = job.wait(120);
    EXPECT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << job.err();
    for (const auto& line : trident::testing::split_lines(job.out())) {
      auto r = nlohmann::json::parse(line, nullptr, false);
      if (r.is_object() && r.contains("loss")) return r["loss"].get<double>();
    }
    ADD_FAILURE() << "eval printed no loss: " << job.out() << job.err();
    return NAN;
  }

  static trident::testing::TempDir* dir_;
  static std::string corpus_;
  static std::map<std::string, std::vector<double>> refs_;
  static std::map<std::string, double> final_val_;
};
trident::testing::TempDir* CudaMultiRank::dir_ = nullptr;
std::string CudaMultiRank::corpus_;
std::map<std::string, std::vector<double>> CudaMultiRank::refs_;
std::map<std::string, double> CudaMultiRank::final_val_;

TEST_F(CudaMultiRank, OneCudaProcessReproducesTheCpu) {
  const auto cpu = run("cpu4", 4, "--device cpu");
  const auto& gpu = reference(4);
  expect_same(gpu, cpu, "cuda vs cpu, 1 process");
  // Not two flat lines: the loss falls.
  ASSERT_EQ(gpu.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(gpu.back(), gpu.front() - 0.1);
}

TEST_F(CudaMultiRank, DataParallelEveryStrategy) {
  check_layout("ddp2", 2, 2, "--parallel ddp");
  check_layout("zero1_2", 2, 2, "--parallel zero1");
  check_layout("zero2_2", 2, 2, "--parallel zero2");
  check_layout("zero3_2", 2, 2, "--parallel zero3");
  check_layout("zero2_3", 3, 3, "--parallel zero2");
  // The same through host memory (the device path off): the staged collectives give the same sequence.
  check_layout("zero3_2_staged", 2, 2, "--parallel zero3", {"TRIDENT_CUDA_IPC=0"});
  check_layout("tp2_staged", 2, 1, "--tp 2", {"TRIDENT_CUDA_IPC=0"});
  // The MLP, and ZeRO-3 with activation checkpointing and two accumulation steps (its block hooks gather
  // parameters for the recomputation too).
  check_layout("mlp_ddp2", 2, 2, "--parallel ddp", {}, "--model mlp");
  check_layout("zero3_2_ckpt_accum", 2, 2, "--parallel zero3", {},
               "--activation_checkpointing true --gradient_accumulation_steps 2");
}

// The Llama (grouped-query attention: 2 key/value heads of 4; rotary embeddings, RMSNorm, SwiGLU) in every
// layout, and its one-process CUDA run against the CPU.
TEST_F(CudaMultiRank, LlamaEveryLayout) {
  const std::string llama = "--model llama --n_kv_head 2";
  expect_same(reference(4, llama), run("llama_cpu4", 4, "--device cpu " + llama), "llama: cuda vs cpu, 1 process");
  check_layout("llama_ddp2", 2, 2, "--parallel ddp", {}, llama);
  check_layout("llama_zero3_2", 2, 2, "--parallel zero3", {}, llama);
  check_layout("llama_tp2", 2, 1, "--tp 2", {}, llama);
  check_layout("llama_tp4_kv_copies", 4, 1, "--tp 4", {}, llama);
  check_layout("llama_pp2_1f1b", 2, 1, "--pp 2 --schedule 1f1b --microbatches 4", {}, llama);
  check_layout("llama_pp2_interleaved", 2, 1, "--pp 2 --schedule interleaved --virtual_stages 2 --microbatches 4", {},
               llama);
  check_layout("llama_tp2_pp2", 4, 1, "--tp 2 --pp 2 --schedule 1f1b --microbatches 4", {}, llama);
}

TEST_F(CudaMultiRank, TensorAndPipelineParallel) {
  check_layout("tp2", 2, 1, "--tp 2");
  check_layout("pp2_1f1b", 2, 1, "--pp 2 --schedule 1f1b --microbatches 4");
  check_layout("pp2_interleaved", 2, 1, "--pp 2 --schedule interleaved --virtual_stages 2 --microbatches 4");
  check_layout("tp2_pp2", 4, 1, "--tp 2 --pp 2 --schedule 1f1b --microbatches 4");
  // The TP 2 x PP 2 run's checkpoint is the logical model: one CPU process evaluates it to what it gives for
  // the one-process GPU run's checkpoint.
  const double sharded = eval_checkpoint("tp2_pp2", "cpu"), single = eval_checkpoint("ref4", "cpu");
  EXPECT_LE(std::abs(sharded - single), 1e-4 * std::abs(single)) << "tp2 x pp2 checkpoint on the cpu " << sharded
                                                                  << ", one-process checkpoint " << single;
  std::printf("cpu eval of the cuda checkpoints: tp2 x pp2 %.7f, one process %.7f\n", sharded, single);
}

// Rank 1 of a 2-rank ZeRO-2 job on `backend` is SIGKILLed mid-training: the job ends within 10 s, naming it.
void kill_rank_one(const fs::path& out, const std::string& backend) {
  std::vector<std::string> argv = CudaMultiRank::base_args(out, 4);
  for (auto& f : split("--device cuda --nproc 2 --parallel zero2 --max_iters 1000000 --lr_decay_iters 1000000 "
                       "--backend " + backend))
    argv.push_back(f);
  ProcessRunner job(argv, trident::testing::make_env({}, {}));
  auto steps = [&] { return trident::testing::count_of(job.out(), "\"type\":\"step\""); };
  ASSERT_TRUE(job.read_until([&] { return steps() >= 3; }, 180)) << job.out() << job.err();
  const auto ranks = trident::testing::ranks_of(job.pid());
  ASSERT_EQ(ranks.size(), 2u);
  pid_t victim = 0;
  for (auto [pid, rank] : ranks)
    if (rank == 1) victim = pid;
  ASSERT_GT(victim, 0);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  auto status = job.wait(60);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(status.has_value()) << "the job did not end within 60 s of rank 1 dying:\n" << job.err();
  std::printf("%s: the job ended %.2f s after rank 1 was killed\n", backend.c_str(), s);
  EXPECT_LT(s, 10.0) << job.err();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << "status " << *status << "\n" << job.err();
  EXPECT_NE(job.err().find(fmt::format("rank 1 (pid {})", victim)), std::string::npos) << job.err();
}

TEST_F(CudaMultiRank, AKilledRankEndsTheJobNamed) { kill_rank_one(dir_->path / "death", "native"); }

// ---- NCCL with one GPU per rank: runs where the machine has 2 GPUs or more (NCCL refuses two ranks on one
// device), and skips elsewhere saying so. The same layouts and checks as above, on --backend nccl. ----
class CudaNcclTwoGpus : public CudaMultiRank {
 protected:
  void SetUp() override {
    CudaMultiRank::SetUp();
    if (IsSkipped()) return;
    if (device_count() < 2)
      TRIDENT_SKIP_MACHINE(fmt::format("needs 2 GPUs (NCCL refuses two ranks on one device); this one has {}",
                                       device_count()));
  }
};

TEST_F(CudaNcclTwoGpus, EveryCollectiveChecked) {
  ProcessRunner job({trident_bin(), "bench", "comm", "--nproc", "2", "--device", "cuda", "--backend", "nccl", "--op",
                     "all_reduce,reduce,broadcast,all_gather,reduce_scatter,gather,scatter,all_to_all", "-b", "4", "-e",
                     "1M", "-f", "16", "--iters", "2", "--warmup", "1", "--check"},
                    trident::testing::make_env({}, {}));
  auto status = job.wait(240);
  ASSERT_TRUE(status.has_value()) << job.err();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << job.out() << job.err();
  EXPECT_NE(job.out().find("Out of bounds values : 0 OK"), std::string::npos) << job.out() << job.err();
}

TEST_F(CudaNcclTwoGpus, EveryLayoutMatchesOneProcess) {
  check_layout("nccl_ddp2", 2, 2, "--backend nccl --parallel ddp");
  check_layout("nccl_zero3_2", 2, 2, "--backend nccl --parallel zero3");
  check_layout("nccl_tp2", 2, 1, "--backend nccl --tp 2");
  check_layout("nccl_pp2", 2, 1, "--backend nccl --pp 2 --schedule 1f1b --microbatches 4");
}

TEST_F(CudaNcclTwoGpus, AKilledRankEndsTheJobNamed) { kill_rank_one(dir_->path / "nccl_death", "nccl"); }

}  // namespace
}  // namespace trident::cuda
