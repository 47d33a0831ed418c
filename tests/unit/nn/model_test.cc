// The whole GPT and deep MLP: gradients against finite differences of the float64 reference model,
// activation checkpointing, determinism, hook order, config validation, bfloat16 compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "reference.h"
#include "trident/core/error.h"
#include "trident/nn/models.h"

using ref::Vec;
using trident::nn::Model;

namespace {

nlohmann::json tiny_gpt(bool bias = true) {
  return {{"kind", "gpt"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 8}, {"block_size", 5},
          {"vocab_size", 11}, {"bias", bias}, {"seed", 7}};
}

std::vector<int32_t> tokens(int n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % V);
  return t;
}

ref::Params params_of(Model& m) {
  ref::Params p;
  for (const auto& prm : m.parameters())
    p[prm.name] = Vec(m.param_data() + prm.offset, m.param_data() + prm.offset + prm.numel);
  return p;
}

// Compares the model's gradient of every parameter with central differences of the reference loss.
void check_model_gradients(Model& m, const std::function<double(const ref::Params&)>& ref_loss, double tol) {
  ref::Params p = params_of(m);
  double worst = 0;
  std::string worst_name;
  for (const auto& prm : m.parameters()) {
    Vec g = ref::fd_grad(p[prm.name], [&](const Vec& v) {
      ref::Params q = p;
      q[prm.name] = v;
      return ref_loss(q);
    });
    double num = 0, den = 1e-12;
    for (size_t i = 0; i < prm.numel; ++i) {
      num = std::max(num, std::abs(m.grad_data()[prm.offset + i] - g[i]));
      den = std::max(den, std::abs(g[i]));
    }
    EXPECT_LT(num / den, tol) << prm.name;
    if (num / den > worst) worst = num / den, worst_name = prm.name;
  }
  std::printf("worst relative gradient error %.3g (%s)\n", worst, worst_name.c_str());
}

}  // namespace

TEST(Gpt, ParameterNamesShapesAndInitFollowNanoGpt) {
  auto m = trident::nn::make_model(tiny_gpt());
  const auto& ps = m->parameters();
  ASSERT_EQ(ps.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(ps[0].name, "transformer.wte.weight");
  EXPECT_EQ(ps[0].shape, (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(ps[1].name, "transformer.wpe.weight");
  EXPECT_EQ(ps[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(ps[4].shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(ps[13].name, "transformer.h.0.mlp.c_proj.bias");
  EXPECT_EQ(ps[12].shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(ps.back().name, "transformer.ln_f.bias");
  size_t total = 0;
  for (const auto& p : ps) {
    EXPECT_EQ(p.offset % 16, 0u) << p.name;  // 64-byte aligned
    EXPECT_EQ(p.weight_decay, p.shape.size() >= 2) << p.name;
    total += p.numel;
    const float* v = m->param_data() + p.offset;
    const bool is_ln_w = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
    if (is_ln_w) {
      EXPECT_TRUE(std::all_of(v, v + p.numel, [](float x) { return x == 1.0f; })) << p.name;
    } else if (p.name.ends_with(".bias")) {
      EXPECT_TRUE(std::all_of(v, v + p.numel, [](float x) { return x == 0.0f; })) << p.name;
    }
  }
  EXPECT_EQ(total, 11u * 8 + 5 * 8 + 2 * (12 * 64 + 13 * 8) + 16);
  EXPECT_LE(total, m->num_params());
  // Init std on a larger model: 0.02, and 0.02/sqrt(2 n_layer) for c_proj weights.
  auto big = trident::nn::make_model({{"n_layer", 2}, {"n_head", 4}, {"n_embd", 128}, {"vocab_size", 100}});
  auto stddev = [&](const std::string& name) {
    for (const auto& p : big->parameters())
      if (p.name == name) {
        double s = 0;
        for (size_t i = 0; i < p.numel; ++i) s += double(big->param_data()[p.offset + i]) * big->param_data()[p.offset + i];
        return std::sqrt(s / p.numel);
      }
    return -1.0;
  };
  EXPECT_NEAR(stddev("transformer.h.1.mlp.c_fc.weight"), 0.02, 0.0005);
  EXPECT_NEAR(stddev("transformer.h.1.mlp.c_proj.weight"), 0.01, 0.0003);
  EXPECT_NEAR(stddev("transformer.h.0.attn.c_proj.weight"), 0.01, 0.0005);
}

TEST(Gpt, LossLogitsAndGradientsMatchFloat64FiniteDifferences) {
  for (bool bias : {true, false}) {
    auto m = trident::nn::make_model(tiny_gpt(bias));
    // Perturb every parameter (LayerNorm weights 1 and zero biases would hide bugs).
    std::mt19937_64 g(3);
    std::normal_distribution<float> d(0.0f, 0.3f);
    for (const auto& p : m->parameters())
      for (size_t i = 0; i < p.numel; ++i) m->param_data()[p.offset + i] += d(g);
    const int B = 2, T = 5, V = 11;
    auto x = tokens(B * T, V, 1), y = tokens(B * T, V, 2);
    m->zero_grad();
    const float loss = m->forward_backward(x.data(), y.data(), B, T, true);
    auto ref_loss = [&](const ref::Params& p) {
      return ref::cross_entropy(ref::gpt_logits(p, x, B, T, 8, 2, 2, V, false), y, B * T, V);
    };
    const ref::Params p = params_of(*m);
    EXPECT_NEAR(loss, ref_loss(p), 1e-5 * ref_loss(p));
    std::vector<float> logits(B * T * V);
    m->forward_logits(x.data(), B, T, logits.data());
    Vec want = ref::gpt_logits(p, x, B, T, 8, 2, 2, V, false);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(logits[i], want[i], 1e-5) << i;
    check_model_gradients(*m, ref_loss, 2e-4);
  }
}

TEST(Gpt, TanhGeluAndShorterSequenceMatchReference) {
  auto cfg = tiny_gpt();
  cfg["gelu"] = "tanh";
  auto m = trident::nn::make_model(cfg);
  const int B = 3, T = 3, V = 11;
  auto x = tokens(B * T, V, 4), y = tokens(B * T, V, 5);
  m->zero_grad();
  m->forward_backward(x.data(), y.data(), B, T, true);
  check_model_gradients(
      *m, [&](const ref::Params& p) { return ref::cross_entropy(ref::gpt_logits(p, x, B, T, 8, 2, 2, V, true), y, B * T, V); },
      2e-4);
}

TEST(Gpt, ActivationCheckpointingGivesBitIdenticalGradients) {
  auto cfg = tiny_gpt();
  cfg["n_layer"] = 3;
  auto a = trident::nn::make_model(cfg);
  cfg["activation_checkpointing"] = true;
  auto b = trident::nn::make_model(cfg);
  ASSERT_EQ(a->num_params(), b->num_params());
  ASSERT_EQ(0, std::memcmp(a->param_data(), b->param_data(), a->num_params() * sizeof(float)));
  const int B = 2, T = 5;
  auto x = tokens(B * T, 11, 8), y = tokens(B * T, 11, 9);
  a->zero_grad();
  b->zero_grad();
  for (int micro = 0; micro < 2; ++micro) {  // accumulation over two micro-steps
    const float la = a->forward_backward(x.data(), y.data(), B, T, true, 0.5f);
    const float lb = b->forward_backward(x.data(), y.data(), B, T, true, 0.5f);
    EXPECT_EQ(la, lb);
  }
  EXPECT_EQ(0, std::memcmp(a->grad_data(), b->grad_data(), a->num_params() * sizeof(float)));
}

// The Llama under activation checkpointing (its rotary tables, grouped-query widening and SwiGLU recomputed)
// and over two accumulated micro-steps: bit-identical to keeping every activation; hooks fire once per
// parameter in descending order (its parameters are registered in forward order).
TEST(Llama, ActivationCheckpointingAccumulationAndHookOrder) {
  nlohmann::json cfg = {{"kind", "llama"}, {"n_layer", 3}, {"n_head", 4}, {"n_kv_head", 2}, {"n_embd", 16},
                        {"block_size", 5}, {"vocab_size", 11}, {"seed", 4}};
  auto a = trident::nn::make_model(cfg);
  cfg["activation_checkpointing"] = true;
  auto b = trident::nn::make_model(cfg);
  ASSERT_EQ(0, std::memcmp(a->param_data(), b->param_data(), a->num_params() * sizeof(float)));
  std::vector<size_t> fired;
  b->set_grad_ready_hook([&](size_t i) { fired.push_back(i); });
  const int B = 2, T = 5;
  auto x = tokens(B * T, 11, 8), y = tokens(B * T, 11, 9);
  a->zero_grad();
  b->zero_grad();
  for (int micro = 0; micro < 2; ++micro) {
    EXPECT_EQ(a->forward_backward(x.data(), y.data(), B, T, true, 0.5f),
              b->forward_backward(x.data(), y.data(), B, T, true, 0.5f));
  }
  EXPECT_EQ(0, std::memcmp(a->grad_data(), b->grad_data(), a->num_params() * sizeof(float)));
  ASSERT_EQ(fired.size(), 2 * b->parameters().size());
  for (size_t k = 0; k < b->parameters().size(); ++k) EXPECT_EQ(fired[k], b->parameters().size() - 1 - k);
}

TEST(Gpt, SameSeedIsBitReproducibleAndSeedMatters) {
  auto a = trident::nn::make_model(tiny_gpt());
  auto b = trident::nn::make_model(tiny_gpt());
  auto cfg = tiny_gpt();
  cfg["seed"] = 8;
  auto c = trident::nn::make_model(cfg);
  EXPECT_EQ(0, std::memcmp(a->param_data(), b->param_data(), a->num_params() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a->param_data(), c->param_data(), a->num_params() * sizeof(float)));
  auto x = tokens(10, 11, 1), y = tokens(10, 11, 2);
  for (int step = 0; step < 3; ++step) {
    a->zero_grad();
    b->zero_grad();
    EXPECT_EQ(a->forward_backward(x.data(), y.data(), 2, 5, true), b->forward_backward(x.data(), y.data(), 2, 5, true));
    for (size_t i = 0; i < a->num_params(); ++i) {  // plain SGD keeps the two in lock step
      a->param_data()[i] -= 0.1f * a->grad_data()[i];
      b->param_data()[i] -= 0.1f * b->grad_data()[i];
    }
  }
  EXPECT_EQ(0, std::memcmp(a->param_data(), b->param_data(), a->num_params() * sizeof(float)));
}

TEST(Gpt, GradReadyHookFiresOncePerParameterInDescendingOrder) {
  auto m = trident::nn::make_model(tiny_gpt());
  std::vector<size_t> fired;
  m->set_grad_ready_hook([&](size_t i) { fired.push_back(i); });
  auto x = tokens(10, 11, 1), y = tokens(10, 11, 2);
  m->forward_backward(x.data(), y.data(), 2, 5, false);
  EXPECT_TRUE(fired.empty());  // no backward, no hooks
  m->forward_backward(x.data(), y.data(), 2, 5, true);
  ASSERT_EQ(fired.size(), m->parameters().size());
  for (size_t k = 0; k < fired.size(); ++k) EXPECT_EQ(fired[k], fired.size() - 1 - k);
}

TEST(Gpt, LossScaleScalesGradientsAndLossIsUnscaled) {
  auto a = trident::nn::make_model(tiny_gpt());
  auto b = trident::nn::make_model(tiny_gpt());
  auto x = tokens(10, 11, 1), y = tokens(10, 11, 2);
  a->zero_grad();
  b->zero_grad();
  const float la = a->forward_backward(x.data(), y.data(), 2, 5, true, 1.0f);
  const float lb = b->forward_backward(x.data(), y.data(), 2, 5, true, 0.25f);
  EXPECT_EQ(la, lb);
  EXPECT_NEAR(std::log(11.0), la, 0.05);  // near-uniform predictions at init
  for (size_t i = 0; i < a->num_params(); ++i) ASSERT_NEAR(b->grad_data()[i], 0.25f * a->grad_data()[i], 1e-7f);
}

TEST(Gpt, BFloat16ComputeTracksFloat32) {
  auto cfg = tiny_gpt();
  cfg["n_embd"] = 32;
  cfg["n_head"] = 4;
  auto a = trident::nn::make_model(cfg);
  cfg["dtype"] = "bfloat16";
  auto b = trident::nn::make_model(cfg);
  EXPECT_EQ(b->config()["dtype"], "bfloat16");
  auto x = tokens(10, 11, 1), y = tokens(10, 11, 2);
  a->zero_grad();
  b->zero_grad();
  const float la = a->forward_backward(x.data(), y.data(), 2, 5, true);
  const float lb = b->forward_backward(x.data(), y.data(), 2, 5, true);
  EXPECT_NEAR(la, lb, 1e-2);
  double dotp = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a->num_params(); ++i) {
    dotp += double(a->grad_data()[i]) * b->grad_data()[i];
    na += double(a->grad_data()[i]) * a->grad_data()[i];
    nb += double(b->grad_data()[i]) * b->grad_data()[i];
  }
  EXPECT_GT(dotp / std::sqrt(na * nb), 0.99);
}

TEST(Gpt, ConfigValidationNamesTheKey) {
  auto expect_error = [](nlohmann::json cfg, const std::string& needle) {
    try {
      trident::nn::make_model(cfg);
      ADD_FAILURE() << "no error for " << cfg.dump();
    } catch (const trident::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({{"vocab_size", 11}, {"n_layerz", 2}}, "n_layerz");
  expect_error({{"n_layer", 2}}, "vocab_size");
  expect_error({{"vocab_size", 11}, {"n_embd", 10}, {"n_head", 3}}, "divisible");
  expect_error({{"vocab_size", 11}, {"dropout", 0.1}}, "dropout");
  expect_error({{"vocab_size", 11}, {"gelu", "relu"}}, "gelu");
  expect_error({{"vocab_size", 11}, {"kind", "rnn"}}, "kind");
  expect_error({{"vocab_size", 11}, {"dtype", "float16"}}, "dtype");
  expect_error({{"vocab_size", 11}, {"n_layer", -1}}, "n_layer");
  auto m = trident::nn::make_model(tiny_gpt());
  auto x = tokens(12, 11, 1);
  EXPECT_THROW(m->forward_backward(x.data(), x.data(), 2, 6, false), trident::InvalidArgument);  // T > block_size
  x[3] = 11;
  EXPECT_THROW(m->forward_backward(x.data(), x.data(), 2, 5, false), trident::InvalidArgument);  // token >= vocab
  // config() rebuilds an identical model.
  auto again = trident::nn::make_model(m->config());
  EXPECT_EQ(again->config(), m->config());
  EXPECT_EQ(0, std::memcmp(again->param_data(), m->param_data(), m->num_params() * sizeof(float)));
}

TEST(DeepMlp, GradientsMatchFloat64FiniteDifferences) {
  for (bool tied : {true, false}) {
    nlohmann::json cfg = {{"kind", "mlp"}, {"n_layer", 3}, {"n_embd", 6}, {"block_size", 4},
                          {"vocab_size", 9}, {"tie_embeddings", tied}, {"seed", 5}};
    for (bool ckpt : {false, true}) {
      cfg["activation_checkpointing"] = ckpt;
      auto m = trident::nn::make_model(cfg);
      EXPECT_EQ(m->kind(), "mlp");
      std::mt19937_64 g(3);
      std::normal_distribution<float> d(0.0f, 0.3f);
      for (size_t i = 0; i < m->num_params(); ++i) m->param_data()[i] += d(g);
      const int B = 2, T = 4, V = 9;
      auto x = tokens(B * T, V, 1), y = tokens(B * T, V, 2);
      std::vector<size_t> fired;
      m->set_grad_ready_hook([&](size_t i) { fired.push_back(i); });
      m->zero_grad();
      const float loss = m->forward_backward(x.data(), y.data(), B, T, true);
      auto ref_loss = [&](const ref::Params& p) {
        return ref::cross_entropy(ref::mlp_logits(p, x, B, T, 6, 3, V, tied), y, B * T, V);
      };
      EXPECT_NEAR(loss, ref_loss(params_of(*m)), 1e-5);
      check_model_gradients(*m, ref_loss, 2e-4);
      ASSERT_EQ(fired.size(), m->parameters().size());
      for (size_t k = 0; k < fired.size(); ++k) EXPECT_EQ(fired[k], fired.size() - 1 - k);
    }
  }
}
