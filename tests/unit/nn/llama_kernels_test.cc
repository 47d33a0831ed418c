// The Llama family's CPU kernels (kernels/cpu/llama.cc: RMSNorm, rotary embeddings, SwiGLU, grouped-query
// key/value expansion and reduction) at every ISA level the machine runs, against float64 references written
// here from the definitions (Hugging Face's LlamaRMSNorm, apply_rotary_pos_emb with rotate_half, LlamaMLP,
// repeat_kv), at odd sizes; backward kernels against the analytic float64 gradients, which are themselves
// checked against central differences; rope's inverse undoes it and is its adjoint; kv_reduce is kv_expand's
// adjoint; and every kernel gives bitwise the same result on 1, 2, 3 and 5 threads with tasks shrunk so small
// shapes split into many chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernel_test_util.h"
#include "reference.h"
#include "trident/core/error.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/thread_pool.h"

namespace kc = trident::kernels::cpu;
using ref::Vec;

using kernel_test::levels;
using kernel_test::rel_err;
using kernel_test::same_bits;
using kernel_test::to_double;

namespace {

// ---- float64 references ----

// out = x / sqrt(mean x^2 + eps) * w; rstd per row.
Vec rmsnorm_ref(const Vec& x, const Vec& w, int N, int C, double eps, Vec* rstd = nullptr) {
  Vec out(x.size());
  if (rstd) rstd->assign(N, 0.0);
  for (int r = 0; r < N; ++r) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[r * C + c] * x[r * C + c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) out[r * C + c] = x[r * C + c] * rs * w[c];
    if (rstd) (*rstd)[r] = rs;
  }
  return out;
}

// Gradients of <rmsnorm(x, w), g> with respect to x and w.
void rmsnorm_grad_ref(const Vec& x, const Vec& w, const Vec& g, int N, int C, double eps, Vec& dx, Vec& dw) {
  dx.assign(x.size(), 0.0);
  dw.assign(C, 0.0);
  for (int r = 0; r < N; ++r) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[r * C + c] * x[r * C + c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    double dot = 0;  // sum_c g w x
    for (int c = 0; c < C; ++c) dot += g[r * C + c] * w[c] * x[r * C + c];
    for (int c = 0; c < C; ++c) {
      dx[r * C + c] = rs * g[r * C + c] * w[c] - x[r * C + c] * rs * rs * rs * dot / C;
      dw[c] += g[r * C + c] * x[r * C + c] * rs;
    }
  }
}

// Hugging Face's rotate-half rotary embedding on rows of `stride`, heads [0, n_heads) of hd; sign -1 rotates back.
Vec rope_ref(Vec x, const Vec& cos, const Vec& sin, int N, int T, int stride, int n_heads, int hd, double sign) {
  const int half = hd / 2;
  for (int r = 0; r < N; ++r) {
    const int p = r % T;
    for (int h = 0; h < n_heads; ++h) {
      double* q = x.data() + static_cast<size_t>(r) * stride + static_cast<size_t>(h) * hd;
      // q * cos + rotate_half(q) * sin, rotate_half(q) = [-q2, q1]
      Vec rot(hd);
      for (int i = 0; i < hd; ++i) {
        const double c = cos[p * half + i % half], s = sign * sin[p * half + i % half];
        const double rh = i < half ? -q[i + half] : q[i - half];
        rot[i] = q[i] * c + rh * s;
      }
      std::copy(rot.begin(), rot.end(), q);
    }
  }
  return x;
}

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

Vec swiglu_ref(const Vec& h, int N, int I) {
  Vec out(static_cast<size_t>(N) * I);
  for (int r = 0; r < N; ++r)
    for (int i = 0; i < I; ++i) {
      const double g = h[r * 2 * I + i], u = h[r * 2 * I + I + i];
      out[r * I + i] = g * sigmoid(g) * u;
    }
  return out;
}

// Gradient of <swiglu(h), d> with respect to h.
Vec swiglu_grad_ref(const Vec& h, const Vec& d, int N, int I) {
  Vec dh(h.size());
  for (int r = 0; r < N; ++r)
    for (int i = 0; i < I; ++i) {
      const double g = h[r * 2 * I + i], u = h[r * 2 * I + I + i], s = sigmoid(g);
      dh[r * 2 * I + i] = d[r * I + i] * u * (s + g * s * (1 - s));
      dh[r * 2 * I + I + i] = d[r * I + i] * g * s;
    }
  return dh;
}

// repeat_kv on the packed layout: q | k | v with nh heads each, q head j reading kv head (h0 + j) / group - kv0.
struct KvShape {
  int nh, nkv, h0, group, kv0;
};
template <class T>
std::vector<T> kv_expand_ref(const std::vector<T>& src, int N, KvShape s, int hd) {
  const size_t q = static_cast<size_t>(s.nh) * hd, kv = static_cast<size_t>(s.nkv) * hd, ls = q + 2 * kv, ld = 3 * q;
  std::vector<T> dst(N * ld);
  for (int r = 0; r < N; ++r)
    for (size_t c = 0; c < ld; ++c) {
      const size_t part = c / q, j = (c % q) / hd, d = c % hd;
      const size_t m = static_cast<size_t>((s.h0 + static_cast<int>(j)) / s.group - s.kv0);
      dst[r * ld + c] = part == 0 ? src[r * ls + c] : src[r * ls + q + (part - 1) * kv + m * hd + d];
    }
  return dst;
}
// Its adjoint, summing in ascending j (T = float gives the kernel's exact bits).
template <class T>
std::vector<T> kv_reduce_ref(const std::vector<T>& ddst, int N, KvShape s, int hd) {
  const size_t q = static_cast<size_t>(s.nh) * hd, kv = static_cast<size_t>(s.nkv) * hd, ls = q + 2 * kv, ld = 3 * q;
  std::vector<T> dsrc(N * ls, T(0));
  for (int r = 0; r < N; ++r) {
    for (size_t c = 0; c < q; ++c) dsrc[r * ls + c] = ddst[r * ld + c];
    for (int j = 0; j < s.nh; ++j) {
      const size_t m = static_cast<size_t>((s.h0 + j) / s.group - s.kv0);
      for (int d = 0; d < hd; ++d) {
        dsrc[r * ls + q + m * hd + d] += ddst[r * ld + q + j * hd + d];
        dsrc[r * ls + q + kv + m * hd + d] += ddst[r * ld + 2 * q + j * hd + d];
      }
    }
  }
  return dsrc;
}

// The shapes: MHA (nkv = nh), MQA (nkv = 1), GQA, and tensor-parallel shards (h0, kv0 nonzero; a kv head read by
// no local q head; a replicated kv head when n_kv_head < tp).
const KvShape kKvShapes[] = {
    {4, 4, 0, 1, 0},  // MHA
    {4, 1, 0, 4, 0},  // MQA
    {6, 2, 0, 3, 0},  // GQA, 2 kv heads of 3 q heads each
    {4, 1, 4, 4, 1},  // n_head 8, n_kv 2, tp 2, rank 1
    {2, 1, 6, 2, 3},  // n_head 8, n_kv 4, tp 4, rank 3
    {2, 1, 2, 4, 0},  // n_head 8, n_kv 2, tp 4, rank 1: kv head 0 replicated
    {2, 2, 2, 2, 0},  // q heads 2, 3 read kv head 1 only; kv head 0 is read by none
    {3, 3, 3, 1, 3},  // MHA shard, h0 = kv0 = 3
};

// ---- helpers ----

std::vector<float> rnd(size_t n, uint64_t seed, double scale = 1.0) {
  return ref::to_float(ref::random_vec(n, seed, scale));
}
double rel_err64(const Vec& got, const Vec& want) {
  double num = 0, den = 1e-300;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}


// An ISA level, a thread count and the task-size knob for a scope; restores one thread and whole tasks.
class Scope {
 public:
  explicit Scope(kc::Isa isa, int threads = 1, int divisor = 1) : was_(kc::set_isa(isa)) {
    kc::set_num_threads(threads);
    kc::detail::set_task_size_divisor(divisor);
  }
  ~Scope() {
    kc::set_num_threads(1);
    kc::detail::set_task_size_divisor(1);
    kc::set_isa(was_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  kc::Isa was_;
};

// Llama's tables: cos/sin of p * base^(-2i/hd), [T_max, hd/2].
void rope_tables(int T_max, int hd, std::vector<float>& cos, std::vector<float>& sin) {
  const int half = hd / 2;
  cos.resize(static_cast<size_t>(T_max) * half);
  sin.resize(cos.size());
  for (int p = 0; p < T_max; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / hd);
      cos[p * half + i] = static_cast<float>(std::cos(a));
      sin[p * half + i] = static_cast<float>(std::sin(a));
    }
}

const int kRows[] = {1, 7, 33};

}  // namespace

// ---- RMSNorm ----

TEST(LlamaKernels, RmsNormReferenceGradientMatchesFiniteDifferences) {
  const int N = 3, C = 13;
  const double eps = 1e-5;
  const Vec x = ref::random_vec(N * C, 1), w = ref::random_vec(C, 2), g = ref::random_vec(N * C, 3);
  Vec dx, dw;
  rmsnorm_grad_ref(x, w, g, N, C, eps, dx, dw);
  const Vec fdx = ref::fd_grad(x, [&](const Vec& xx) { return ref::dot(rmsnorm_ref(xx, w, N, C, eps), g); });
  const Vec fdw = ref::fd_grad(w, [&](const Vec& ww) { return ref::dot(rmsnorm_ref(x, ww, N, C, eps), g); });
  EXPECT_LT(rel_err64(dx, fdx), 1e-8);
  EXPECT_LT(rel_err64(dw, fdw), 1e-8);
}

TEST(LlamaKernels, RmsNormForwardBackwardEveryLevel) {
  const float eps = 1e-5f;
  for (kc::Isa isa : levels()) {
    Scope scope(isa);
    for (int N : kRows)
      for (int C : {1, 13, 64}) {
        const std::string tag = fmt::format("{} N={} C={}", kc::isa_name(isa), N, C);
        const auto x = rnd(N * C, 10 + C, 2.0), w = rnd(C, 11), g = rnd(N * C, 12);
        Vec rstd_want;
        const Vec want = rmsnorm_ref(to_double(x), to_double(w), N, C, eps, &rstd_want);
        std::vector<float> out(N * C), rstd(N);
        kc::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
        EXPECT_LT(rel_err(out, want), 1e-6) << tag;
        EXPECT_LT(rel_err(rstd, rstd_want), 1e-6) << tag;
        std::vector<float> out2(N * C, -1.0f);
        kc::rmsnorm_forward(out2.data(), nullptr, x.data(), w.data(), N, C, eps);  // rstd nullable
        EXPECT_TRUE(same_bits(out, out2)) << tag;

        // Backward accumulates into dinp and dweight.
        Vec dx, dw;
        rmsnorm_grad_ref(to_double(x), to_double(w), to_double(g), N, C, eps, dx, dw);
        auto dinp = rnd(N * C, 13), dweight = rnd(C, 14);
        Vec dx_want = to_double(dinp), dw_want = to_double(dweight);
        for (size_t i = 0; i < dx.size(); ++i) dx_want[i] += dx[i];
        for (size_t i = 0; i < dw.size(); ++i) dw_want[i] += dw[i];
        kc::rmsnorm_backward(dinp.data(), dweight.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
        EXPECT_LT(rel_err(dinp, dx_want), 2e-6) << tag;
        // dweight sums N float terms that may cancel: judged on the scale of the terms' magnitudes.
        double dw_scale = 0;
        for (int c = 0; c < C; ++c) {
          double m = std::abs(dw_want[c] - dw[c]);
          for (int r = 0; r < N; ++r) m += std::abs(static_cast<double>(g[r * C + c]) * x[r * C + c] * rstd_want[r]);
          dw_scale = std::max(dw_scale, m);
        }
        EXPECT_LT(rel_err(dweight, dw_want, dw_scale), 1e-6) << tag;
      }
  }
}

// ---- rotary embedding ----

TEST(LlamaKernels, RopeForwardInverseAndAdjointEveryLevel) {
  for (kc::Isa isa : levels()) {
    Scope scope(isa);
    for (int N : kRows)
      for (int hd : {2, 8, 16})
        for (int n_heads : {1, 3}) {
          // Rows of a packed q | k | v (stride wider than the heads), rotating the k heads at an offset; T divides
          // the rows into sequences, T_max > T.
          const int T = std::min(N, 5), T_max = T + 3, off = n_heads * hd, stride = 3 * n_heads * hd + 1;
          const std::string tag = fmt::format("{} N={} hd={} n_heads={}", kc::isa_name(isa), N, hd, n_heads);
          std::vector<float> cos, sin;
          rope_tables(T_max, hd, cos, sin);
          const auto x0 = rnd(static_cast<size_t>(N) * stride, 20 + hd);
          // The reference on the k heads only: the rest of each row is left as it was.
          Vec want(x0.begin(), x0.end());
          {
            Vec part(want.begin() + off, want.end());
            part = rope_ref(part, to_double(cos), to_double(sin), N, T, stride, n_heads, hd, 1.0);
            std::copy(part.begin(), part.end(), want.begin() + off);
          }
          auto x = x0;
          kc::rope(x.data() + off, cos.data(), sin.data(), N, T, stride, n_heads, hd, false);
          EXPECT_LT(rel_err(x, want), 1e-6) << tag;
          for (int r = 0; r < N; ++r)  // untouched columns keep their bits
            for (int c = 0; c < stride; ++c)
              if (c < off || c >= off + n_heads * hd) {
                ASSERT_EQ(x[r * stride + c], x0[r * stride + c]) << tag;
              }

          // The inverse undoes it ...
          kc::rope(x.data() + off, cos.data(), sin.data(), N, T, stride, n_heads, hd, true);
          EXPECT_LT(rel_err(x, to_double(x0)), 1e-6) << tag;
          // ... matches the reference rotation by -angle ...
          auto y0 = rnd(x0.size(), 30 + hd), y = y0;
          kc::rope(y.data() + off, cos.data(), sin.data(), N, T, stride, n_heads, hd, true);
          {
            Vec yw(y0.begin(), y0.end()), part(yw.begin() + off, yw.end());
            part = rope_ref(part, to_double(cos), to_double(sin), N, T, stride, n_heads, hd, -1.0);
            std::copy(part.begin(), part.end(), yw.begin() + off);
            EXPECT_LT(rel_err(y, yw), 1e-6) << tag;
          }
          // ... and is the adjoint (the backward): <rope(x0), y0> == <x0, rope_inv(y0)>.
          auto fx = x0;
          kc::rope(fx.data() + off, cos.data(), sin.data(), N, T, stride, n_heads, hd, false);
          const double lhs = ref::dot(to_double(fx), to_double(y0)), rhs = ref::dot(to_double(x0), to_double(y));
          EXPECT_NEAR(lhs, rhs, 1e-5 * (1 + std::abs(lhs))) << tag;
        }
  }
}

TEST(LlamaKernels, RopeRefusesAnOddHeadDim) {
  std::vector<float> x(6), cs(3);
  EXPECT_THROW(kc::rope(x.data(), cs.data(), cs.data(), 1, 1, 6, 2, 3, false), trident::InvalidArgument);
}

// ---- SwiGLU ----

TEST(LlamaKernels, SwigluReferenceGradientMatchesFiniteDifferences) {
  const int N = 3, I = 7;
  const Vec h = ref::random_vec(N * 2 * I, 40, 3.0), d = ref::random_vec(N * I, 41);
  const Vec fd = ref::fd_grad(h, [&](const Vec& hh) { return ref::dot(swiglu_ref(hh, N, I), d); });
  EXPECT_LT(rel_err64(swiglu_grad_ref(h, d, N, I), fd), 1e-8);
}

TEST(LlamaKernels, SwigluForwardBackwardEveryLevel) {
  for (kc::Isa isa : levels()) {
    Scope scope(isa);
    for (int N : kRows)
      for (int I : {1, 13, 64}) {
        const std::string tag = fmt::format("{} N={} I={}", kc::isa_name(isa), N, I);
        auto h = rnd(N * 2 * I, 50 + I, 3.0);
        if (N * I >= 2) {  // the tails of the sigmoid
          h[0] = -90.0f;
          h[1] = 40.0f;
        }
        const auto d = rnd(N * I, 51);
        std::vector<float> out(N * I), dh(N * 2 * I, 123.0f);  // dh overwritten
        kc::swiglu_forward(out.data(), h.data(), N, I);
        kc::swiglu_backward(dh.data(), d.data(), h.data(), N, I);
        EXPECT_LT(rel_err(out, swiglu_ref(to_double(h), N, I)), 1e-6) << tag;
        EXPECT_LT(rel_err(dh, swiglu_grad_ref(to_double(h), to_double(d), N, I)), 1e-6) << tag;
      }
  }
}

// ---- grouped-query key/value sharing ----

TEST(LlamaKernels, KvExpandReduceAndAdjointEveryLevel) {
  for (kc::Isa isa : levels()) {
    Scope scope(isa);
    for (const KvShape& s : kKvShapes)
      for (int N : kRows)
        for (int hd : {2, 8, 16}) {
          const std::string tag = fmt::format("{} nh={} nkv={} h0={} group={} kv0={} N={} hd={}", kc::isa_name(isa),
                                              s.nh, s.nkv, s.h0, s.group, s.kv0, N, hd);
          const size_t ls = static_cast<size_t>(s.nh + 2 * s.nkv) * hd, ld = static_cast<size_t>(3 * s.nh) * hd;
          const auto src = rnd(N * ls, 60 + hd), ddst = rnd(N * ld, 61 + hd);
          std::vector<float> dst(N * ld, 7.0f), dsrc(N * ls, 7.0f);  // both overwritten
          kc::kv_expand(dst.data(), src.data(), N, s.nh, s.nkv, hd, s.h0, s.group, s.kv0);
          kc::kv_reduce(dsrc.data(), ddst.data(), N, s.nh, s.nkv, hd, s.h0, s.group, s.kv0);
          EXPECT_TRUE(same_bits(dst, kv_expand_ref(src, N, s, hd))) << tag;  // a copy: exact
          EXPECT_TRUE(same_bits(dsrc, kv_reduce_ref(ddst, N, s, hd))) << tag;  // ascending j: exact
          EXPECT_LT(rel_err(dsrc, kv_reduce_ref(to_double(ddst), N, s, hd)), 1e-6) << tag;
          // Adjoint: <expand(x), y> == <x, reduce(y)>.
          const double lhs = ref::dot(to_double(dst), to_double(ddst)), rhs = ref::dot(to_double(src), to_double(dsrc));
          EXPECT_NEAR(lhs, rhs, 1e-5 * (1 + std::abs(lhs))) << tag;
        }
  }
}

TEST(LlamaKernels, KvHeadsOutsideTheShardAreRefused) {
  std::vector<float> a(64), b(64);
  // q heads 0..3 with group 2 read kv heads 0, 1: kv0 1 puts head 0 at -1, nkv 1 puts head 1 out of range.
  EXPECT_THROW(kc::kv_expand(a.data(), b.data(), 1, 4, 2, 2, 0, 2, 1), trident::InvalidArgument);
  EXPECT_THROW(kc::kv_reduce(a.data(), b.data(), 1, 4, 1, 2, 0, 2, 0), trident::InvalidArgument);
  EXPECT_THROW(kc::kv_expand(a.data(), b.data(), 1, 4, 2, 2, 0, 0, 0), trident::InvalidArgument);  // group 0
}

// ---- threads ----

namespace {

struct Output {
  std::string name;
  std::vector<float> v;
};

std::vector<Output> run_llama_kernels() {
  std::vector<Output> out;
  const int N = 33, C = 64, I = 37, hd = 16, T = 11;
  {
    const auto x = rnd(N * C, 70, 2.0), w = rnd(C, 71), g = rnd(N * C, 72);
    std::vector<float> y(N * C), rstd(N), dx = rnd(N * C, 73), dw = rnd(C, 74);
    kc::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    kc::rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
    out.push_back({"rmsnorm out", y});
    out.push_back({"rmsnorm rstd", rstd});
    out.push_back({"rmsnorm dinp", dx});
    out.push_back({"rmsnorm dweight", dw});
  }
  {
    std::vector<float> cos, sin;
    rope_tables(T, hd, cos, sin);
    const int stride = 5 * hd;
    auto x = rnd(N * stride, 75);
    kc::rope(x.data(), cos.data(), sin.data(), N, T, stride, 4, hd, false);
    out.push_back({"rope", x});
    kc::rope(x.data(), cos.data(), sin.data(), N, T, stride, 4, hd, true);
    out.push_back({"rope inverse", x});
  }
  {
    const auto h = rnd(N * 2 * I, 76, 3.0), d = rnd(N * I, 77);
    std::vector<float> y(N * I), dh(N * 2 * I);
    kc::swiglu_forward(y.data(), h.data(), N, I);
    kc::swiglu_backward(dh.data(), d.data(), h.data(), N, I);
    out.push_back({"swiglu out", y});
    out.push_back({"swiglu dh", dh});
  }
  for (const KvShape& s : {kKvShapes[2], kKvShapes[6]}) {
    const size_t ls = static_cast<size_t>(s.nh + 2 * s.nkv) * hd, ld = static_cast<size_t>(3 * s.nh) * hd;
    const auto src = rnd(N * ls, 78), ddst = rnd(N * ld, 79);
    std::vector<float> dst(N * ld), dsrc(N * ls);
    kc::kv_expand(dst.data(), src.data(), N, s.nh, s.nkv, hd, s.h0, s.group, s.kv0);
    kc::kv_reduce(dsrc.data(), ddst.data(), N, s.nh, s.nkv, hd, s.h0, s.group, s.kv0);
    out.push_back({"kv_expand", dst});
    out.push_back({"kv_reduce", dsrc});
  }
  return out;
}

}  // namespace

TEST(LlamaKernels, BitwiseTheSameOnAnyThreadCount) {
  for (kc::Isa isa : levels()) {
    for (int divisor : {1, 97}) {
      std::vector<Output> base;
      {
        Scope scope(isa, 1, divisor);
        base = run_llama_kernels();
      }
      for (int threads : {2, 3, 5}) {
        Scope scope(isa, threads, divisor);
        const auto got = run_llama_kernels();
        ASSERT_EQ(got.size(), base.size());
        for (size_t k = 0; k < got.size(); ++k)
          EXPECT_TRUE(same_bits(got[k].v, base[k].v))
              << kc::isa_name(isa) << " " << got[k].name << ": " << threads << " threads vs 1, task size / " << divisor;
      }
    }
  }
}
