// Every ISA level the machine supports (kernels::cpu::set_isa: portable, avx2, avx512, avx512bf16, amx)
// against independent float64 references: GEMMs in every transpose at odd sizes in float32 and
// bfloat16, LayerNorm, GELU, softmax, cross-entropy, AdamW, causal attention forward and backward (the
// backward against finite differences of the float64 forward), and a GPT step in bfloat16. Levels the
// CPU lacks are reported, not run; forcing one is an error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>

#include "harness/skip.h"
#include "kernel_test_util.h"
#include "reference.h"
#include "trident/core/error.h"
#include "trident/kernels/cpu/attention_bf16.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/nn/models.h"

namespace kc = trident::kernels::cpu;
using ref::Vec;

using kernel_test::levels;
using kernel_test::rel_err;
using kernel_test::to_double;

namespace {

// Runs the kernels at one level (one thread), and with a bfloat16-dot mode, for a scope.
class IsaScope {
 public:
  explicit IsaScope(kc::Isa isa, kc::Bf16Dot dot = kc::bf16_dot_mode())
      : was_(kc::set_isa(isa)), dot_was_(kc::set_bf16_dot(dot)) {
    kc::set_num_threads(1);
  }
  ~IsaScope() {
    kc::set_bf16_dot(dot_was_);
    kc::set_isa(was_);
  }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  kc::Isa was_;
  kc::Bf16Dot dot_was_;
};

// Every bfloat16 GEMM path this machine has: each level, and level avx512bf16 both on vdpbf16ps and on
// FMAs (whichever of the two auto picks on this CPU, both are checked).
struct Path {
  kc::Isa isa;
  kc::Bf16Dot dot;
  std::string name() const {
    return std::string(kc::isa_name(isa)) + (isa == kc::Isa::kAvx512Bf16 ? std::string(" dot ") + kc::bf16_dot_name(dot) : "");
  }
};
std::vector<Path> paths() {
  std::vector<Path> out;
  for (kc::Isa l : levels()) {
    out.push_back({l, kc::Bf16Dot::kOn});
    if (l == kc::Isa::kAvx512Bf16) out.push_back({l, kc::Bf16Dot::kOff});
  }
  return out;
}

// Bounds of a bfloat16 GPT step's gradients against float32's (GptStepInBfloat16EveryLevelTracksFloat32):
// measured on its model, rounding to nearest even gives a relative L2 error of 3.6e-3 and a norm ratio of
// 0.9997 at every level (AMD EPYC, avx512bf16, dot on and off); truncating the operands gives 9.7e-3 and
// 0.9930.
constexpr double kBf16GradRelErr = 6e-3;
constexpr double kBf16GradNormShift = 2.5e-3;

std::vector<float> bf16_rounded(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  std::vector<float> r(x.size());
  kc::to_bf16(h.data(), x.data(), x.size());
  kc::from_bf16(r.data(), h.data(), x.size());
  return r;
}

}  // namespace

// Every ISA level, whether this CPU runs it or not: a level it lacks is a skipped sub-test naming the level
// (scripts/test.sh lists these at the end of a run); a level it has must be selectable and compute a GEMM
// in float32 and bfloat16 against float64.
class IsaLevel : public ::testing::TestWithParam<kc::Isa> {};

namespace trident::kernels::cpu {
// gtest prints a level by its name (in ctest's test list and the skip report), not as raw bytes.
void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace trident::kernels::cpu


TEST_P(IsaLevel, RunsOnThisCpu) {
  const kc::Isa l = GetParam();
  if (static_cast<int>(l) > static_cast<int>(kc::machine_isa()))
    TRIDENT_SKIP_MACHINE(std::string("ISA level ") + kc::isa_name(l) + " not run on this CPU (it runs up to " +
                         kc::isa_name(kc::machine_isa()) + "; features: " + kc::cpu_features() +
                         "): the IsaKernels tests did not check its kernels");
  IsaScope scope(l);
  EXPECT_EQ(kc::active_isa(), l);
  const int M = 13, N = 7, K = 67;
  const std::vector<float> a = ref::to_float(ref::random_vec(static_cast<size_t>(M) * K, 41));
  const std::vector<float> b = ref::to_float(ref::random_vec(static_cast<size_t>(N) * K, 42));
  for (int bf = 0; bf < 2; ++bf) {
    const std::vector<float> ar = bf ? bf16_rounded(a) : a, br = bf ? bf16_rounded(b) : b;
    Vec want(static_cast<size_t>(M) * N, 0.0);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j)
        for (int k = 0; k < K; ++k)
          want[static_cast<size_t>(i) * N + j] +=
              static_cast<double>(ar[static_cast<size_t>(i) * K + k]) * br[static_cast<size_t>(j) * K + k];
    std::vector<float> c(static_cast<size_t>(M) * N, -1.0f);
    kc::gemm(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N,
             bf ? kc::Precision::kBFloat16 : kc::Precision::kFloat32);
    EXPECT_LT(rel_err(c, want), 1e-5) << kc::isa_name(l) << (bf ? " bfloat16" : " float32");
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, IsaLevel,
                         ::testing::Values(kc::Isa::kPortable, kc::Isa::kAvx2, kc::Isa::kAvx512, kc::Isa::kAvx512Bf16,
                                           kc::Isa::kAmx),
                         [](const ::testing::TestParamInfo<kc::Isa>& info) { return std::string(kc::isa_name(info.param)); });

TEST(IsaKernels, LevelsNamesAndForcingAboveTheMachine) {
  EXPECT_EQ(kc::machine_isa(), kc::parse_isa(kc::isa_name(kc::machine_isa())));
  for (kc::Isa l : levels()) {
    IsaScope s(l);
    EXPECT_EQ(kc::active_isa(), l);
    const std::string summary = kc::kernel_summary();
    EXPECT_NE(summary.find(std::string("isa ") + kc::isa_name(l) + " "), std::string::npos) << summary;
    EXPECT_NE(summary.find("gemm bfloat16"), std::string::npos) << summary;
  }
  try {
    kc::parse_isa("avx3");
    ADD_FAILURE() << "parse_isa accepted avx3";
  } catch (const trident::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("avx512bf16"), std::string::npos) << e.what();
  }
  if (kc::machine_isa() != kc::Isa::kAmx) {
    const kc::Isa above = static_cast<kc::Isa>(static_cast<int>(kc::machine_isa()) + 1);
    try {
      kc::set_isa(above);
      ADD_FAILURE() << "set_isa accepted " << kc::isa_name(above) << " above the machine's level";
    } catch (const trident::InvalidArgument& e) {
      // Names the level asked for, the machine's level and its features.
      const std::string msg = e.what();
      EXPECT_NE(msg.find(kc::isa_name(above)), std::string::npos) << msg;
      EXPECT_NE(msg.find(kc::isa_name(kc::machine_isa())), std::string::npos) << msg;
      EXPECT_NE(msg.find(kc::cpu_features()), std::string::npos) << msg;
    }
  }
  std::printf("machine: %s; features: %s\n", kc::isa_name(kc::machine_isa()), kc::cpu_features().c_str());
}

// Level avx512bf16 takes vdpbf16ps only where it measures clearly faster than the FMAs; on and off force
// it; the summary line says which and why; a bad TRIDENT_BF16_DOT value is named with the accepted ones.
TEST(IsaKernels, Bf16DotFollowsTheMeasuredRates) {
  EXPECT_FALSE(kc::bf16_dot_pays({0, 175}));    // no instruction
  EXPECT_FALSE(kc::bf16_dot_pays({86, 175}));   // half the FMA rate (the Xeon measured here)
  EXPECT_FALSE(kc::bf16_dot_pays({200, 175}));  // within the margin: not worth numerics of its own
  EXPECT_TRUE(kc::bf16_dot_pays({262, 175}));   // about 1.5x and more (Zen 5)
  for (const char* m : {"auto", "on", "off"}) EXPECT_STREQ(kc::bf16_dot_name(kc::parse_bf16_dot(m)), m);
  try {
    kc::parse_bf16_dot("yes");
    ADD_FAILURE() << "parse_bf16_dot accepted yes";
  } catch (const trident::InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("TRIDENT_BF16_DOT"), std::string::npos) << msg;
    EXPECT_NE(msg.find("auto"), std::string::npos) << msg;
  }
  const kc::Bf16DotRates r = kc::bf16_dot_rates();
  if (kc::machine_isa() < kc::Isa::kAvx512Bf16) {
    EXPECT_EQ(r.dpbf16_gflops, 0.0);
    return;
  }
  EXPECT_GT(r.dpbf16_gflops, 0.0);
  EXPECT_GT(r.fma_gflops, 0.0);
  std::printf("vdpbf16ps %.1f GFLOP/s, FMA %.1f GFLOP/s: auto %s\n", r.dpbf16_gflops, r.fma_gflops,
              kc::bf16_dot_pays(r) ? "uses vdpbf16ps" : "uses FMAs");
  {
    IsaScope s(kc::Isa::kAvx512Bf16, kc::Bf16Dot::kOn);
    EXPECT_TRUE(kc::bf16_dot_in_use());
    EXPECT_NE(kc::kernel_summary().find("gemm bfloat16 avx512bf16-dpbf16"), std::string::npos) << kc::kernel_summary();
  }
  {
    IsaScope s(kc::Isa::kAvx512Bf16, kc::Bf16Dot::kOff);
    EXPECT_FALSE(kc::bf16_dot_in_use());
    EXPECT_NE(kc::kernel_summary().find("gemm bfloat16 bf16-rounded operands on avx512-fma"), std::string::npos)
        << kc::kernel_summary();
  }
  {
    IsaScope s(kc::Isa::kAvx512Bf16, kc::Bf16Dot::kAuto);
    EXPECT_EQ(kc::bf16_dot_in_use(), kc::bf16_dot_pays(r));
    const std::string summary = kc::kernel_summary();
    EXPECT_NE(summary.find(kc::bf16_dot_pays(r) ? "(faster: used)" : "(not faster here"), std::string::npos) << summary;
  }
}

TEST(IsaKernels, GemmEveryTransposeAndLevelAgainstFloat64) {
  // M, N, K: ones, primes, 64+3, past the 6-row tiles, 64-column panels, 128/256-deep k blocks and the
  // 96-row tasks of the packed bfloat16 product (whose A is packed 64 rows at a time).
  const int shapes[][3] = {{1, 1, 1},     {7, 13, 1},     {1, 7, 13},   {13, 7, 67},
                           {67, 67, 13},  {67, 130, 300}, {6, 64, 257}, {101, 70, 290}};
  for (const Path& path : paths()) {
    const kc::Isa l = path.isa;
    IsaScope scope(l, path.dot);
    for (const auto& s : shapes) {
      const int M = s[0], N = s[1], K = s[2];
      const std::vector<float> a = ref::to_float(ref::random_vec(static_cast<size_t>(M) * K, 31 + M));
      const std::vector<float> b = ref::to_float(ref::random_vec(static_cast<size_t>(K) * N, 32 + N));
      const std::vector<float> c0 = ref::to_float(ref::random_vec(static_cast<size_t>(M) * N, 33 + K));
      for (int bf = 0; bf < 2; ++bf) {
        // bfloat16: the reference multiplies the rounded operands exactly.
        const std::vector<float> ar = bf ? bf16_rounded(a) : a, br = bf ? bf16_rounded(b) : b;
        for (int ta = 0; ta < 2; ++ta)
          for (int tb = 0; tb < 2; ++tb)
            for (int acc = 0; acc < 2; ++acc) {
              const std::vector<float> A = ref::stored(a, M, K, ta), B = ref::stored(b, K, N, tb);
              std::vector<float> C = c0;
              kc::gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, acc ? 1.0f : 0.0f, C.data(),
                       N, bf ? kc::Precision::kBFloat16 : kc::Precision::kFloat32);
              double worst = 0;
              for (int i = 0; i < M; ++i)
                for (int j = 0; j < N; ++j) {
                  double want = acc ? c0[i * N + j] : 0.0, mag = std::abs(want);
                  for (int k = 0; k < K; ++k) {
                    const double p = static_cast<double>(ar[i * K + k]) * br[k * N + j];
                    want += p;
                    mag += std::abs(p);
                  }
                  worst = std::max(worst, std::abs(C[i * N + j] - want) / std::max(mag, 1e-30));
                }
              // float32 accumulation of K products: a few float32 ulps of the magnitude sum per 16 terms.
              EXPECT_LT(worst, 2e-6 * std::max(1, K / 16))
                  << path.name() << (bf ? " bfloat16" : " float32") << " M " << M << " N " << N << " K " << K
                  << " trans_a " << ta << " trans_b " << tb << " beta " << acc;
            }
      }
    }
  }
}

// Where bfloat16 products run on float32 FMAs (a level below avx512bf16, or avx512bf16 with the dot off),
// each task rounds its own blocks of the operands: the result must be the float32 product of the operands
// rounded beforehand (kc::to_bf16 and back, independent code), bit for bit, whatever the tasks, threads, k
// blocks and transposes. Shapes: many 64-column panels, more than one 512-row group for a transposed A,
// K past the 128-deep blocks. The same buffers then hold new values: a block rounded for the previous
// product must not be reused.
TEST(IsaKernels, Bfloat16OnFmasIsTheFloat32ProductOfRoundedOperands) {
  const int shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {67, 130, 300}, {523, 200, 131}, {300, 77, 523}};
  for (const Path& path : paths()) {
    IsaScope scope(path.isa, path.dot);
    if (kc::bf16_dot_in_use() || path.isa == kc::Isa::kAmx) continue;  // not the FMA path
    for (int threads : {1, 2}) {
      kc::set_num_threads(threads);
      for (const auto& s : shapes) {
        const int M = s[0], N = s[1], K = s[2];
        std::vector<float> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(K) * N);
        for (int round = 0; round < 2; ++round) {
          const std::vector<float> a = ref::to_float(ref::random_vec(A.size(), 51 + M + round));
          const std::vector<float> b = ref::to_float(ref::random_vec(B.size(), 52 + N + round));
          const std::vector<float> c0 = ref::to_float(ref::random_vec(static_cast<size_t>(M) * N, 53 + round));
          for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb)
              for (float beta : {0.0f, 1.0f}) {
                const std::vector<float> sa = ref::stored(a, M, K, ta), sb = ref::stored(b, K, N, tb);
                std::copy(sa.begin(), sa.end(), A.begin());  // the same addresses every product
                std::copy(sb.begin(), sb.end(), B.begin());
                const std::vector<float> ra = bf16_rounded(A), rb = bf16_rounded(B);
                std::vector<float> got = c0, want = c0;
                kc::gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, beta, got.data(), N,
                         kc::Precision::kBFloat16);
                kc::gemm(ta, tb, M, N, K, 1.0f, ra.data(), ta ? M : K, rb.data(), tb ? K : N, beta, want.data(), N,
                         kc::Precision::kFloat32);
                EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                    << path.name() << " M " << M << " N " << N << " K " << K << " trans_a " << ta << " trans_b "
                    << tb << " beta " << beta << " threads " << threads << " round " << round;
              }
        }
      }
    }
    kc::set_num_threads(1);
  }
}

// linear_backward's fused factor (dinp *= dinp_mul, applied per task) gives the bits of the product
// followed by a separate mul, on every path, precision, beta, and on 1 and 2 threads (tasks split C).
TEST(IsaKernels, LinearBackwardFusedFactorIsTheSeparateMul) {
  // N, C, OC: ones, primes, past the 6-row tiles, 64-column panels and 128-deep k blocks, many tasks.
  const int shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {67, 130, 300}, {384, 512, 128}};
  for (const Path& path : paths()) {
    IsaScope scope(path.isa, path.dot);
    for (int threads : {1, 2}) {
      kc::set_num_threads(threads);
      for (const auto& s : shapes) {
        const int N = s[0], C = s[1], OC = s[2];
        const std::vector<float> dout = ref::to_float(ref::random_vec(static_cast<size_t>(N) * OC, 41 + N));
        const std::vector<float> w = ref::to_float(ref::random_vec(static_cast<size_t>(OC) * C, 42 + C));
        const std::vector<float> x = ref::to_float(ref::random_vec(static_cast<size_t>(N) * C, 43));
        const std::vector<float> g = ref::to_float(ref::random_vec(static_cast<size_t>(N) * C, 44 + OC));
        const std::vector<float> d0 = ref::to_float(ref::random_vec(static_cast<size_t>(N) * C, 45));
        for (int bf = 0; bf < 2; ++bf)
          for (float beta : {0.0f, 1.0f}) {
            const auto p = bf ? kc::Precision::kBFloat16 : kc::Precision::kFloat32;
            std::vector<float> sep = d0, fused = d0, dw1(static_cast<size_t>(OC) * C), dw2 = dw1;
            kc::linear_backward(sep.data(), dw1.data(), nullptr, dout.data(), x.data(), w.data(), N, C, OC, beta, p);
            kc::mul(sep.data(), sep.data(), g.data(), sep.size());
            kc::linear_backward(fused.data(), dw2.data(), nullptr, dout.data(), x.data(), w.data(), N, C, OC, beta, p,
                                g.data());
            EXPECT_EQ(std::memcmp(sep.data(), fused.data(), sep.size() * sizeof(float)), 0)
                << path.name() << (bf ? " bfloat16" : " float32") << " N " << N << " C " << C << " OC " << OC
                << " beta " << beta << " threads " << threads;
            EXPECT_EQ(std::memcmp(dw1.data(), dw2.data(), dw1.size() * sizeof(float)), 0) << path.name();
          }
      }
    }
    kc::set_num_threads(1);
  }
}

TEST(IsaKernels, RowAndElementwiseKernelsEveryLevelAgainstFloat64) {
  for (kc::Isa l : levels()) {
    IsaScope scope(l);
    const char* name = kc::isa_name(l);
    for (int C : {1, 7, 13, 67}) {
      const int N = 5;
      const Vec x = ref::random_vec(static_cast<size_t>(N) * C, 40 + C, 2.0), w = ref::random_vec(C, 41 + C),
                bias = ref::random_vec(C, 42 + C), dout = ref::random_vec(static_cast<size_t>(N) * C, 43 + C);
      const std::vector<float> xf = ref::to_float(x), wf = ref::to_float(w), bf = ref::to_float(bias),
                               gf = ref::to_float(dout);
      // LayerNorm forward and backward (gradients of sum(out * dout) by finite differences in float64;
      // absolute error where they are ~0, as for C = 1, where the output is the bias whatever x is).
      std::vector<float> out(xf.size()), mean(N), rstd(N), dinp(xf.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
      kc::layernorm_forward(out.data(), mean.data(), rstd.data(), xf.data(), wf.data(), bf.data(), N, C);
      EXPECT_LT(rel_err(out, ref::layernorm(x, w, &bias, N, C)), 2e-5) << name << " layernorm C " << C;
      kc::layernorm_backward(dinp.data(), dw.data(), db.data(), gf.data(), xf.data(), wf.data(), mean.data(),
                             rstd.data(), N, C);
      EXPECT_LT(
          rel_err(dinp,
                  ref::fd_grad(x, [&](const Vec& v) { return ref::dot(ref::layernorm(v, w, &bias, N, C), dout); }),
                  1.0),
          2e-4)
          << name << " layernorm dinp C " << C;
      EXPECT_LT(
          rel_err(dw, ref::fd_grad(w, [&](const Vec& v) { return ref::dot(ref::layernorm(x, v, &bias, N, C), dout); }),
                  1.0),
          2e-4)
          << name << " layernorm dweight C " << C;
      EXPECT_LT(
          rel_err(db, ref::fd_grad(bias, [&](const Vec& v) { return ref::dot(ref::layernorm(x, w, &v, N, C), dout); }),
                  1.0),
          2e-4)
          << name << " layernorm dbias C " << C;
      // GELU, exact and tanh: forward, backward, and the fused forward+gradient.
      for (int tanh = 0; tanh < 2; ++tanh) {
        const auto kind = tanh ? kc::GeluKind::kTanh : kc::GeluKind::kExact;
        std::vector<float> y(xf.size()), g(xf.size()), y2(xf.size()), d(xf.size());
        kc::gelu_forward(y.data(), xf.data(), xf.size(), kind);
        EXPECT_LT(rel_err(y, ref::gelu(x, tanh)), 1e-6) << name << " gelu tanh " << tanh << " C " << C;
        kc::gelu_backward(d.data(), xf.data(), gf.data(), xf.size(), kind);
        const Vec want = ref::fd_grad(x, [&](const Vec& v) { return ref::dot(ref::gelu(v, tanh), dout); });
        EXPECT_LT(rel_err(d, want), 1e-5) << name << " gelu backward tanh " << tanh << " C " << C;
        kc::gelu_forward_and_grad(y2.data(), g.data(), xf.data(), xf.size(), kind);
        EXPECT_LT(rel_err(y2, ref::gelu(x, tanh)), 1e-6) << name;
        kc::mul(g.data(), g.data(), gf.data(), g.size());
        EXPECT_LT(rel_err(g, want), 1e-5) << name << " gelu fused gradient tanh " << tanh << " C " << C;
      }
      // Softmax rows.
      std::vector<float> sm(xf.size());
      kc::softmax_forward(sm.data(), xf.data(), N, C);
      EXPECT_LT(rel_err(sm, ref::softmax(x, N, C)), 1e-6) << name << " softmax C " << C;
      // Cross-entropy: the summed loss and dlogits = (softmax - onehot) * dscale.
      std::vector<int32_t> tgt(N);
      for (int i = 0; i < N; ++i) tgt[i] = (i * 5 + 3) % C;
      std::vector<float> dl(xf.size());
      const double loss = kc::cross_entropy_forward_backward(dl.data(), xf.data(), tgt.data(), N, C, 1.0f / N);
      EXPECT_NEAR(loss / N, ref::cross_entropy(x, tgt, N, C), 1e-5) << name << " cross-entropy C " << C;
      const Vec dwant = ref::fd_grad(x, [&](const Vec& v) { return ref::cross_entropy(v, tgt, N, C); });
      EXPECT_LT(rel_err(dl, dwant, 1e-3), 1e-5) << name << " cross-entropy gradient C " << C;
    }
    // AdamW (PyTorch's formula, decoupled decay) over an odd length, two steps, in float64.
    const size_t n = 67;
    const Vec p0 = ref::random_vec(n, 50), g0 = ref::random_vec(n, 51);
    std::vector<float> p = ref::to_float(p0), g = ref::to_float(g0), m(n, 0.0f), v(n, 0.0f);
    Vec pd = to_double(p), md(n, 0.0), vd(n, 0.0);
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int t = 1; t <= 2; ++t) {
      kc::adamw_update(p.data(), g.data(), m.data(), v.data(), n, static_cast<float>(lr), static_cast<float>(b1),
                       static_cast<float>(b2), static_cast<float>(eps), static_cast<float>(wd), t);
      for (size_t i = 0; i < n; ++i) {
        const double gi = g[i];
        pd[i] *= 1 - lr * wd;
        md[i] = b1 * md[i] + (1 - b1) * gi;
        vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
        const double mh = md[i] / (1 - std::pow(b1, t)), vh = vd[i] / (1 - std::pow(b2, t));
        pd[i] -= lr * mh / (std::sqrt(vh) + eps);
      }
    }
    EXPECT_LT(rel_err(p, pd), 1e-6) << name << " adamw";
    EXPECT_LT(rel_err(m, md), 1e-6) << name << " adamw exp_avg";
    EXPECT_LT(rel_err(v, vd), 1e-6) << name << " adamw exp_avg_sq";
  }
}

TEST(IsaKernels, AttentionEveryLevelAgainstFloat64) {
  // T of 1, 7, 13 and 67 (past 64: a ragged 16-lane tail); head dims 4, 8, 20.
  const int cases[][3] = {{1, 8, 2}, {7, 8, 1}, {13, 40, 2}, {67, 16, 4}};
  for (const auto& cs : cases) {
    const int T = cs[0], C = cs[1], NH = cs[2], B = T > 32 ? 1 : 2;  // one sequence at T 67: the reference is O(T^3)
    const Vec qkv = ref::random_vec(static_cast<size_t>(B) * T * 3 * C, 70 + T, 0.7);
    const Vec dout = ref::random_vec(static_cast<size_t>(B) * T * C, 71 + T);
    const Vec want = ref::attention(qkv, B, T, C, NH);
    const Vec dwant = ref::fd_grad(qkv, [&](const Vec& v) { return ref::dot(ref::attention(v, B, T, C, NH), dout); });
    const std::vector<float> qf = ref::to_float(qkv), df = ref::to_float(dout);
    for (kc::Isa l : levels()) {
      IsaScope scope(l);
      std::vector<float> y(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * NH * T), dqkv(qf.size(), 7.0f);
      kc::attention_forward(y.data(), lse.data(), qf.data(), B, T, C, NH);
      kc::attention_backward(dqkv.data(), df.data(), qf.data(), y.data(), lse.data(), B, T, C, NH);
      EXPECT_LT(rel_err(y, want), 1e-5) << kc::isa_name(l) << " T " << T << " C " << C << " NH " << NH;
      EXPECT_LT(rel_err(dqkv, dwant), 1e-4) << kc::isa_name(l) << " backward T " << T << " C " << C << " NH " << NH;
    }
  }
}

// bfloat16 operands rounded to nearest even are unbiased: a GPT step's gradients stay within a few 1e-3 of
// float32's, in direction and in size. Truncating the operands instead (every product shrunk toward zero,
// 2^-8 per operand at worst) biases them: the gradient norm comes out smaller and the error about twice as
// large, and both bounds below fail (checked by planting truncation in the rounding of every path that
// rounds in software: tests/mutants/mutants.tsv, bf16_truncates_instead_of_rounding).
TEST(IsaKernels, GptStepInBfloat16EveryLevelTracksFloat32) {
  const nlohmann::json base = {{"kind", "gpt"},    {"n_layer", 2},     {"n_head", 2},  {"n_embd", 32},
                               {"block_size", 13}, {"vocab_size", 37}, {"bias", true}, {"seed", 5}};
  const int B = 3, T = 13;
  std::vector<int32_t> x(B * T), y(B * T);
  for (int i = 0; i < B * T; ++i) x[i] = (i * 7 + 3) % 37, y[i] = (i * 5 + 1) % 37;
  double f32_loss = 0;
  std::vector<float> g32;
  {
    IsaScope scope(kc::machine_isa());
    auto m = trident::nn::make_model(base);
    m->zero_grad();
    f32_loss = m->forward_backward(x.data(), y.data(), B, T, true);
    g32.assign(m->grad_data(), m->grad_data() + m->num_params());
  }
  double n32 = 0;
  for (float g : g32) n32 += static_cast<double>(g) * g;
  n32 = std::sqrt(n32);
  ASSERT_GT(n32, 0);
  nlohmann::json cfg = base;
  cfg["dtype"] = "bfloat16";
  // The bfloat16 attention kernel at this short T too (by default it takes T > 64).
  const int min_t_was = kc::detail::flash_bf16_min_t();
  kc::detail::set_flash_bf16_min_t(1);
  for (const Path& path : paths()) {
    IsaScope scope(path.isa, path.dot);
    auto m = trident::nn::make_model(cfg);
    m->zero_grad();
    const double loss = m->forward_backward(x.data(), y.data(), B, T, true);
    EXPECT_NEAR(loss, f32_loss, 2e-3 * f32_loss) << path.name();
    ASSERT_EQ(m->num_params(), g32.size());
    double diff = 0, nbf = 0;
    for (size_t i = 0; i < g32.size(); ++i) {
      const double g = m->grad_data()[i];
      diff += (g - g32[i]) * (g - g32[i]);
      nbf += g * g;
    }
    const double rel = std::sqrt(diff) / n32, ratio = std::sqrt(nbf) / n32;
    std::printf("%-22s loss %.6f (float32 %.6f)  gradient: relative error %.2e, norm ratio %.5f\n",
                path.name().c_str(), loss, f32_loss, rel, ratio);
    EXPECT_LT(rel, kBf16GradRelErr) << path.name();
    EXPECT_NEAR(ratio, 1.0, kBf16GradNormShift) << path.name();
  }
  kc::detail::set_flash_bf16_min_t(min_t_was);
}
