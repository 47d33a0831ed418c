// The training loop on a tiny GPT: determinism, bit-exact kill-and-resume, metrics, evaluation, sampling.
#include <gtest/gtest.h>

#include "harness/counting_device.h"
#include "harness/multiproc.h"
#include "harness/temp_dir.h"
#include "harness/quiet_trainer.h"
#include "harness/synthetic_data.h"
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

#include "trident/core/error.h"
#include "trident/data/file_io.h"
#include "trident/data/rng.h"
#include "trident/train/generate.h"
#include "trident/train/trainer.h"

using namespace trident;
using namespace trident::train;
namespace fs = std::filesystem;

namespace {

using TempDir = trident::testing::TempDir;

// A small text with some structure so the loss falls.
std::string make_corpus(const fs::path& dir) { return trident::testing::write_word_corpus(dir); }

TrainConfig tiny(const std::string& data, const std::string& out) {
  TrainConfig c;
  c.data = data;
  c.out_dir = out;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.model.block_size = 16;
  c.batch_size = 4;
  c.max_iters = 30;
  c.warmup_iters = 5;
  c.lr_decay_iters = 30;
  c.learning_rate = 3e-3;
  c.eval_interval = 10;
  c.eval_iters = 2;
  c.sample_tokens = 0;
  c.threads = 1;
  c.json = true;  // keep the test log quiet: records go to the null stream below
  return c;
}

std::vector<nlohmann::json> read_metrics(const std::string& out_dir) {
  std::vector<nlohmann::json> v;
  std::ifstream in(fs::path(out_dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) v.push_back(nlohmann::json::parse(line));
  return v;
}

TrainerHooks quiet() { return trident::testing::quiet_hooks(); }
}  // namespace

TEST(Trainer, SameSeedIsBitIdenticalAndTheLossFalls) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainResult a = Trainer(tiny(data, (d.path / "a").string()), quiet()).run();
  TrainResult b = Trainer(tiny(data, (d.path / "b").string()), quiet()).run();
  ASSERT_EQ(a.losses.size(), 30u);
  for (size_t i = 0; i < a.losses.size(); ++i) ASSERT_EQ(a.losses[i], b.losses[i]) << "step " << i;
  EXPECT_EQ(a.val_loss, b.val_loss);
  EXPECT_LT(a.losses.back(), a.losses.front() - 0.3);
  EXPECT_NEAR(a.losses.front(), std::log(14.0), 0.3);  // ~uniform over the 14-character vocabulary at init
  TrainConfig c = tiny(data, (d.path / "c").string());
  c.model.seed = 7;
  TrainResult other = Trainer(c, quiet()).run();
  EXPECT_NE(other.losses[1], a.losses[1]);

  // metrics.jsonl: one record per step and per evaluation (steps 0, 10, 20 and after the last).
  auto recs = read_metrics((d.path / "a").string());
  int steps = 0, evals = 0;
  for (const auto& r : recs) {
    if (r["type"] == "step") {
      EXPECT_EQ(r["loss"].get<double>(), a.losses[r["step"].get<size_t>()]);
      for (const char* k : {"lr", "tokens_per_s", "elapsed"}) EXPECT_TRUE(r.contains(k)) << k;
      ++steps;
    } else if (r["type"] == "eval") {
      EXPECT_TRUE(r.contains("train_loss"));
      EXPECT_TRUE(r.contains("val_loss"));
      ++evals;
    }
  }
  EXPECT_EQ(steps, 30);
  EXPECT_EQ(evals, 4);
  // A "run" record names the CPU kernels and threads the speed came from.
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.front()["type"], "run");
  EXPECT_NE(recs.front().value("cpu_kernels", "").find("gemm float32"), std::string::npos) << recs.front().dump();
  // The final checkpoint exists and is at step 30.
  EXPECT_EQ(load_checkpoint(find_checkpoint((d.path / "a").string())).meta.step, 30);
}

// --offload optimizer: the same training bit for bit (on the CPU the offloaded update is the same kernel
// through plain copies), and checkpoints that do not depend on it: the offloaded run's step-6 checkpoint
// holds the same tensors as the plain run's, and resumes exactly with offload and without it.
// (Several ranks, ZeRO and tensor parallelism: tests/multiprocess/parallel/offload_test.cc and cli_test.cc.)
TEST(Trainer, OffloadedOptimizerTrainsAndResumesBitForBit) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig base = tiny(data, (d.path / "base").string());
  base.max_iters = 12;
  base.lr_decay_iters = 12;
  base.checkpoint_interval = 6;
  base.keep_checkpoints = 5;  // the step-6 one stays beside the later ones
  TrainResult plain = Trainer(base, quiet()).run();
  TrainConfig off = base;
  off.out_dir = (d.path / "off").string();
  off.offload = "optimizer";
  TrainResult offloaded = Trainer(off, quiet()).run();
  ASSERT_EQ(offloaded.losses.size(), plain.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(offloaded.losses[i], plain.losses[i]) << "step " << i;
  EXPECT_EQ(offloaded.val_loss, plain.val_loss);
  // Resume the offloaded run from its step-6 checkpoint: the moments it saved come back.
  TrainConfig again = off;
  again.out_dir = (d.path / "again").string();
  fs::create_directories(again.out_dir);
  fs::copy(fs::path(off.out_dir) / "ckpt-00000006", fs::path(again.out_dir) / "ckpt-00000006",
           fs::copy_options::recursive);
  again.resume = train::Resume::kYes;
  Trainer resumed(again, quiet());
  ASSERT_EQ(resumed.start_step(), 6);
  TrainResult rest = resumed.run();
  ASSERT_EQ(rest.losses.size(), 6u);
  for (size_t i = 0; i < rest.losses.size(); ++i) EXPECT_EQ(rest.losses[i], plain.losses[6 + i]) << "step " << 6 + i;
  // The same checkpoint resumed without offload, and the plain run's resumed with it.
  for (const auto& [from, offload] : {std::pair{off.out_dir, std::string("none")}, std::pair{base.out_dir, std::string("optimizer")}}) {
    TrainConfig other = base;
    other.offload = offload;
    other.out_dir = (d.path / ("cross-" + offload)).string();
    fs::create_directories(other.out_dir);
    fs::copy(fs::path(from) / "ckpt-00000006", fs::path(other.out_dir) / "ckpt-00000006", fs::copy_options::recursive);
    other.resume = train::Resume::kYes;
    TrainResult r = Trainer(other, quiet()).run();
    ASSERT_EQ(r.losses.size(), 6u);
    for (size_t i = 0; i < r.losses.size(); ++i)
      EXPECT_EQ(r.losses[i], plain.losses[6 + i]) << "offload " << offload << ", step " << 6 + i;
  }
  // The checkpoints' weights and optimizer state are the same tensors whether the run offloaded or not.
  const LoadedCheckpoint a = load_checkpoint((fs::path(base.out_dir) / "ckpt-00000006").string(), true);
  const LoadedCheckpoint b = load_checkpoint((fs::path(off.out_dir) / "ckpt-00000006").string(), true);
  ASSERT_FALSE(a.optimizer.empty());
  ASSERT_EQ(a.weights.size(), b.weights.size());
  ASSERT_EQ(a.optimizer.size(), b.optimizer.size());
  for (const auto* pair : {&a.weights, &a.optimizer}) {
    const auto& other = pair == &a.weights ? b.weights : b.optimizer;
    for (const auto& [name, t] : *pair) {
      ASSERT_TRUE(other.count(name)) << name;
      EXPECT_EQ(t.data, other.at(name).data) << name;
    }
  }
}

// On a GPU the trainer asks the planner for the run's device memory before it allocates anything there. A
// stand-in device that calls itself an H200 (tests/harness/counting_device.h, in a forked child) counts the
// allocations: a GPT of 48 layers 8192 wide (about 39B parameters, 16 bytes each in float32 training) is
// refused with OutOfMemory naming the bytes and the flags, and not one byte was allocated on the device; the
// tiny model passes the check and trains there.
TEST(Trainer, GpuRunThatCannotFitIsRefusedBeforeAnythingIsAllocated) {
  TempDir d;
  const std::string data = make_corpus(d.path);
  auto res = trident::testing::run_processes(1, [&](int, int, std::shared_ptr<Store>) {
    namespace cd = trident::testing::counting_device;
    cd::install("NVIDIA H200");
    TrainConfig big = tiny(data, (d.path / "big").string());
    big.model.device = "cuda";
    big.model.n_layer = 48;
    big.model.n_embd = 8192;
    big.model.n_head = 64;
    try {
      Trainer t(big, quiet());
      TRIDENT_RANK_CHECK(false, "a 39B-parameter model was accepted on one H200");
    } catch (const OutOfMemory& e) {
      const std::string w = e.what();
      TRIDENT_RANK_CHECK(static_cast<double>(e.bytes) > 16 * 38e9, "needed {} bytes", e.bytes);
      TRIDENT_RANK_CHECK(w.find("126900000000 bytes) usable") != std::string::npos && w.find("--offload optimizer") != std::string::npos,
                         "message: {}", w);
    }
    TRIDENT_RANK_CHECK(cd::counters().allocations == 0, "{} device allocations before the refusal",
                       cd::counters().allocations.load());
    TrainConfig small = tiny(data, (d.path / "small").string());
    small.model.device = "cuda";
    small.max_iters = 2;
    TrainResult r = Trainer(small, quiet()).run();
    TRIDENT_RANK_CHECK(r.losses.size() == 2 && cd::counters().allocations > 0, "the tiny model did not train");
  }, {.deadline_s = 120, .env = {}});
  EXPECT_EQ(trident::testing::failures(res), "");
}

TEST(Trainer, KillAndResumeReproducesTheLossSequenceBitForBit) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig full_cfg = tiny(data, (d.path / "full").string());
  full_cfg.gradient_accumulation_steps = 2;
  TrainResult full = Trainer(full_cfg, quiet()).run();
  ASSERT_EQ(full.losses.size(), 30u);

  for (int crash_at : {13, 10}) {
    std::string out = (d.path / fmt::format("crash{}", crash_at)).string();
    TrainConfig cfg = full_cfg;
    cfg.out_dir = out;
    cfg.checkpoint_interval = 5;
    // "Kill" the run inside step crash_at (after its backward): checkpoints exist at 5 and 10.
    TrainerHooks h = quiet();
    int calls = 0;
    h.after_backward = [&](nn::Model&) {
      if (calls++ == crash_at) throw std::runtime_error("simulated crash");
    };
    EXPECT_THROW(Trainer(cfg, h).run(), std::runtime_error);
    EXPECT_EQ(load_checkpoint(find_checkpoint(out)).meta.step, 10);

    cfg.resume = train::Resume::kYes;
    Trainer resumed(cfg, quiet());
    EXPECT_EQ(resumed.start_step(), 10);
    TrainResult r = resumed.run();
    ASSERT_EQ(r.losses.size(), 20u);
    for (size_t i = 0; i < r.losses.size(); ++i) {
      ASSERT_EQ(r.losses[i], full.losses[10 + i]) << "step " << 10 + i << " after a crash at " << crash_at;
    }
    EXPECT_EQ(r.val_loss, full.val_loss);
    // The metrics file reads as one uninterrupted run: every step once, with the same losses.
    auto recs = read_metrics(out);
    std::vector<double> losses;
    int evals = 0;
    for (const auto& rec : recs) {
      if (rec["type"] == "step") {
        EXPECT_EQ(rec["step"].get<size_t>(), losses.size());
        losses.push_back(rec["loss"].get<double>());
      }
      evals += rec["type"] == "eval";
    }
    EXPECT_EQ(losses, full.losses);
    EXPECT_EQ(evals, 4);
  }
}

TEST(Trainer, EpochSamplerResumesExactly) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig cfg = tiny(data, (d.path / "full").string());
  cfg.sampler = "epoch";
  cfg.max_iters = 16;
  cfg.lr_decay_iters = 16;
  cfg.batch_size = 16;  // ~42 windows per epoch of the train split: 16 steps span several epochs
  TrainResult full = Trainer(cfg, quiet()).run();
  cfg.out_dir = (d.path / "part").string();
  cfg.max_iters = 7;  // stop early (the lr schedule depends on lr_decay_iters, not max_iters)
  Trainer(cfg, quiet()).run();
  cfg.max_iters = 16;
  cfg.resume = train::Resume::kYes;
  TrainResult rest = Trainer(cfg, quiet()).run();
  ASSERT_EQ(rest.losses.size(), 9u);
  for (size_t i = 0; i < 9; ++i) ASSERT_EQ(rest.losses[i], full.losses[7 + i]) << "step " << 7 + i;
  EXPECT_EQ(rest.val_loss, full.val_loss);
}

// Gradient accumulation as nanoGPT and PyTorch define it: k micro-batches of B rows, each loss divided by k,
// make exactly one step over the kB rows together. With the epoch sampler, micro-batch m of step s holds the
// rows [(s k + m) B, ...) of the epoch's order, so both runs see the same rows. Loss, pre-clip gradient norm,
// the clipping decision and the weights after each step agree to float32 rounding (1e-5).
TEST(Trainer, AccumulatedMicroBatchesEqualOneBatchOfAllTheirRows) {
  TempDir d;
  std::string data = make_corpus(d.path);
  auto run = [&](int batch, int accum, const std::string& name) {
    TrainConfig cfg = tiny(data, (d.path / name).string());
    cfg.sampler = "epoch";
    cfg.batch_size = batch;
    cfg.gradient_accumulation_steps = accum;
    cfg.max_iters = 4;  // 32 of the ~42 windows of one epoch: no epoch boundary inside the run
    cfg.lr_decay_iters = 4;
    cfg.warmup_iters = 1;
    cfg.eval_interval = 100;
    cfg.grad_clip = 0.5;
    Trainer(cfg, quiet()).run();
    return cfg.out_dir;
  };
  const std::string one = run(8, 1, "one"), acc = run(2, 4, "accum");
  auto steps = [&](const std::string& out) {
    std::vector<nlohmann::json> v;
    for (auto& r : read_metrics(out))
      if (r["type"] == "step") v.push_back(r);
    return v;
  };
  const auto a = steps(one), b = steps(acc);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t s = 0; s < a.size(); ++s) {
    const double la = a[s]["loss"], lb = b[s]["loss"], ga = a[s]["grad_norm"], gb = b[s]["grad_norm"];
    EXPECT_NEAR(lb, la, 1e-5 * la) << "loss at step " << s;
    EXPECT_NEAR(gb, ga, 1e-5 * ga) << "pre-clip gradient norm at step " << s;
    EXPECT_GT(ga, 0.5) << "step " << s << " was not clipped: the clipping decision went untested";
  }
  const auto wa = load_checkpoint(find_checkpoint(one)).weights, wb = load_checkpoint(find_checkpoint(acc)).weights;
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, ta] : wa) {
    const auto& tb = wb.at(name).data;
    double ss = 0;
    for (float v : ta.data) ss += double(v) * v;
    const double scale = std::max(1e-6, std::sqrt(ss / static_cast<double>(ta.data.size())));
    double worst = 0;
    for (size_t i = 0; i < ta.data.size(); ++i) worst = std::max(worst, std::abs(double(tb[i]) - ta.data[i]) / scale);
    EXPECT_LT(worst, 1e-5) << name << " after 4 steps";
  }
}

// A gradient made NaN in one parameter at step 3: the run stops there, naming the step and that parameter,
// before the update and without saving; with on_nonfinite = skip the step is skipped and counted, the others
// train, and the final checkpoint is finite.
TEST(Trainer, NonFiniteGradientStopsNamingTheStepAndParameterOrIsSkipped) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig c = tiny(data, (d.path / "stop").string());
  c.max_iters = 8;
  c.eval_interval = 2;
  c.always_save_checkpoint = true;
  std::string victim;
  auto plant = [&](TrainerHooks h) {
    auto step = std::make_shared<int>(0);
    h.after_backward = [&victim, step](nn::Model& m) {
      if ((*step)++ != 3) return;
      const nn::Parameter& p = m.parameters()[m.parameters().size() / 2];
      victim = p.name;
      m.grad_data()[p.offset + p.numel - 1] = std::nanf("");
    };
    return h;
  };
  try {
    Trainer(c, plant(quiet())).run();
    FAIL() << "a NaN gradient did not stop the run";
  } catch (const NonFiniteError& e) {
    EXPECT_EQ(e.step, 3);
    EXPECT_EQ(e.parameter, victim);
  }
  // Checkpoints at steps 2 (evaluation); none at or after the failed step.
  EXPECT_EQ(load_checkpoint(find_checkpoint(c.out_dir)).meta.step, 2);

  c.out_dir = (d.path / "skip").string();
  c.on_nonfinite = "skip";
  TrainResult r = Trainer(c, plant(quiet())).run();
  EXPECT_EQ(r.nonfinite_skips, 1);
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_TRUE(std::isfinite(r.losses.back()));
  int skipped = 0;
  for (const auto& rec : read_metrics(c.out_dir)) {
    if (rec["type"] != "step") continue;
    if (rec.value("skipped", false)) {
      ++skipped;
      EXPECT_EQ(rec["step"], 3);
    }
    if (rec["step"].get<int>() >= 3) {
      EXPECT_EQ(rec["nonfinite_skips"], 1) << rec.dump();
    }
  }
  EXPECT_EQ(skipped, 1);
  auto ck = load_checkpoint(find_checkpoint(c.out_dir));  // refuses non-finite values
  EXPECT_EQ(ck.meta.step, 8);
}

// A loss that is not finite (the model's output overflowed) stops the run the same way.
TEST(Trainer, NonFiniteLossStops) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig c = tiny(data, (d.path / "o").string());
  c.max_iters = 4;
  TrainerHooks h = quiet();
  int calls = 0;
  h.forward_backward = [&](const int32_t*, const int32_t*, int, int, bool backward, float) {
    return backward && calls++ == 2 ? std::numeric_limits<double>::infinity() : 1.0;
  };
  try {
    Trainer(c, h).run();
    FAIL() << "an infinite loss did not stop the run";
  } catch (const NonFiniteError& e) {
    EXPECT_EQ(e.step, 2);
    EXPECT_EQ(e.parameter, "");  // the gradients (all zero here) are finite
  }
}

// save_checkpoint refuses a model or optimizer state holding a NaN, before writing anything.
TEST(Checkpoint, NonFiniteStateIsNeverWritten) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig c = tiny(data, (d.path / "o").string());
  c.max_iters = 2;
  Trainer t(c, quiet());
  t.run();
  const std::string before = find_checkpoint(c.out_dir);
  const nn::Parameter& p = t.model().parameters()[1];
  t.model().param_data()[p.offset] = std::numeric_limits<float>::infinity();
  try {
    t.save(5);
    FAIL() << "a checkpoint with an infinite weight was written";
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "'" + p.name + "'");
  }
  EXPECT_EQ(find_checkpoint(c.out_dir), before);
  EXPECT_FALSE(fs::exists(fs::path(c.out_dir) / "ckpt-00000005"));
}

TEST(Trainer, ResumeErrors) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig c = tiny(data, (d.path / "o").string());
  c.resume = train::Resume::kYes;
  try {
    Trainer t(c, quiet());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "no checkpoint in out_dir");
  }
  c.resume = train::Resume::kNo;
  c.max_iters = 3;
  Trainer(c, quiet()).run();
  c.resume = train::Resume::kYes;
  c.model.n_embd = 32;
  try {
    Trainer t(c, quiet());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "n_embd=32");
    EXPECT_CONTAINS(e.what(), "n_embd=16");
  }
}

TEST(Trainer, ResumeAutoStartsFreshWithoutACheckpointAndContinuesFromOne) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig full_cfg = tiny(data, (d.path / "full").string());
  full_cfg.max_iters = 12;
  full_cfg.lr_decay_iters = 12;
  TrainResult full = Trainer(full_cfg, quiet()).run();

  TrainConfig c = full_cfg;
  c.out_dir = (d.path / "auto").string();
  c.resume = Resume::kAuto;
  c.checkpoint_interval = 4;
  {
    Trainer t(c, quiet());  // no out_dir yet: a fresh start, as resume=false
    EXPECT_EQ(t.start_step(), 0);
    TrainerHooks h = quiet();
    int calls = 0;
    h.after_backward = [&](nn::Model&) {
      if (calls++ == 9) throw std::runtime_error("simulated crash in step 9");
    };
    EXPECT_THROW(Trainer(c, h).run(), std::runtime_error);
  }
  // The checkpoint of step 8 was written asynchronously; the crash waited for it (destructor) and it is
  // complete: auto continues from it, and the continuation is the uninterrupted run bit for bit.
  Trainer resumed(c, quiet());
  EXPECT_EQ(resumed.start_step(), 8);
  TrainResult r = resumed.run();
  ASSERT_EQ(r.losses.size(), 4u);
  for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], full.losses[8 + i]) << "step " << 8 + i;
  EXPECT_EQ(r.val_loss, full.val_loss);
  EXPECT_EQ(io::read_file((fs::path(r.last_checkpoint) / "model.safetensors").string()),
            io::read_file((fs::path(full.last_checkpoint) / "model.safetensors").string()));
  EXPECT_EQ(io::read_file((fs::path(r.last_checkpoint) / "optimizer.safetensors").string()),
            io::read_file((fs::path(full.last_checkpoint) / "optimizer.safetensors").string()));
  // Synchronous checkpoints write the same bytes.
  TrainConfig s = full_cfg;
  s.out_dir = (d.path / "sync").string();
  s.async_checkpoint = false;
  TrainResult sync = Trainer(s, quiet()).run();
  EXPECT_EQ(io::read_file((fs::path(sync.last_checkpoint) / "model.safetensors").string()),
            io::read_file((fs::path(full.last_checkpoint) / "model.safetensors").string()));
}

// save_final=false: a run ends without writing a checkpoint (a benchmark of a model whose weights and
// moments the disk cannot hold), where the default writes one; the losses are the same.
TEST(Trainer, SaveFinalFalseWritesNoCheckpointAtTheEnd) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig c = tiny(data, (d.path / "saved").string());
  c.eval_interval = 100000;  // no evaluation saves within the run
  TrainResult saved = Trainer(c, quiet()).run();
  EXPECT_FALSE(saved.last_checkpoint.empty());
  EXPECT_TRUE(fs::exists(fs::path(saved.last_checkpoint) / "model.safetensors"));
  c.out_dir = (d.path / "unsaved").string();
  c.save_final = false;
  TrainResult unsaved = Trainer(c, quiet()).run();
  EXPECT_TRUE(unsaved.last_checkpoint.empty()) << unsaved.last_checkpoint;
  size_t entries = 0;
  if (fs::exists(c.out_dir))
    for (const auto& e : fs::recursive_directory_iterator(c.out_dir))
      entries += e.path().filename().string().find("safetensors") != std::string::npos ? 1 : 0;
  EXPECT_EQ(entries, 0u) << "a checkpoint file in " << c.out_dir;
  EXPECT_EQ(unsaved.losses, saved.losses);
}

TEST(Trainer, EvaluateWindowsMatchesAnIndependentCrossEntropy) {
  TempDir d;
  std::string data = make_corpus(d.path);
  TrainConfig c = tiny(data, (d.path / "o").string());
  c.max_iters = 5;
  Trainer t(c, quiet());
  t.run();
  auto span = t.dataset().span(data::Split::kVal);
  const int T = c.model.block_size, K = 11;  // K not a multiple of the internal batch of 8
  double got = evaluate_windows(t.model(), span, T, K);
  // Reference: logits of each window alone, log-softmax in double, mean over K*T positions.
  const int V = t.dataset().tokenizer().vocab_size();
  double sum = 0;
  std::vector<int32_t> x(T), y(T);
  std::vector<float> logits(static_cast<size_t>(T) * V);
  for (int w = 0; w < K; ++w) {
    span.copy(static_cast<size_t>(w) * T, T, x.data());
    span.copy(static_cast<size_t>(w) * T + 1, T, y.data());
    t.model().forward_logits(x.data(), 1, T, logits.data());
    for (int p = 0; p < T; ++p) {
      const float* l = logits.data() + static_cast<size_t>(p) * V;
      double mx = *std::max_element(l, l + V), z = 0;
      for (int v = 0; v < V; ++v) z += std::exp(static_cast<double>(l[v]) - mx);
      sum += -(static_cast<double>(l[y[p]]) - mx - std::log(z));
    }
  }
  EXPECT_NEAR(got, sum / (K * T), 1e-4);
  EXPECT_EQ(got, evaluate_windows(t.model(), span, T, K));  // deterministic
  EXPECT_THROW(evaluate_windows(t.model(), span, T, 100000), InvalidArgument);
}

TEST(Generate, SamplingRespectsTemperatureAndTopK) {
  std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.0f};
  EXPECT_EQ(sample_logits(logits.data(), 4, 0.0, 0, 0.7), 1);  // greedy
  // top_k = 2 keeps tokens 1 and 3 with softmax weights e^3 : e^2.
  double p1 = std::exp(3.0) / (std::exp(3.0) + std::exp(2.0));
  EXPECT_EQ(sample_logits(logits.data(), 4, 1.0, 2, p1 - 1e-9), 1);
  EXPECT_EQ(sample_logits(logits.data(), 4, 1.0, 2, p1 + 1e-9), 3);
  EXPECT_EQ(sample_logits(logits.data(), 4, 1.0, 2, 0.999999), 3);
  // Full softmax: the first token (weight 1) owns [0, 1/Z).
  double z = 1 + std::exp(3.0) + std::exp(1.0) + std::exp(2.0);
  EXPECT_EQ(sample_logits(logits.data(), 4, 1.0, 0, 0.5 / z), 0);
  EXPECT_EQ(sample_logits(logits.data(), 4, 1.0, 0, 1.5 / z), 1);
}
