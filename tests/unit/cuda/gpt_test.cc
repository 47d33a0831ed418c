// The CUDA GPT against the CPU model of nn/gpt.cc: same parameter layout, same loss, same gradients.
// Tolerances: loss 1e-5 relative (float32), 1e-3 (bf16 GEMMs: the same operands are rounded, but values
// that differ in the last float32 bit round to different bf16 values); gradients 1e-4 relative per
// parameter tensor (floored at 0.1 x the tensor's largest magnitude), float32 only.
#include <gtest/gtest.h>

#include <cstdio>

#include "cuda_test_util.h"
#include "trident/cuda/gpt.h"
#include "trident/nn/models.h"

namespace trident::cuda {
namespace {

using testing::expect_close;
using testing::random_ints;

struct Case {
  bool bias;
  const char* gelu;
  const char* dtype;
};

TEST(CudaGpt, MatchesCpuModelLossAndGradients) {
  TRIDENT_REQUIRE_GPU();
  for (const Case k : {Case{true, "exact", "float32"}, Case{false, "tanh", "float32"}, Case{true, "exact", "bfloat16"}}) {
    const int L = 2, NH = 3, C = 48, BS = 16, V = 37, B = 3, T = 13;
    nlohmann::json j = {{"kind", "gpt"}, {"n_layer", L},   {"n_head", NH},     {"n_embd", C},      {"block_size", BS},
                        {"vocab_size", V}, {"bias", k.bias}, {"gelu", k.gelu}, {"dtype", k.dtype}, {"seed", 7}};
    auto cpu = nn::make_model(j);
    GptConfig gc;
    gc.n_layer = L;
    gc.n_head = NH;
    gc.n_embd = C;
    gc.block_size = BS;
    gc.vocab_size = V;
    gc.bias = k.bias;
    gc.gelu = std::string(k.gelu) == "tanh" ? GeluKind::kTanh : GeluKind::kExact;
    gc.precision = std::string(k.dtype) == "bfloat16" ? Precision::kBFloat16 : Precision::kFloat32;
    Gpt gpu(gc);
    // Same layout: names, shapes, offsets and flat size.
    ASSERT_EQ(gpu.parameters().size(), cpu->parameters().size());
    for (size_t i = 0; i < gpu.parameters().size(); ++i) {
      EXPECT_EQ(gpu.parameters()[i].name, cpu->parameters()[i].name);
      EXPECT_EQ(gpu.parameters()[i].shape, cpu->parameters()[i].shape);
      EXPECT_EQ(gpu.parameters()[i].offset, cpu->parameters()[i].offset);
    }
    ASSERT_EQ(gpu.num_params(), cpu->num_params());
    gpu.copy_params_from_host(cpu->param_data());

    auto in = random_ints(size_t(B) * T, 5, 0, V), tg = random_ints(size_t(B) * T, 6, 0, V);
    DeviceBuffer<int32_t> din(in.size()), dtg(tg.size());
    din.upload(in);
    dtg.upload(tg);
    cpu->zero_grad();
    gpu.zero_grad();
    // Two micro-steps: gradients accumulate on both sides.
    float lc = 0, lg = 0;
    for (int step = 0; step < 2; ++step) {
      lc = cpu->forward_backward(in.data(), tg.data(), B, T, true, 0.5f);
      lg = gpu.forward_backward(din.data(), dtg.data(), B, T, true, 0.5f);
    }
    const bool bf16 = gc.precision == Precision::kBFloat16;
    EXPECT_NEAR(lg, lc, (bf16 ? 1e-3 : 1e-5) * std::fabs(lc)) << k.dtype << " " << k.gelu;
    std::printf("gpt %s gelu=%s bias=%d: loss cpu %.7f gpu %.7f\n", k.dtype, k.gelu, k.bias, lc, lg);
    if (bf16) continue;
    std::vector<float> g(gpu.num_params());
    TRIDENT_CUDA_CHECK(cudaMemcpy(g.data(), gpu.grad_data(), g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (const auto& p : cpu->parameters()) {
      std::vector<float> ref(cpu->grad_data() + p.offset, cpu->grad_data() + p.offset + p.numel);
      std::vector<float> got(g.begin() + p.offset, g.begin() + p.offset + p.numel);
      worst = std::max(worst, expect_close(got, ref, 1e-4, "grad " + p.name));
    }
    std::printf("gpt %s gelu=%s bias=%d: worst gradient relative error %.3g\n", k.dtype, k.gelu, k.bias, worst);
  }
}

}  // namespace
}  // namespace trident::cuda
