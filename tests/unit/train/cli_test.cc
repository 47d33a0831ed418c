// `trident train | eval | sample` end to end through the built binary.
#include <gtest/gtest.h>

#include "harness/temp_dir.h"
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "trident/data/file_io.h"
#include "trident/data/rng.h"
#include "trident/train/checkpoint.h"
#include "trident/train/trainer.h"

using namespace trident;
namespace fs = std::filesystem;

namespace {

struct Result {
  int rc;
  std::string out, err;
};

// The loss of every "step" record in a run's --json output, by step.
std::map<int64_t, double> step_losses(const std::string& out) {
  std::map<int64_t, double> m;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == "step") m[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return m;
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("trident-cli-test-{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    data::Rng r(5, 0);
    const char* words[] = {"to ", "be ", "or ", "not ", "that ", "is ", "the ", "question.\n"};
    while (text.size() < 10000) text += words[r.next_below(8)];
    std::ofstream(dir_ / "corpus.txt") << text;
    // One small training run shared by the tests below.
    Result t = run("train " + tiny_args() + " --out_dir " + (dir_ / "out").string() + " --json");
    ASSERT_EQ(t.rc, 0) << t.err;
    train_stdout_ = t.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string tiny_args() {
    return "--data " + (dir_ / "corpus.txt").string() +
           " --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 --max-iters 12 --warmup-iters 2"
           " --lr-decay-iters 12 --eval-interval 6 --eval-iters 2 --sample-tokens 20 --threads 1";
  }

  static Result run(const std::string& args) { return run_env("", args); }
  // `env` is prefixed to the command line as shell assignments ("NAME=value ").
  static Result run_env(const std::string& env, const std::string& args) {
    std::string err_file = (dir_ / "stderr.txt").string();
    std::string cmd = env + std::string(TRIDENT_BIN) + " " + args + " 2>" + err_file;
    std::FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int status = ::pclose(p);
    Result r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, io::read_file(err_file)};
    return r;
  }

  static inline fs::path dir_;
  static inline std::string train_stdout_;
};

TEST_F(Cli, TrainJsonStreamsRecordsAndEndsWithAFinalOne) {
  std::istringstream in(train_stdout_);
  std::string line;
  int steps = 0, evals = 0;
  nlohmann::json last;
  while (std::getline(in, line)) {
    last = nlohmann::json::parse(line);  // every line is JSON
    steps += last["type"] == "step";
    evals += last["type"] == "eval";
  }
  EXPECT_EQ(steps, 12);
  EXPECT_EQ(evals, 3);
  EXPECT_EQ(last["type"], "final");
  EXPECT_TRUE(last["val_loss"].is_number());
  EXPECT_GT(last["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(last["sample"].get<std::string>().size(), 20u);  // 20 single-byte characters
}

TEST_F(Cli, TrainPlainProgressWhenNotATerminal) {
  Result r = run("train " + tiny_args() + " --out_dir=" + (dir_ / "plain").string() + " --log-interval 4");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_CONTAINS(r.out, "step 4/12 | loss ");
  EXPECT_CONTAINS(r.out, "| lr ");
  EXPECT_CONTAINS(r.out, "tok/s | ETA ");
  EXPECT_EQ(r.out.find("step 3/12 |"), std::string::npos);  // only every log_interval steps
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  EXPECT_CONTAINS(r.out, "step 12: train loss");
  EXPECT_CONTAINS(r.out, "done: 12 steps | val loss");
  EXPECT_CONTAINS(r.out, "sample:\n");
}

TEST_F(Cli, TrainErrorsNameTheKey) {
  Result r = run("train --n_layers 3");
  EXPECT_EQ(r.rc, 2);
  EXPECT_CONTAINS(r.err, "unknown config key 'n_layers' (did you mean 'n_layer'?)");
  r = run("train --tokenizer=bpe");
  EXPECT_EQ(r.rc, 2);
  EXPECT_CONTAINS(r.err, "one of char|byte");
  r = run("train --data " + (dir_ / "missing.txt").string() + " --out-dir " + (dir_ / "x").string());
  EXPECT_EQ(r.rc, 2);
  EXPECT_CONTAINS(r.err, "does not exist");
  r = run("train --resume --out-dir " + (dir_ / "never").string());
  EXPECT_EQ(r.rc, 2);
  EXPECT_CONTAINS(r.err, "no checkpoint in out_dir");
  r = run("train --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_CONTAINS(r.out, "--gradient_accumulation_steps");
}

TEST_F(Cli, EvalMatchesTheLibraryAndIsDeterministic) {
  std::string ck = (dir_ / "out").string();
  Result a = run("eval --checkpoint " + ck + " --split val --windows 5 --json");
  ASSERT_EQ(a.rc, 0) << a.err;
  auto j = nlohmann::json::parse(a.out);
  EXPECT_EQ(j["windows"], 5);
  EXPECT_EQ(j["block_size"], 16);
  EXPECT_EQ(j["step"], 12);
  // Independent path: load the checkpoint in-process and evaluate the same windows.
  auto loaded = train::load_checkpoint(train::find_checkpoint(ck), false);
  auto model = train::model_from_checkpoint(loaded);
  data::DatasetOptions o;
  o.source = (dir_ / "corpus.txt").string();
  o.tokenizer_override = data::Tokenizer::from_json(loaded.meta.tokenizer);
  auto ds = data::TokenDataset::open(o);
  EXPECT_EQ(j["loss"].get<double>(), train::evaluate_windows(*model, ds.span(data::Split::kVal), 16, 5));
  Result b = run("eval --checkpoint " + ck + " --split val --windows 5 --json");
  EXPECT_EQ(a.out, b.out);
  Result plain = run("eval --checkpoint " + ck + " --data " + o.source + " --split train --windows 3");
  ASSERT_EQ(plain.rc, 0) << plain.err;
  EXPECT_CONTAINS(plain.out, "train loss ");

  EXPECT_NE(run("eval --windows 3").rc, 0);  // --checkpoint is required
  Result e = run("eval --checkpoint " + (dir_ / "nothing").string() + " --windows 3");
  EXPECT_EQ(e.rc, 2);
  EXPECT_CONTAINS(e.err, "does not exist");
  e = run("eval --checkpoint " + ck + " --windows 100000");
  EXPECT_EQ(e.rc, 2);
  EXPECT_CONTAINS(e.err, "at most");
}

TEST_F(Cli, SampleIsSeededAndContinuesThePrompt) {
  std::string ck = (dir_ / "out").string();
  Result a = run("sample --checkpoint " + ck + " --prompt 'to be' --tokens 30 --seed 4 --temperature 1.0 --top-k 5");
  Result b = run("sample --checkpoint " + ck + " --prompt 'to be' --tokens 30 --seed 4 --temperature 1.0 --top-k 5");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out.rfind("to be", 0), 0u);
  EXPECT_EQ(a.out.size(), 5u + 30u + 1u);
  Result e = run("sample --checkpoint " + ck + " --prompt 'XYZ' --tokens 3");
  EXPECT_EQ(e.rc, 2);
  EXPECT_CONTAINS(e.err, "'X'");
  EXPECT_CONTAINS(e.err, "not in the tokenizer's vocabulary");
}

TEST_F(Cli, CorruptCheckpointIsReportedWithTheFile) {
  fs::path copy = dir_ / "corrupt";
  fs::copy(dir_ / "out", copy, fs::copy_options::recursive);
  std::string dir = train::find_checkpoint(copy.string());
  std::string model = dir + "/model.safetensors";
  fs::resize_file(model, fs::file_size(model) - 8);
  Result r = run("eval --checkpoint " + copy.string() + " --windows 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_CONTAINS(r.err, model);
  EXPECT_CONTAINS(r.err, "truncated");
}

// The run that diverges (nanoGPT's loss -nan): --learning_rate 1e6 without clipping. It stops with an error
// naming the step and a parameter, exits non-zero and leaves no checkpoint of the diverged state; with
// --on_nonfinite skip it finishes, counting the skipped steps, and what it saves is finite.
TEST_F(Cli, DivergedTrainingStopsAndNamesTheStep) {
  const std::string out = (dir_ / "diverged").string();
  Result r = run("train " + tiny_args() + " --learning_rate 1e6 --grad_clip 0 --sample-tokens 0 --out_dir " + out);
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_CONTAINS(r.err, "first parameter with a non-finite gradient on rank 0: ");
  EXPECT_CONTAINS(r.err, "--on_nonfinite skip");
  EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
  const std::string ck = train::find_checkpoint(out);
  if (!ck.empty()) {
    EXPECT_NO_THROW(train::load_checkpoint(ck)) << "a checkpoint of the diverged run: " << ck;
  }

  const std::string skipped = (dir_ / "diverged-skip").string();
  Result s = run("train " + tiny_args() + " --learning_rate 1e6 --grad_clip 0 --sample-tokens 0 --on_nonfinite skip"
                 " --json --out_dir " + skipped);
  ASSERT_EQ(s.rc, 0) << s.err;
  int64_t skips = 0;
  std::istringstream in(s.out);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "step" && j.contains("nonfinite_skips")) skips = j["nonfinite_skips"].get<int64_t>();
  }
  EXPECT_GT(skips, 0) << s.out;
  EXPECT_NO_THROW(train::load_checkpoint(train::find_checkpoint(skipped)));
}

// A checkpoint holding a NaN (written by something else, or by an older trident) is refused by eval, naming
// the tensor; its checksums are right, so only the values give it away.
TEST_F(Cli, EvalRefusesACheckpointWithNonFiniteValues) {
  fs::path copy = dir_ / "nan-checkpoint";
  fs::copy(dir_ / "out", copy, fs::copy_options::recursive);
  const std::string dir = train::find_checkpoint(copy.string());
  const std::string model = dir + "/model.safetensors";
  std::map<std::string, std::string> md;
  auto tensors = train::read_safetensors(model, &md);
  const std::string victim = tensors.begin()->first;
  tensors.begin()->second.data[3] = std::nanf("");
  std::vector<train::TensorRef> refs;
  for (auto& [name, t] : tensors) refs.push_back({name, t.shape, t.data.data()});
  const uint64_t sum = train::write_safetensors(model, refs, md);
  const std::string meta_path = dir + "/checkpoint.json";
  auto meta = nlohmann::json::parse(io::read_file(meta_path));
  meta["files"]["model.safetensors"]["fnv1a64"] = io::hex64(sum);
  meta["files"]["model.safetensors"]["bytes"] = fs::file_size(model);
  std::ofstream(meta_path) << meta.dump(2) << "\n";
  Result r = run("eval --checkpoint " + copy.string() + " --windows 2");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_CONTAINS(r.err, "non-finite value in '" + victim + "'");
  EXPECT_CONTAINS(r.err, "diverged run");
}

// A ZeRO-3 run on 2 ranks resumes on 3 (ZeRO-1) with the same global batch (batch_size 6 x 2 = 4 x 3) and
// continues exactly where the uninterrupted 2-rank run goes; a different global batch is refused with the fix.
TEST_F(Cli, ResumeOnAnotherNumberOfRanksKeepsTheRun) {
  const std::string base = "--data " + (dir_ / "corpus.txt").string() +
                           " --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --warmup-iters 2"
                           " --lr-decay-iters 12 --eval-interval 6 --eval-iters 2 --sample-tokens 0 --threads 1"
                           " --grad-clip 0 --json";
  const std::string a = (dir_ / "rs-a").string(), b = (dir_ / "rs-b").string();
  // Uninterrupted: 12 steps on 2 ranks. Interrupted: 6 steps on 2 ranks, then 6 more on 3.
  Result full = run("train " + base + " --nproc 2 --parallel zero3 --batch-size 6 --max-iters 12 --out_dir " + a);
  ASSERT_EQ(full.rc, 0) << full.err;
  Result first = run("train " + base + " --nproc 2 --parallel zero3 --batch-size 6 --max-iters 6 --out_dir " + b);
  ASSERT_EQ(first.rc, 0) << first.err;
  Result bad = run("train " + base + " --nproc 3 --parallel zero1 --batch-size 6 --max-iters 12 --resume --out_dir " + b);
  EXPECT_NE(bad.rc, 0);
  EXPECT_CONTAINS(bad.out + bad.err, "set --batch_size to 12 / ranks");
  Result second =
      run("train " + base + " --nproc 3 --parallel zero1 --batch-size 4 --max-iters 12 --resume --out_dir " + b);
  ASSERT_EQ(second.rc, 0) << second.err;
  auto losses = [](const std::string& out) { return step_losses(out); };
  auto ref = losses(full.out), resumed = losses(second.out);
  ASSERT_EQ(ref.size(), 12u);
  ASSERT_EQ(resumed.size(), 6u);
  for (auto [step, loss] : resumed) EXPECT_NEAR(loss, ref.at(step), 1e-4 * std::abs(ref.at(step))) << step;
}

// ZeRO-3 samples at the end as it trains, one block gathered at a time on every rank in step (never the
// whole model): the same seed gives the same text as DDP, which samples from the whole model on rank 0.
TEST_F(Cli, Zero3SamplesWhatDdpSamples) {
  auto sample = [](const std::string& parallel) {
    Result r = run("train " + tiny_args() + " --nproc 2 --parallel " + parallel + " --json --out_dir " +
                   (dir_ / ("sample-" + parallel)).string());
    EXPECT_EQ(r.rc, 0) << r.err;
    std::istringstream in(r.out);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty() && line[0] == '{' && nlohmann::json::parse(line).value("type", "") == "final")
        return nlohmann::json::parse(line).value("sample", std::string());
    return std::string("(no final record)");
  };
  const std::string ddp = sample("ddp"), zero3 = sample("zero3");
  EXPECT_EQ(ddp.size(), 20u) << ddp;  // 20 characters of the char tokenizer
  EXPECT_EQ(zero3, ddp);
}

// --device cuda where no GPU can be used fails at once with an error naming what was looked for.
// CUDA_VISIBLE_DEVICES="" hides every GPU, so this runs the same on a machine with one.
TEST_F(Cli, DeviceCudaWithoutAGpuFailsAtOnce) {
  const fs::path out = dir_ / "cuda-out";
  const std::string hide = "CUDA_VISIBLE_DEVICES= ";
#ifdef TRIDENT_HAVE_CUDA
  const std::string why = "CUDA_VISIBLE_DEVICES=''";  // and the cudaGetDeviceCount result before it
#else
  const std::string why = "this build of trident has no CUDA: nvcc was not found";
#endif
  Result r = run_env(hide, "train " + tiny_args() + " --device cuda --out_dir " + out.string());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_CONTAINS(r.err, "device cuda is not available");
  EXPECT_CONTAINS(r.err, why);
  EXPECT_FALSE(fs::exists(out));  // nothing read or written: no token cache, no metrics
  // The config key does the same.
  std::ofstream(dir_ / "cuda.json") << R"({"device": "cuda"})";
  r = run_env(hide, "train " + tiny_args() + " --config " + (dir_ / "cuda.json").string() + " --out_dir " +
                        out.string());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_CONTAINS(r.err, "device cuda is not available");
  for (const char* cmd : {"eval --windows 2", "sample --tokens 3"}) {
    r = run_env(hide, std::string(cmd) + " --device cuda --checkpoint " + (dir_ / "out").string());
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.err;
    EXPECT_CONTAINS(r.err, "device cuda is not available");
    EXPECT_CONTAINS(r.err, why);
  }
  // --device cpu is the default and runs as before.
  r = run("eval --windows 2 --device cpu --checkpoint " + (dir_ / "out").string());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_CONTAINS(r.out, "val loss");
}


// --offload optimizer on several ranks: DDP, ZeRO-1/2/3 at 2 and 3 ranks and tensor parallelism at 2 train
// bit for bit as without it (each rank offloads what it owns), and a ZeRO-2 run that offloaded resumes
// without offload, continuing the uninterrupted run exactly.
TEST_F(Cli, OffloadOnSeveralRanksTrainsAsWithout) {
  const std::string base = "--data " + (dir_ / "corpus.txt").string() +
                           " --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 --warmup-iters 2"
                           " --lr-decay-iters 12 --eval-interval 6 --eval-iters 2 --sample-tokens 0 --threads 1 --json";
  auto losses = [](const Result& r) { return step_losses(r.out); };
  for (const std::string layout : {"--nproc 2 --parallel ddp", "--nproc 3 --parallel zero1", "--nproc 2 --parallel zero2",
                                   "--nproc 3 --parallel zero3", "--nproc 2 --tp 2"}) {
    SCOPED_TRACE(layout);
    const std::string out = (dir_ / "offload").string();
    fs::remove_all(out);
    Result plain = run("train " + base + " " + layout + " --max-iters 8 --out_dir " + out + "-plain");
    ASSERT_EQ(plain.rc, 0) << plain.err;
    Result off = run("train " + base + " " + layout + " --max-iters 8 --offload optimizer --out_dir " + out + "-off");
    ASSERT_EQ(off.rc, 0) << off.err;
    const auto a = losses(plain), b = losses(off);
    ASSERT_EQ(a.size(), 8u);
    EXPECT_EQ(a, b);
  }
  const std::string z = (dir_ / "offload-resume").string();
  Result full = run("train " + base + " --nproc 2 --parallel zero2 --max-iters 8 --out_dir " + z + "-full");
  ASSERT_EQ(full.rc, 0) << full.err;
  Result first = run("train " + base + " --nproc 2 --parallel zero2 --max-iters 4 --offload optimizer --out_dir " + z);
  ASSERT_EQ(first.rc, 0) << first.err;
  Result rest = run("train " + base + " --nproc 2 --parallel zero2 --max-iters 8 --resume --out_dir " + z);
  ASSERT_EQ(rest.rc, 0) << rest.err;
  const auto ref = losses(full), resumed = losses(rest);
  ASSERT_EQ(resumed.size(), 4u);
  for (auto [step, loss] : resumed) EXPECT_EQ(loss, ref.at(step)) << "step " << step;
}

}  // namespace
