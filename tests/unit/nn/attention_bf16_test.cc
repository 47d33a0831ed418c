// Causal attention with bfloat16 operands (kernels::cpu::attention_forward/backward with
// Precision::kBFloat16). At levels avx512bf16 and amx the flash-style kernel (attention_bf16.cc) runs where
// vdpbf16ps pays; it is checked with vdpbf16ps forced on and as auto picks: the output, the log-sum-exp and
// the gradients of q, k and v against float64, at sequence lengths inside, at and across the 64-row tiles
// (1, 7, 64, 257), head dims of GPT-2 and Llama (64, 128), one not a multiple of the 16-lane vectors (20)
// and an odd one (9), several heads, and grouped-query attention (key/value heads widened by kv_expand and
// their gradients summed by kv_reduce, as the Llama block does). Where the kernel does not run (levels
// below avx512bf16, vdpbf16ps off), bfloat16 attention is the float32 kernel bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "reference.h"
#include "trident/kernels/cpu/attention_bf16.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/kernels/cpu/ops.h"

namespace kc = trident::kernels::cpu;
using ref::Vec;

namespace {

// Bounds on the relative L2 error against float64 (||got - want|| / ||want||). bfloat16 keeps 8 bits of
// mantissa (relative rounding error up to 2^-9, about 2e-3, on q, k, v, dO and the probabilities); measured
// on this file's cases (AMD EPYC Zen 5, avx512bf16): output up to 2.9e-3, gradients up to 3.7e-3, lse off by
// up to 5.7e-3 (absolute; scores of order 1). The float32 kernel is at 1e-7. A tile that forgets to rescale
// its running sum, or a causal mask one key off, is off by 1e-1 and more.
constexpr double kFlashOutBound = 6e-3;
constexpr double kFlashGradBound = 1e-2;
constexpr double kFlashLseBound = 1.5e-2;

// A level, a vdpbf16ps mode and the shortest sequence the flash kernel takes (1: every T), one thread.
class FlashScope {
 public:
  FlashScope(kc::Isa isa, kc::Bf16Dot dot, int flash_min_t = 1)
      : was_(kc::set_isa(isa)), dot_was_(kc::set_bf16_dot(dot)), min_t_was_(kc::detail::flash_bf16_min_t()) {
    kc::detail::set_flash_bf16_min_t(flash_min_t);
    kc::set_num_threads(1);
  }
  ~FlashScope() {
    kc::detail::set_flash_bf16_min_t(min_t_was_);
    kc::set_bf16_dot(dot_was_);
    kc::set_isa(was_);
  }
  FlashScope(const FlashScope&) = delete;
  FlashScope& operator=(const FlashScope&) = delete;

 private:
  kc::Isa was_;
  kc::Bf16Dot dot_was_;
  int min_t_was_;
};

// ||got - want|| / max(||want||, floor).
double flash_rel_l2(const std::vector<float>& got, const Vec& want, double floor = 1e-150) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

double flash_norm(const Vec& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

double flash_max_abs(const std::vector<float>& got, const Vec& want) {
  double m = 0;
  for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::abs(got[i] - want[i]));
  return m;
}

// Columns [part C, (part + 1) C) of every row of a [N, 3C] buffer: q, k or v.
template <class T>
std::vector<T> flash_part(const std::vector<T>& x, int N, int C, int part) {
  std::vector<T> out(static_cast<size_t>(N) * C);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) out[static_cast<size_t>(r) * C + c] = x[static_cast<size_t>(r) * 3 * C + part * C + c];
  return out;
}

struct FlashOut {
  std::vector<float> y, lse, dqkv;
};
FlashOut flash_attend(const std::vector<float>& qkv, const std::vector<float>& dout, int B, int T, int C, int NH,
                      kc::Precision p) {
  FlashOut r{std::vector<float>(static_cast<size_t>(B) * T * C), std::vector<float>(static_cast<size_t>(B) * NH * T),
        std::vector<float>(qkv.size(), 7.0f)};
  kc::attention_forward(r.y.data(), r.lse.data(), qkv.data(), B, T, C, NH, p);
  kc::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.y.data(), r.lse.data(), B, T, C, NH, p);
  return r;
}

std::vector<kc::Isa> flash_levels() {
  std::vector<kc::Isa> out;
  for (kc::Isa l : kernel_test::levels())
    if (l >= kc::Isa::kAvx512Bf16) out.push_back(l);
  return out;
}

}  // namespace

TEST(AttentionBf16, FlashKernelAgainstFloat64) {
  const auto levels = flash_levels();
  if (levels.empty()) GTEST_SKIP() << "no AVX512-BF16 on this CPU (features: " << kc::cpu_features() << ")";
  struct Case {
    int B, T, NH, hd;
  };
  const Case cases[] = {{2, 1, 2, 64},  {2, 7, 3, 64},  {1, 64, 2, 64}, {1, 257, 2, 64},
                        {1, 257, 1, 128}, {1, 130, 2, 20}, {2, 7, 2, 9},  {1, 77, 3, 9}};
  for (const Case& cs : cases) {
    const int B = cs.B, T = cs.T, NH = cs.NH, C = NH * cs.hd, N = B * T;
    const Vec qkv = ref::random_vec(static_cast<size_t>(N) * 3 * C, 900 + T + cs.hd, 1.0);
    const Vec dout = ref::random_vec(static_cast<size_t>(N) * C, 901 + T);
    Vec lse_want;
    const Vec want = ref::attention(qkv, B, T, C, NH);
    const Vec dwant = ref::attention_grad(qkv, dout, B, T, C, NH, &lse_want);
    const std::vector<float> qf = ref::to_float(qkv), df = ref::to_float(dout);
    std::vector<float> f32_y;
    {
      FlashScope s(levels.front(), kc::Bf16Dot::kOn);
      f32_y = flash_attend(qf, df, B, T, C, NH, kc::Precision::kFloat32).y;
    }
    for (kc::Isa l : levels)
      for (kc::Bf16Dot dot : {kc::Bf16Dot::kOn, kc::Bf16Dot::kAuto}) {
        FlashScope s(l, dot);
        if (!kc::bf16_dot_in_use()) continue;  // auto where vdpbf16ps does not pay: the float32 kernel (below)
        const std::string name = std::string(kc::isa_name(l)) + " dot " + kc::bf16_dot_name(dot) + " B " +
                                 std::to_string(B) + " T " + std::to_string(T) + " NH " + std::to_string(NH) +
                                 " hd " + std::to_string(cs.hd);
        const FlashOut r = flash_attend(qf, df, B, T, C, NH, kc::Precision::kBFloat16);
        const double ey = flash_rel_l2(r.y, want), el = flash_max_abs(r.lse, lse_want);
        // Each part against its own size, or v's where it is smaller: at T 1 the gradients of q and k are
        // exactly zero (one key, probability 1), and the kernel's are the rounding of dP - D.
        double eg[3];
        const double floor = flash_norm(flash_part(dwant, N, C, 2));
        for (int part = 0; part < 3; ++part)
          eg[part] = flash_rel_l2(flash_part(r.dqkv, N, C, part), flash_part(dwant, N, C, part), floor);
        std::printf("%-44s out %.2e  lse %.2e  dq %.2e  dk %.2e  dv %.2e\n", name.c_str(), ey, el, eg[0], eg[1],
                    eg[2]);
        EXPECT_LT(ey, kFlashOutBound) << name;
        EXPECT_LT(el, kFlashLseBound) << name;
        EXPECT_LT(eg[0], kFlashGradBound) << name << " dq";
        EXPECT_LT(eg[1], kFlashGradBound) << name << " dk";
        EXPECT_LT(eg[2], kFlashGradBound) << name << " dv";
        // The bfloat16 kernel ran: its output is not the float32 kernel's.
        EXPECT_FALSE(kernel_test::same_bits(r.y, f32_y)) << name;
      }
  }
}

// The float64 gradient the tests below compare with, against central differences of the float64 forward.
TEST(AttentionBf16, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 5, C = 6, NH = 2;
  const Vec qkv = ref::random_vec(static_cast<size_t>(B) * T * 3 * C, 940, 0.8);
  const Vec dout = ref::random_vec(static_cast<size_t>(B) * T * C, 941);
  const Vec fd = ref::fd_grad(qkv, [&](const Vec& v) { return ref::dot(ref::attention(v, B, T, C, NH), dout); });
  const Vec g = ref::attention_grad(qkv, dout, B, T, C, NH);
  double err = 0;
  for (size_t i = 0; i < g.size(); ++i) err = std::max(err, std::abs(g[i] - fd[i]));
  EXPECT_LT(err, 1e-8);
}

// Grouped-query attention as the Llama block runs it: q heads nh, key/value heads nkv widened to nh before
// the kernel (kv_expand) and each kv head's gradient summed over the q heads that read it (kv_reduce).
TEST(AttentionBf16, GroupedQueryAttentionAgainstFloat64) {
  const auto levels = flash_levels();
  if (levels.empty()) GTEST_SKIP() << "no AVX512-BF16 on this CPU (features: " << kc::cpu_features() << ")";
  const int B = 1, T = 70, nh = 4, hd = 64, N = B * T, C = nh * hd;
  for (int nkv : {2, 1}) {
    const int group = nh / nkv, W = (nh + 2 * nkv) * hd;
    const Vec src = ref::random_vec(static_cast<size_t>(N) * W, 950 + nkv, 1.0);
    const Vec dout = ref::random_vec(static_cast<size_t>(N) * C, 951 + nkv);
    // float64: widen, flash_attend, and sum the widened gradients back.
    Vec full(static_cast<size_t>(N) * 3 * C);
    for (int r = 0; r < N; ++r)
      for (int h = 0; h < nh; ++h)
        for (int d = 0; d < hd; ++d) {
          const size_t o = static_cast<size_t>(r) * 3 * C + h * hd + d, s = static_cast<size_t>(r) * W;
          full[o] = src[s + h * hd + d];
          full[o + C] = src[s + (nh + h / group) * hd + d];
          full[o + 2 * C] = src[s + (nh + nkv + h / group) * hd + d];
        }
    const Vec want = ref::attention(full, B, T, C, nh);
    const Vec gfull = ref::attention_grad(full, dout, B, T, C, nh);
    Vec dwant(src.size(), 0.0);
    for (int r = 0; r < N; ++r)
      for (int h = 0; h < nh; ++h)
        for (int d = 0; d < hd; ++d) {
          const size_t o = static_cast<size_t>(r) * 3 * C + h * hd + d, s = static_cast<size_t>(r) * W;
          dwant[s + h * hd + d] += gfull[o];
          dwant[s + (nh + h / group) * hd + d] += gfull[o + C];
          dwant[s + (nh + nkv + h / group) * hd + d] += gfull[o + 2 * C];
        }
    const std::vector<float> sf = ref::to_float(src), df = ref::to_float(dout);
    for (kc::Isa l : levels) {
      FlashScope s(l, kc::Bf16Dot::kOn);
      std::vector<float> wide(static_cast<size_t>(N) * 3 * C), dwide(wide.size()), dsrc(sf.size());
      kc::kv_expand(wide.data(), sf.data(), N, nh, nkv, hd, 0, group, 0);
      const FlashOut r = flash_attend(wide, df, B, T, C, nh, kc::Precision::kBFloat16);
      kc::kv_reduce(dsrc.data(), r.dqkv.data(), N, nh, nkv, hd, 0, group, 0);
      const double ey = flash_rel_l2(r.y, want), eg = flash_rel_l2(dsrc, dwant);
      std::printf("%s gqa %d:%d  out %.2e  d(q|k|v) %.2e\n", kc::isa_name(l), nh, nkv, ey, eg);
      EXPECT_LT(ey, kFlashOutBound) << kc::isa_name(l) << " nkv " << nkv;
      EXPECT_LT(eg, kFlashGradBound) << kc::isa_name(l) << " nkv " << nkv;
    }
  }
}

// Without the kernel, bfloat16 attention is the float32 one: levels below avx512bf16, vdpbf16ps off, and
// sequences of one 64-key tile or less (the default threshold).
TEST(AttentionBf16, WithoutTheKernelBfloat16IsTheFloat32Kernel) {
  const int B = 2, T = 67, NH = 2, C = 40;
  const auto qkv = ref::to_float(ref::random_vec(static_cast<size_t>(B) * T * 3 * C, 960, 0.7));
  const auto dout = ref::to_float(ref::random_vec(static_cast<size_t>(B) * T * C, 961));
  for (kc::Isa l : flash_levels()) {
    const int t = 64;  // the first 64 rows of each sequence: B T' rows of 3C, as a batch of T' = 64
    std::vector<float> q64, d64;
    for (int b = 0; b < B; ++b) {
      q64.insert(q64.end(), qkv.begin() + static_cast<ptrdiff_t>(b) * T * 3 * C,
                 qkv.begin() + static_cast<ptrdiff_t>(b) * T * 3 * C + t * 3 * C);
      d64.insert(d64.end(), dout.begin() + static_cast<ptrdiff_t>(b) * T * C,
                 dout.begin() + static_cast<ptrdiff_t>(b) * T * C + t * C);
    }
    FlashScope s(l, kc::Bf16Dot::kOn, kc::detail::flash_bf16_min_t());
    const FlashOut a = flash_attend(q64, d64, B, t, C, NH, kc::Precision::kFloat32);
    const FlashOut b = flash_attend(q64, d64, B, t, C, NH, kc::Precision::kBFloat16);
    EXPECT_TRUE(kernel_test::same_bits(a.y, b.y)) << kc::isa_name(l) << " T 64";
    EXPECT_TRUE(kernel_test::same_bits(a.dqkv, b.dqkv)) << kc::isa_name(l) << " T 64";
    const FlashOut c = flash_attend(qkv, dout, B, T, C, NH, kc::Precision::kBFloat16);  // T 67: the kernel
    EXPECT_FALSE(kernel_test::same_bits(flash_attend(qkv, dout, B, T, C, NH, kc::Precision::kFloat32).y, c.y))
        << kc::isa_name(l) << " T 67";
  }
  for (kc::Isa l : kernel_test::levels()) {
    FlashScope s(l, kc::Bf16Dot::kOff);
    const FlashOut a = flash_attend(qkv, dout, B, T, C, NH, kc::Precision::kFloat32);
    const FlashOut b = flash_attend(qkv, dout, B, T, C, NH, kc::Precision::kBFloat16);
    EXPECT_TRUE(kernel_test::same_bits(a.y, b.y)) << kc::isa_name(l);
    EXPECT_TRUE(kernel_test::same_bits(a.lse, b.lse)) << kc::isa_name(l);
    EXPECT_TRUE(kernel_test::same_bits(a.dqkv, b.dqkv)) << kc::isa_name(l);
    const std::string summary = kc::kernel_summary();
    EXPECT_NE(summary.find("attention bfloat16 " + std::string(l == kc::Isa::kPortable ? "row-blocked" : "avx")),
              std::string::npos)
        << summary;
  }
  for (kc::Isa l : flash_levels()) {
    FlashScope s(l, kc::Bf16Dot::kOn);
    const std::string summary = kc::kernel_summary();
    EXPECT_NE(summary.find("attention bfloat16 avx512bf16-flash"), std::string::npos) << summary;
  }
}
