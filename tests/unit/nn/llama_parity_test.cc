// The Llama agrees with a reference Llama in PyTorch (tests/unit/nn/llama_torch.py, float64, written from
// Hugging Face's LlamaForCausalLM semantics) built from trident's weights: logits, loss and every gradient to
// 1e-5 relative, for full, grouped-query and multi-query attention, tied and untied heads, Llama 3.1's
// rope_scaling, and bfloat16 products (to bfloat16's precision). Skipped when /usr/bin/python3 cannot import
// torch (a failure under CI=true: harness/skip.h).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "harness/skip.h"
#include "harness/torch_reference.h"
#include "trident/nn/models.h"

namespace {

struct Case {
  std::string name;
  nlohmann::json cfg;
  double tol = 1e-5;
  int accum = 1;  // > 1: trident accumulates the batch's gradient over this many micro-batches
};

void check_against_torch(const Case& c) {
  auto m = trident::nn::make_model(c.cfg);
  ASSERT_EQ(m->kind(), "llama");
  // Perturb every parameter: unit RMSNorm weights would hide a bug in their gradients' use of them.
  std::mt19937_64 g(5);
  std::normal_distribution<float> nd(0.0f, 0.2f);
  for (const auto& p : m->parameters())
    for (size_t i = 0; i < p.numel; ++i) m->param_data()[p.offset + i] += nd(g);
  const int B = 2 * c.accum, T = c.cfg.value("block_size", 8), V = c.cfg["vocab_size"];
  std::vector<int32_t> x(B * T), y(B * T);
  for (int i = 0; i < B * T; ++i) x[i] = static_cast<int32_t>(g() % V), y[i] = static_cast<int32_t>(g() % V);

  trident::testing::expect_matches_torch(*m, TRIDENT_SOURCE_DIR "/tests/unit/nn/llama_torch.py", B, T, x, y, c.tol,
                                         c.name, c.accum);
}

nlohmann::json llama(int kv, bool tied = false) {
  return {{"kind", "llama"}, {"n_layer", 2},          {"n_head", 4},        {"n_kv_head", kv},
          {"n_embd", 32},    {"intermediate_size", 40}, {"block_size", 9},  {"vocab_size", 29},
          {"seed", 11},      {"norm_eps", 1e-5},        {"rope_theta", 500.0}, {"tie_embeddings", tied}};
}

}  // namespace

TEST(LlamaParity, FullGroupedAndMultiQueryAttentionMatchPyTorch) {
  if (!trident::testing::have_torch()) TRIDENT_SKIP_MISSING("/usr/bin/python3 has no torch (apt-get install python3-torch)");
  check_against_torch({"full attention", llama(4)});
  check_against_torch({"grouped-query", llama(2)});
  check_against_torch({"multi-query", llama(1)});
  check_against_torch({"grouped-query, gradients accumulated over 3 micro-batches", llama(2), 1e-5, 3});
}

TEST(LlamaParity, TiedHeadAndLlama3RopeScalingMatchPyTorch) {
  if (!trident::testing::have_torch()) TRIDENT_SKIP_MISSING("/usr/bin/python3 has no torch (apt-get install python3-torch)");
  check_against_torch({"tied head", llama(2, true)});
  nlohmann::json scaled = llama(2);
  // Wavelengths on both sides of the band and inside it at these sizes (hd 8, theta 500, 16 original positions).
  scaled["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 16}};
  check_against_torch({"llama3 rope_scaling", scaled});
}

TEST(LlamaParity, BFloat16ProductsStayWithinBFloat16OfPyTorch) {
  if (!trident::testing::have_torch()) TRIDENT_SKIP_MISSING("/usr/bin/python3 has no torch (apt-get install python3-torch)");
  nlohmann::json cfg = llama(2);
  cfg["dtype"] = "bfloat16";
  check_against_torch({"bfloat16", cfg, 3e-2});
}
