// trident's own kernels (kernels::cpu::set_isa): the AVX2 (level avx2) and AVX-512 (avx512 and up) GEMMs
// against an independent scalar fused-multiply-add chain (bit for bit: each element is one chain over k in
// order) for every transpose, tail and blocking case, on 1 and 2 threads; the AVX-512 level's causal
// attention against the float64 reference and against the portable path; a whole GPT step on both paths
// (bfloat16 GEMMs at every level: isa_kernels_test). Each test is skipped where the CPU lacks its level.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "harness/skip.h"
#include "reference.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/nn/models.h"

namespace kc = trident::kernels::cpu;
using ref::Vec;

namespace {

// Runs the kernels at one ISA level, on a one-thread pool, for a scope.
class KernelPath {
 public:
  explicit KernelPath(kc::Isa level) : was_(kc::set_isa(level)) { kc::set_num_threads(1); }
  ~KernelPath() { kc::set_isa(was_); }
  KernelPath(const KernelPath&) = delete;
  KernelPath& operator=(const KernelPath&) = delete;

 private:
  kc::Isa was_;
};

// The levels with trident's own GEMM-blocked kernels that this CPU has: avx2 (gemm_avx2) and avx512.
std::vector<kc::Isa> native_levels() {
  std::vector<kc::Isa> out;
  for (kc::Isa l : {kc::Isa::kAvx2, kc::Isa::kAvx512})
    if (kc::machine_isa() >= l) out.push_back(l);
  return out;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::abs(static_cast<double>(want[i])));
  }
  return num / den;
}

}  // namespace

// trident's own GEMMs, the AVX2 one (level avx2) and the AVX-512 one (avx512 and up), on 1 and 2 threads.
TEST(NativeKernels, GemmIsOneFmaChainPerElement) {
  if (kc::machine_isa() < kc::Isa::kAvx2) TRIDENT_SKIP_MACHINE("no AVX2 on this CPU");
  // Tails in every dimension; K past the 128- and 256-deep blocks, and past the 3072-deep blocks of a
  // product over packed panels (6149: three uneven blocks, C carried through memory between them); M past
  // the 6-row tiles; N past the 16- and 64-wide panels; M past the 512-row groups of a transposed-A product.
  const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {6, 64, 128}, {13, 70, 129}, {67, 33, 300}, {130, 17, 65},
                           {12, 129, 257}, {523, 65, 19}, {7, 9, 513}, {7, 70, 6149}};
  for (kc::Isa level : {kc::Isa::kAvx2, kc::Isa::kAvx512}) {
    if (kc::machine_isa() < level) continue;
    for (int threads : {1, 2}) {
      const kc::Isa was = kc::set_isa(level);
      kc::set_num_threads(threads);
      for (const auto& s : shapes) {
        const int M = s[0], N = s[1], K = s[2];
        const std::vector<float> a = ref::to_float(ref::random_vec(static_cast<size_t>(M) * K, 11 + M));
        const std::vector<float> b = ref::to_float(ref::random_vec(static_cast<size_t>(K) * N, 12 + N));
        const std::vector<float> c0 = ref::to_float(ref::random_vec(static_cast<size_t>(M) * N, 13 + K));
        for (int ta = 0; ta < 2; ++ta)
          for (int tb = 0; tb < 2; ++tb)
            for (int acc = 0; acc < 2; ++acc) {
              // A stored [K,M] when transposed, B stored [N,K] when transposed (values a[i,k], b[k,j] alike).
              const std::vector<float> A = ref::stored(a, M, K, ta), B = ref::stored(b, K, N, tb);
              std::vector<float> C = c0, want(c0.size());
              for (int i = 0; i < M; ++i)
                for (int j = 0; j < N; ++j) {
                  float x = acc ? c0[i * N + j] : 0.0f;
                  for (int k = 0; k < K; ++k) x = std::fma(a[i * K + k], b[k * N + j], x);
                  want[i * N + j] = x;
                }
              kc::gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, acc ? 1.0f : 0.0f,
                       C.data(), N);
              EXPECT_EQ(std::memcmp(C.data(), want.data(), C.size() * sizeof(float)), 0)
                  << kc::isa_name(level) << " threads " << threads << " M " << M << " N " << N << " K " << K
                  << " trans_a " << ta << " trans_b " << tb << " beta " << acc;
            }
      }
      kc::set_num_threads(1);
      kc::set_isa(was);
    }
  }
}

TEST(NativeKernels, GemmOtherScalarsFallBackToBlas) {
  if (native_levels().empty()) TRIDENT_SKIP_MACHINE("no AVX2 on this CPU");
  KernelPath path(native_levels().back());
  const int M = 9, N = 20, K = 7;
  const std::vector<float> a = ref::to_float(ref::random_vec(M * K, 1)), b = ref::to_float(ref::random_vec(K * N, 2));
  std::vector<float> c = ref::to_float(ref::random_vec(M * N, 3)), want = c;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(a[i * K + k]) * b[k * N + j];
      want[i * N + j] = static_cast<float>(2.0 * s - 0.5 * want[i * N + j]);
    }
  kc::gemm(false, false, M, N, K, 2.0f, a.data(), K, b.data(), N, -0.5f, c.data(), N);
  EXPECT_LT(rel_err(c, want), 1e-5);
}

TEST(NativeKernels, AttentionMatchesReferenceAndPortablePath) {
  if (native_levels().empty()) TRIDENT_SKIP_MACHINE("no AVX2 on this CPU");
  // Head dims 8, 20 (masked tail), 32, 64; T of 1, 17, 64 and 140 (past one 128-deep block).
  const int cases[][3] = {{1, 16, 2}, {17, 40, 2}, {64, 128, 4}, {140, 64, 1}, {33, 24, 3}};
  for (const auto& cs : cases) {
    const int B = 2, T = cs[0], C = cs[1], NH = cs[2];
    const Vec qkv = ref::random_vec(static_cast<size_t>(B) * T * 3 * C, 60 + T, 0.7);
    const std::vector<float> qf = ref::to_float(qkv),
                             dout = ref::to_float(ref::random_vec(static_cast<size_t>(B) * T * C, 61 + T));
    auto run = [&](kc::Isa level, std::vector<float>& y, std::vector<float>& lse, std::vector<float>& dqkv) {
      KernelPath path(level);
      y.assign(static_cast<size_t>(B) * T * C, 0.0f);
      lse.assign(static_cast<size_t>(B) * NH * T, 0.0f);
      dqkv.assign(qf.size(), 7.0f);
      kc::attention_forward(y.data(), lse.data(), qf.data(), B, T, C, NH);
      kc::attention_backward(dqkv.data(), dout.data(), qf.data(), y.data(), lse.data(), B, T, C, NH);
    };
    std::vector<float> y0, lse0, dqkv0;
    run(kc::Isa::kPortable, y0, lse0, dqkv0);
    const std::vector<float> want = ref::to_float(ref::attention(qkv, B, T, C, NH));
    for (kc::Isa level : native_levels()) {
      std::vector<float> y, lse, dqkv;
      run(level, y, lse, dqkv);
      EXPECT_LT(rel_err(y, want), 1e-5) << kc::isa_name(level) << " T " << T << " C " << C;
      EXPECT_LT(rel_err(y, y0), 1e-5) << kc::isa_name(level) << " T " << T << " C " << C;
      EXPECT_LT(rel_err(lse, lse0), 1e-5) << kc::isa_name(level) << " T " << T << " C " << C;
      // The portable backward is checked against finite differences in kernels_test.
      EXPECT_LT(rel_err(dqkv, dqkv0), 1e-5) << kc::isa_name(level) << " T " << T << " C " << C;
    }
  }
}

TEST(NativeKernels, GptStepAgreesWithPortablePathAndIsDeterministic) {
  if (native_levels().empty()) TRIDENT_SKIP_MACHINE("no AVX2 on this CPU");
  const nlohmann::json cfg = {{"kind", "gpt"}, {"n_layer", 2},     {"n_head", 4},   {"n_embd", 64},
                              {"block_size", 24}, {"vocab_size", 37}, {"bias", true}, {"seed", 3}};
  const int B = 3, T = 24;
  std::vector<int32_t> x(B * T), y(B * T);
  for (int i = 0; i < B * T; ++i) x[i] = (i * 7 + 3) % 37, y[i] = (i * 5 + 1) % 37;
  auto step = [&](kc::Isa level, std::vector<float>& grads) {
    KernelPath path(level);
    auto m = trident::nn::make_model(cfg);
    m->zero_grad();
    const float loss = m->forward_backward(x.data(), y.data(), B, T, true);
    grads.assign(m->grad_data(), m->grad_data() + m->num_params());
    return loss;
  };
  std::vector<float> g0;
  const float loss0 = step(kc::Isa::kPortable, g0);
  for (kc::Isa level : native_levels()) {
    std::vector<float> g1, g2;
    const float loss1 = step(level, g1), loss2 = step(level, g2);  // twice: determinism
    EXPECT_NEAR(loss1, loss0, 1e-5 * std::abs(loss0)) << kc::isa_name(level);
    EXPECT_LT(rel_err(g1, g0), 1e-4) << kc::isa_name(level);
    EXPECT_EQ(loss1, loss2) << kc::isa_name(level);
    EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0) << kc::isa_name(level);
  }
}
