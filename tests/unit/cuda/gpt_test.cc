// nn's models (the GPT, the deep MLP and the Llama) on the GPU against the same models on the CPU: one implementation (nn/language_model.cc
// over nn/layer_range.cc) run through two op tables (kernels/device.h). Same parameter layout and initial
// weights, then the loss, the logits and the gradients of two accumulated micro-steps compared.
// Tolerances: loss and logits 1e-5 relative (float32), 1e-3 (bf16 GEMMs: the same operands are rounded,
// but values that differ in the last float32 bit round to different bf16 values); gradients 1e-4 relative
// per parameter tensor (floored at 0.1 x the tensor's largest magnitude), float32 only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda_test_util.h"
#include "trident/kernels/device.h"
#include "trident/nn/models.h"
#include "trident/optim/adamw.h"

namespace trident::cuda {
namespace {

using testing::expect_close;
using testing::random_ints;

struct Case {
  const char* kind;
  bool bias;
  const char* gelu;
  const char* dtype;
  bool checkpointing;
  int kv_heads = 0;  // llama: key/value heads (0: the key left out)
};

std::vector<float> to_host(const kernels::DeviceOps& ops, const float* p, size_t n) {
  std::vector<float> v(n);
  ops.to_host(v.data(), p, n * sizeof(float));
  return v;
}

TEST(CudaModel, MatchesCpuModelLossLogitsAndGradients) {
  TRIDENT_REQUIRE_GPU();
  const auto& gpu_ops = kernels::device_ops(kernels::Device::kCuda);
  for (const Case k : {Case{"gpt", true, "exact", "float32", false}, Case{"gpt", false, "tanh", "float32", true},
                       Case{"gpt", true, "exact", "bfloat16", false}, Case{"mlp", true, "tanh", "float32", false},
                       // The Llama: multi-query attention (1 key/value head for 3 query heads), rotary embeddings,
                       // RMSNorm and SwiGLU through the CUDA table; and full attention under checkpointing.
                       Case{"llama", false, "exact", "float32", false, 1}, Case{"llama", false, "exact", "float32", true, 3},
                       Case{"llama", false, "exact", "bfloat16", false, 1}}) {
    const int L = 2, NH = 3, C = 48, BS = 16, V = 37, B = 3, T = 13;
    nlohmann::json j = {{"kind", k.kind},   {"n_layer", L},     {"n_head", NH},    {"n_embd", C},
                        {"block_size", BS}, {"vocab_size", V},  {"bias", k.bias},  {"gelu", k.gelu},
                        {"dtype", k.dtype}, {"seed", 7},        {"activation_checkpointing", k.checkpointing}};
    if (k.kv_heads > 0) j["n_kv_head"] = k.kv_heads;
    auto cpu = nn::make_model(j);
    j["device"] = "cuda";
    auto gpu = nn::make_model(j);
    const std::string what = std::string(k.kind) + " " + k.dtype + " gelu=" + k.gelu;
    ASSERT_EQ(gpu->device(), kernels::Device::kCuda);
    ASSERT_EQ(gpu->num_params(), cpu->num_params());
    ASSERT_EQ(gpu->parameters().size(), cpu->parameters().size());
    for (size_t i = 0; i < gpu->parameters().size(); ++i) {
      EXPECT_EQ(gpu->parameters()[i].name, cpu->parameters()[i].name);
      EXPECT_EQ(gpu->parameters()[i].offset, cpu->parameters()[i].offset);
    }
    // Initial weights are drawn on the host: identical bits on both devices.
    const auto w = to_host(gpu_ops, gpu->param_data(), gpu->num_params());
    ASSERT_EQ(0, std::memcmp(w.data(), cpu->param_data(), w.size() * sizeof(float))) << what;

    // Tokens and logits are host memory on both devices (the GPU model copies the batch over).
    auto in = random_ints(size_t(B) * T, 5, 0, V), tg = random_ints(size_t(B) * T, 6, 0, V);
    const bool bf16 = std::string(k.dtype) == "bfloat16";
    const double rtol = bf16 ? 1e-3 : 1e-5;

    std::vector<float> lc(size_t(B) * T * V), lg(lc.size());
    cpu->forward_logits(in.data(), B, T, lc.data());
    gpu->forward_logits(in.data(), B, T, lg.data());
    if (bf16) {
      // Both devices round GEMM operands to bfloat16, but their float32 sums differ in order (and the CPU's
      // vdpbf16ps flushes denormals), so an activation can round to the neighbouring bfloat16 (2^-8 relative)
      // and carry that into the next layer: single logits move by up to about 1% (seen: 5.3e-3 on an H200
      // against a Xeon's CPU kernels), the logits as a whole far less.
      expect_close(lg, lc, 3e-2, what + " logits");
      double d2 = 0, r2 = 0;
      for (size_t i = 0; i < lc.size(); ++i) {
        d2 += (double(lg[i]) - lc[i]) * (double(lg[i]) - lc[i]);
        r2 += double(lc[i]) * lc[i];
      }
      std::printf("%s logits: |gpu - cpu| / |cpu| = %.3g\n", what.c_str(), std::sqrt(d2 / r2));
      EXPECT_LE(std::sqrt(d2 / r2), 5e-3) << what;
    } else {
      expect_close(lg, lc, rtol, what + " logits");
    }

    cpu->zero_grad();
    gpu->zero_grad();
    float loss_c = 0, loss_g = 0;
    for (int step = 0; step < 2; ++step) {  // gradients accumulate on both sides
      loss_c = cpu->forward_backward(in.data(), tg.data(), B, T, true, 0.5f);
      loss_g = gpu->forward_backward(in.data(), tg.data(), B, T, true, 0.5f);
    }
    EXPECT_NEAR(loss_g, loss_c, rtol * std::fabs(loss_c)) << what;
    std::printf("%s: loss cpu %.7f gpu %.7f\n", what.c_str(), loss_c, loss_g);
    if (bf16) continue;
    const auto g = to_host(gpu_ops, gpu->grad_data(), gpu->num_params());
    double worst = 0;
    for (const auto& p : cpu->parameters()) {
      std::vector<float> ref(cpu->grad_data() + p.offset, cpu->grad_data() + p.offset + p.numel);
      std::vector<float> got(g.begin() + p.offset, g.begin() + p.offset + p.numel);
      worst = std::max(worst, expect_close(got, ref, 1e-4, what + " grad " + p.name));
    }
    std::printf("%s: worst gradient relative error %.3g\n", what.c_str(), worst);
  }
}

// bfloat16 at a head dim the tensor-core attention takes (64 / 2 = 32): the GPU rounds attention's operands
// to bfloat16, the CPU's attention stays float32, so logits and loss agree to about 1% (bounds 3e-2, floored
// at 0.1 x the largest logit, and 1e-2).
TEST(CudaModel, Bf16TensorCoreAttentionTracksCpu) {
  TRIDENT_REQUIRE_GPU();
  const int B = 2, T = 40, V = 37;
  nlohmann::json j = {{"kind", "gpt"},     {"n_layer", 2},     {"n_head", 2},         {"n_embd", 64},
                      {"block_size", 48},  {"vocab_size", V},  {"dtype", "bfloat16"}, {"seed", 7}};
  auto cpu = nn::make_model(j);
  j["device"] = "cuda";
  auto gpu = nn::make_model(j);
  auto in = random_ints(size_t(B) * T, 5, 0, V), tg = random_ints(size_t(B) * T, 6, 0, V);
  std::vector<float> lc(size_t(B) * T * V), lg(lc.size());
  cpu->forward_logits(in.data(), B, T, lc.data());
  gpu->forward_logits(in.data(), B, T, lg.data());
  const double e = expect_close(lg, lc, 3e-2, "bf16 logits");
  cpu->zero_grad();
  gpu->zero_grad();
  const float loss_c = cpu->forward_backward(in.data(), tg.data(), B, T, true, 1.0f);
  const float loss_g = gpu->forward_backward(in.data(), tg.data(), B, T, true, 1.0f);
  EXPECT_NEAR(loss_g, loss_c, 1e-2 * std::fabs(loss_c));
  std::printf("gpt bf16 head dim 32: logits worst relative error %.3g, loss cpu %.7f gpu %.7f\n", e, loss_c, loss_g);
}

// One AdamW step through each table from the same state gives the same parameters (1e-5 relative).
TEST(CudaModel, OptimizerStepThroughOpTableMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const auto& cpu = kernels::device_ops(kernels::Device::kCpu);
  const auto& gpu = kernels::device_ops(kernels::Device::kCuda);
  const size_t n = 1000;
  auto p = testing::random_floats(n, 1), gr = testing::random_floats(n, 2), m = testing::random_floats(n, 3, 0, 0.1f),
       v = testing::random_floats(n, 4, 0.0f, 0.1f);
  DeviceBuffer<float> dp(p), dg(gr), dm(m), dv(v);
  cpu.adamw_update(p.data(), gr.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  gpu.adamw_update(dp.data(), dg.data(), dm.data(), dv.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  expect_close(dp.to_host(), p, 1e-5, "adamw param");
  EXPECT_NEAR(gpu.sum_squares(dg.data(), n), cpu.sum_squares(gr.data(), n), 1e-9 * cpu.sum_squares(gr.data(), n));
}

// Optimizer offload on the GPU: parameters and gradients in device memory, the moments in host memory, the
// update by the CPU kernel on copies in chunks (here 300 of 1000 elements, so the copies cross chunk ends).
// The parameters that come back are the CPU kernel's, bit for bit, on the same inputs.
TEST(CudaModel, OffloadedOptimizerUpdatesDeviceParametersWithTheCpuKernel) {
  TRIDENT_REQUIRE_GPU();
  const auto& cpu = kernels::device_ops(kernels::Device::kCpu);
  const auto& gpu = kernels::device_ops(kernels::Device::kCuda);
  const size_t n = 1000;
  auto p = testing::random_floats(n, 11), gr = testing::random_floats(n, 12), m = testing::random_floats(n, 13, 0, 0.1f),
       v = testing::random_floats(n, 14, 0.0f, 0.1f);
  auto hm = m, hv = v;
  DeviceBuffer<float> dp(p), dg(gr);
  for (int t = 1; t <= 2; ++t) {
    cpu.adamw_update(p.data(), gr.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    optim::offloaded_adamw_update(gpu, dp.data(), dg.data(), hm.data(), hv.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                  t, 300);
  }
  const auto back = dp.to_host();
  EXPECT_EQ(0, std::memcmp(back.data(), p.data(), n * sizeof(float)));
  EXPECT_EQ(hm, m);
  EXPECT_EQ(hv, v);
}

}  // namespace
}  // namespace trident::cuda
