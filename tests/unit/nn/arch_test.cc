// Architectures as data (nn/arch/): the table of descriptors, each one's declarations (Hugging Face's names
// for the Llama, forward order, shapes from the config, tensor-parallel splits) and its configuration rules,
// each refusal naming the key, what was found and what would work.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "harness/temp_dir.h"
#include "trident/core/error.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/nn/arch/architecture.h"
#include "trident/nn/flat_model.h"
#include "trident/nn/models.h"

namespace trident::nn {
namespace {

nlohmann::json llama_cfg() {
  return {{"kind", "llama"}, {"n_layer", 2}, {"n_head", 4}, {"n_kv_head", 2}, {"n_embd", 32},
          {"intermediate_size", 48}, {"block_size", 16}, {"vocab_size", 24}};
}

std::string error_of(const nlohmann::json& j) {
  try {
    ModelConfig::from_json(j);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Architecture, TableNamesEveryKindAndRefusesOthersByName) {
  EXPECT_EQ(architecture_kinds(), (std::vector<std::string>{"gpt", "llama", "mlp"}));
  for (const auto& k : architecture_kinds()) EXPECT_EQ(architecture(k).kind(), k);
  try {
    architecture("mamba");
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "'mamba'");
    EXPECT_CONTAINS(e.what(), "gpt, llama, mlp");
  }
  EXPECT_CONTAINS(error_of({{"kind", "mamba"}, {"vocab_size", 8}}), "gpt|llama|mlp");
}

TEST(Architecture, LlamaDeclaresHuggingFaceNamesInForwardOrder) {
  const ModelConfig c = ModelConfig::from_json(llama_cfg());
  EXPECT_FALSE(c.bias);
  EXPECT_EQ(c.tie_embeddings, std::optional<bool>(false));  // the Llama's default
  const auto d = declare_params(c, 0, 2, true, true);
  std::vector<std::string> names;
  for (const auto& p : d) names.push_back(p.name);
  const std::vector<std::string> layer0 = {
      "model.layers.0.input_layernorm.weight",          "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",         "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",         "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",            "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight"};
  ASSERT_EQ(names.size(), 1 + 2 * layer0.size() + 2);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  for (size_t i = 0; i < layer0.size(); ++i) EXPECT_EQ(names[1 + i], layer0[i]);
  EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  // Shapes: q [H hd, C], k and v [KV hd, C], o [C, H hd], gate and up [I, C], down [C, I]; no biases.
  EXPECT_EQ(d[2].shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(d[3].shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(d[5].shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(d[7].shape, (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(d[9].shape, (std::vector<int64_t>{32, 48}));
  // Tensor parallelism: key/value projections split when tp divides n_kv_head, else copied whole.
  EXPECT_EQ(declare_params(c, 0, 1, false, false, false, 2)[2].split, Split::kRows);
  EXPECT_EQ(declare_params(c, 0, 1, false, false, false, 4)[2].split, Split::kReplicated);
  EXPECT_EQ(declare_params(c, 0, 1, false, false, false, 4)[1].split, Split::kRows);  // q by heads
  EXPECT_EQ(declare_params(c, 0, 1, false, false, false, 4)[4].split, Split::kCols);  // o_proj

  // The model registers them: make_model's parameters are the declarations, and its blocks are named too.
  auto m = make_model(llama_cfg());
  ASSERT_EQ(m->parameters().size(), d.size());
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(m->parameters()[i].name, d[i].name);
  EXPECT_EQ(m->blocks()[1].name, "model.layers.0");
  nlohmann::json tied = llama_cfg();
  tied["tie_embeddings"] = true;
  EXPECT_EQ(make_model(tied)->parameters().back().name, "model.norm.weight");
}

TEST(Architecture, LlamaConfigRefusalsNameTheKeyAndTheFix) {
  nlohmann::json j = llama_cfg();
  j["n_kv_head"] = 3;
  std::string m = error_of(j);
  EXPECT_CONTAINS(m, "n_head 4 is not divisible by n_kv_head 3");
  EXPECT_CONTAINS(m, "1, 2, 4");
  j = llama_cfg();
  j["bias"] = true;
  EXPECT_CONTAINS(error_of(j), "no biases");
  j = llama_cfg();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_CONTAINS(error_of(j), "rope_scaling type 'yarn' is not supported");
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}};  // the old spelling of the key, fields missing
  EXPECT_CONTAINS(error_of(j), "'low_freq_factor'");
  j = llama_cfg();
  j["n_embd"] = 36;  // head dimension 9: rotary embeddings rotate pairs
  EXPECT_CONTAINS(error_of(j), "even whole head dimension");
  j = llama_cfg();
  j["rope_theta"] = -1;
  EXPECT_CONTAINS(error_of(j), "'rope_theta' must be a number > 0");
  // The GPT keeps its own rules: full attention, a tied head, learned positions.
  EXPECT_CONTAINS(error_of({{"kind", "gpt"}, {"vocab_size", 8}, {"n_kv_head", 2}}), "grouped-query attention is kind llama's");
  EXPECT_CONTAINS(error_of({{"kind", "gpt"}, {"vocab_size", 8}, {"rope_scaling", {{"rope_type", "llama3"}}}}),
                  "learns its positions");
  EXPECT_CONTAINS(error_of({{"kind", "gpt"}, {"vocab_size", 8}, {"tie_embeddings", false}}), "always ties");
  // Defaults resolved by the architecture: SwiGLU width ~8/3 n_embd rounded up to 32; the GPT's 4 n_embd.
  nlohmann::json d = llama_cfg();
  d.erase("intermediate_size");
  EXPECT_EQ(ModelConfig::from_json(d).intermediate_size, 96);  // 8 * 32 / 3 = 85 -> 96
  EXPECT_EQ(ModelConfig::from_json({{"kind", "gpt"}, {"vocab_size", 8}, {"n_embd", 12}, {"n_head", 2}}).intermediate_size,
            48);
}

TEST(Architecture, TensorParallelChecksNameWhatWorks) {
  ModelConfig c = ModelConfig::from_json(llama_cfg());
  const Architecture& a = architecture(c.kind);
  EXPECT_NO_THROW(a.check_tp(c, 2));
  EXPECT_NO_THROW(a.check_tp(c, 4));  // n_kv_head 2: copies on every rank
  try {
    a.check_tp(c, 3);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "tp=3 does not divide n_head=4");
    EXPECT_CONTAINS(e.what(), "1, 2, 4");
  }
  c.intermediate_size = 50;
  EXPECT_THROW(a.check_tp(c, 4), InvalidArgument);
}

TEST(Architecture, ConfigRoundTripsThroughJson) {
  nlohmann::json j = llama_cfg();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 16}};
  j["rope_theta"] = 500000.0;
  j["norm_eps"] = 1e-6;
  const ModelConfig c = ModelConfig::from_json(j);
  const ModelConfig d = ModelConfig::from_json(c.to_json());
  EXPECT_EQ(c.to_json(), d.to_json());
  EXPECT_EQ(d.kv_heads(), 2);
  EXPECT_EQ(d.rope_theta, 500000.0);
  EXPECT_EQ(d.norm_eps, 1e-6);
  EXPECT_EQ(d.rope_scaling["factor"], 8.0);
}

TEST(Architecture, RopeTableFollowsLlama3Scaling) {
  // head_dim 8, theta 10000: inverse frequencies 1, 0.1, 0.01, 0.001 (wavelengths 2 pi / f). With factor 8,
  // low 1, high 4 and 1024 original positions, wavelengths above 1024 are divided by 8, below 256 kept, and the
  // band between interpolated.
  const nlohmann::json s = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 1024}};
  RopeTable plain(8, 4, 10000.0, nullptr), scaled(8, 4, 10000.0, s);
  EXPECT_DOUBLE_EQ(plain.inv_freq()[1], 0.1);
  EXPECT_DOUBLE_EQ(scaled.inv_freq()[0], 1.0);     // wavelength 6.3: kept
  EXPECT_DOUBLE_EQ(scaled.inv_freq()[1], 0.1);     // 62.8: kept
  const double f2 = 0.01, wl2 = 2 * M_PI / f2;     // 628: inside the band
  const double smooth = (1024 / wl2 - 1.0) / 3.0;
  EXPECT_NEAR(scaled.inv_freq()[2], (1 - smooth) * f2 / 8 + smooth * f2, 1e-15);
  EXPECT_DOUBLE_EQ(scaled.inv_freq()[3], 0.001 / 8);  // 6283: divided
}

// A padded vocabulary (rows rounded up for tensor parallelism or the GPU) changes nothing: the padding ids'
// logits are -inf, so the loss and every gradient equal those of the unpadded model with the same weights, and
// the padding rows' gradients are 0. At every ISA level the machine has (each has its own softmax).
TEST(Architecture, PaddedVocabularyTakesNoProbability) {
  namespace kc = kernels::cpu;
  const kc::Isa was = kc::active_isa();
  for (int level = 0; level <= static_cast<int>(kc::machine_isa()); ++level) {
    kc::set_isa(static_cast<kc::Isa>(level));
    for (const char* kind : {"gpt", "llama"}) {
      SCOPED_TRACE(std::string(kind) + " at " + kc::isa_name(kc::active_isa()));
      nlohmann::json small = {{"kind", kind}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 8},
                              {"vocab_size", 13}, {"seed", 3}};
      nlohmann::json padded = small;
      padded["vocab_size"] = 16;
      padded["valid_vocab_size"] = 13;
      auto a = make_model(small), b = make_model(padded);
      // b's weights: a's, the padding rows of the embedding and head random (they must not matter).
      for (size_t i = 0; i < a->parameters().size(); ++i) {
        const auto &pa = a->parameters()[i], &pb = b->parameters()[i];
        ASSERT_EQ(pa.name, pb.name);
        std::copy_n(a->param_data() + pa.offset, pa.numel, b->param_data() + pb.offset);
        for (size_t j = pa.numel; j < pb.numel; ++j) b->param_data()[pb.offset + j] = 0.5f * std::sin(float(j));
      }
      std::vector<int32_t> x = {1, 5, 12, 0, 7, 3, 3, 9}, y = {5, 12, 0, 7, 3, 3, 9, 11};
      a->zero_grad();
      b->zero_grad();
      const float la = a->forward_backward(x.data(), y.data(), 1, 8, true);
      const float lb = b->forward_backward(x.data(), y.data(), 1, 8, true);
      EXPECT_FLOAT_EQ(la, lb);
      for (size_t i = 0; i < a->parameters().size(); ++i) {
        const auto &pa = a->parameters()[i], &pb = b->parameters()[i];
        for (size_t j = 0; j < pa.numel; ++j)
          ASSERT_NEAR(a->grad_data()[pa.offset + j], b->grad_data()[pb.offset + j], 1e-6) << pa.name << " " << j;
        for (size_t j = pa.numel; j < pb.numel; ++j) ASSERT_EQ(b->grad_data()[pb.offset + j], 0.0f) << pb.name;
      }
      std::vector<float> logits(8 * 16);
      b->forward_logits(x.data(), 1, 8, logits.data());
      for (int r = 0; r < 8; ++r)
        for (int v = 13; v < 16; ++v) EXPECT_EQ(logits[r * 16 + v], -INFINITY);
    }
  }
  kc::set_isa(was);
}


// Deferred initialization: a model built without its initial values holds none (its buffer's pages are not
// even resident), and initialize_range() draws any part of it exactly as the fully initialized model holds
// it, whatever the order and the cut points (partial rows, parts of one tensor, runs across tensors).
TEST(Architecture, DeferredInitializationDrawsAnyRangeAsTheFullModel) {
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  for (const char* kind : {"gpt", "llama"}) {
    SCOPED_TRACE(kind);
    nlohmann::json cfg = {{"kind", kind}, {"n_layer", 3},     {"n_head", 4},         {"n_embd", 128},
                          {"block_size", 32}, {"vocab_size", 515}, {"seed", 7}};
    if (std::string(kind) == "llama") cfg["n_kv_head"] = 2;
    auto full = make_model(cfg);
    auto lazy = make_model(cfg, false);
    EXPECT_TRUE(full->initialized());
    EXPECT_FALSE(lazy->initialized());
    const size_t n = lazy->num_params();
    ASSERT_EQ(n, full->num_params());
    ASSERT_GT(n * 4, size_t{1} << 21);  // large enough to be mapped memory (kernels/device.cc)
    EXPECT_LE(static_cast<double>(resident_bytes(lazy->param_data(), n * 4)), 2 * page);  // nothing drawn yet
    // One range in the middle: only it is written (and resident), and it equals the full model there.
    const size_t a = n / 3 + 17, b = n / 2 + 1001;
    lazy->initialize_range(a, b);
    // (Measured before anything reads the rest: a read maps the zero page, which mincore counts.)
    EXPECT_LE(static_cast<double>(resident_bytes(lazy->param_data(), n * 4)), (b - a) * 4.0 + 4 * page);
    const float* got = lazy->param_data();
    const float* want = full->param_data();
    EXPECT_EQ(std::memcmp(got + a, want + a, (b - a) * 4), 0);
    EXPECT_TRUE(std::all_of(got, got + a, [](float v) { return v == 0.0f; }));
    EXPECT_TRUE(std::all_of(got + b, got + n, [](float v) { return v == 0.0f; }));
    // The rest in scrambled pieces with odd cut points: the whole model, bit for bit.
    std::vector<size_t> cuts = {0, 1, 63, 127, 129, a, b, b + 3, n - 5, n};
    for (size_t k = 1; k < 40; ++k) cuts.push_back((k * 7919 * 131) % n);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t k = cuts.size() - 1; k-- > 0;) {
      if (cuts[k] >= a && cuts[k + 1] <= b) continue;
      lazy->initialize_range(cuts[k], cuts[k + 1]);
    }
    EXPECT_EQ(std::memcmp(got, want, n * 4), 0);
  }
  auto m = make_model({{"kind", "gpt"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}, {"block_size", 4},
                       {"vocab_size", 11}}, false);
  EXPECT_THROW(m->initialize_range(0, m->num_params() + 1), InvalidArgument);
}

}  // namespace
}  // namespace trident::nn
