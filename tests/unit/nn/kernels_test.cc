// Every CPU kernel against the float64 reference (forward) and central finite differences of the
// reference (backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "reference.h"
#include "trident/core/error.h"
#include "trident/kernels/cpu/ops.h"

namespace kc = trident::kernels::cpu;
using ref::Vec;

namespace {

// Max abs difference normalised by the reference's max abs value.
double ref_rel_err(const std::vector<float>& got, const Vec& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

// FD gradient of sum(f(x) * r) with respect to x.
Vec fd_of(const Vec& x, const Vec& r, const std::function<Vec(const Vec&)>& f) {
  return ref::fd_grad(x, [&](const Vec& xx) { return ref::dot(f(xx), r); });
}

}  // namespace

TEST(Kernels, GemmAllTransposesMatchReference) {
  const int M = 5, N = 7, K = 3;
  Vec a = ref::random_vec(M * K, 1), b = ref::random_vec(K * N, 2), c0 = ref::random_vec(M * N, 3);
  Vec want(M * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += a[i * K + k] * b[k * N + j];
      want[i * N + j] = 2.0 * s + 0.5 * c0[i * N + j];
    }
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // Store A as [K,M] when transposed, B as [N,K] when transposed.
      std::vector<float> A(M * K), B(K * N), C = ref::to_float(c0);
      for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k) A[ta ? k * M + i : i * K + k] = static_cast<float>(a[i * K + k]);
      for (int k = 0; k < K; ++k)
        for (int j = 0; j < N; ++j) B[tb ? j * K + k : k * N + j] = static_cast<float>(b[k * N + j]);
      kc::gemm(ta, tb, M, N, K, 2.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.5f, C.data(), N);
      EXPECT_LT(ref_rel_err(C, want), 1e-6) << "trans_a " << ta << " trans_b " << tb;
      std::vector<float> C16 = ref::to_float(c0);
      kc::gemm(ta, tb, M, N, K, 2.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.5f, C16.data(), N,
               kc::Precision::kBFloat16);
      EXPECT_LT(ref_rel_err(C16, want), 2e-2) << "bf16 trans_a " << ta << " trans_b " << tb;
    }
}

TEST(Kernels, LinearForwardBackward) {
  const int N = 6, C = 5, OC = 4;
  Vec x = ref::random_vec(N * C, 10), w = ref::random_vec(OC * C, 11), b = ref::random_vec(OC, 12);
  Vec r = ref::random_vec(N * OC, 13);
  std::vector<float> xf = ref::to_float(x), wf = ref::to_float(w), bf = ref::to_float(b), rf = ref::to_float(r);
  std::vector<float> y(N * OC);
  kc::linear_forward(y.data(), xf.data(), wf.data(), bf.data(), N, C, OC);
  EXPECT_LT(ref_rel_err(y, ref::linear(x, w, &b, N, C, OC)), 1e-6);

  // Gradients accumulate into dweight/dbias and (with beta 1) into dinp: start from known values.
  Vec dx0 = ref::random_vec(N * C, 14), dw0 = ref::random_vec(OC * C, 15), db0 = ref::random_vec(OC, 16);
  std::vector<float> dx = ref::to_float(dx0), dw = ref::to_float(dw0), db = ref::to_float(db0);
  kc::linear_backward(dx.data(), dw.data(), db.data(), rf.data(), xf.data(), wf.data(), N, C, OC, 1.0f);
  Vec gx = fd_of(x, r, [&](const Vec& v) { return ref::linear(v, w, &b, N, C, OC); });
  Vec gw = fd_of(w, r, [&](const Vec& v) { return ref::linear(x, v, &b, N, C, OC); });
  Vec gb = fd_of(b, r, [&](const Vec& v) { return ref::linear(x, w, &v, N, C, OC); });
  EXPECT_LT(ref_rel_err(dx, ref::add(dx0, gx)), 1e-5);
  EXPECT_LT(ref_rel_err(dw, ref::add(dw0, gw)), 1e-5);
  EXPECT_LT(ref_rel_err(db, ref::add(db0, gb)), 1e-5);
  // beta 0 overwrites dinp.
  std::vector<float> dx2(N * C, 123.0f);
  kc::linear_backward(dx2.data(), nullptr, nullptr, rf.data(), xf.data(), wf.data(), N, C, OC, 0.0f);
  EXPECT_LT(ref_rel_err(dx2, gx), 1e-5);
}

TEST(Kernels, GeluExactAndTanhForwardBackward) {
  const int n = 200;
  Vec x = ref::random_vec(n, 20, 2.5);
  x[0] = 0.0;
  x[1] = 9.0;
  x[2] = -9.0;
  Vec r = ref::random_vec(n, 21);
  std::vector<float> xf = ref::to_float(x), rf = ref::to_float(r), y(n), dx(n);
  for (bool tanh_approx : {false, true}) {
    const auto kind = tanh_approx ? kc::GeluKind::kTanh : kc::GeluKind::kExact;
    kc::gelu_forward(y.data(), xf.data(), n, kind);
    EXPECT_LT(ref_rel_err(y, ref::gelu(x, tanh_approx)), 1e-6) << "tanh " << tanh_approx;
    kc::gelu_backward(dx.data(), xf.data(), rf.data(), n, kind);
    EXPECT_LT(ref_rel_err(dx, fd_of(x, r, [&](const Vec& v) { return ref::gelu(v, tanh_approx); })), 1e-5)
        << "tanh " << tanh_approx;
  }
  // Forward with the derivative kept in place of the input: backward is a multiply.
  for (bool tanh_approx : {false, true}) {
    const auto kind = tanh_approx ? kc::GeluKind::kTanh : kc::GeluKind::kExact;
    std::vector<float> g = xf, out(n), d(n);
    kc::gelu_forward_and_grad(out.data(), g.data(), g.data(), n, kind);
    EXPECT_LT(ref_rel_err(out, ref::gelu(x, tanh_approx)), 1e-6);
    kc::mul(d.data(), rf.data(), g.data(), n);
    EXPECT_LT(ref_rel_err(d, fd_of(x, r, [&](const Vec& v) { return ref::gelu(v, tanh_approx); })), 1e-5);
  }
  // In place (dinp aliases dout).
  std::vector<float> d = rf;
  kc::gelu_backward(d.data(), xf.data(), d.data(), n, kc::GeluKind::kExact);
  kc::gelu_backward(dx.data(), xf.data(), rf.data(), n, kc::GeluKind::kExact);
  EXPECT_EQ(d, dx);
}

TEST(Kernels, LayerNormForwardBackward) {
  const int N = 4, C = 9;
  Vec x = ref::random_vec(N * C, 30, 3.0), w = ref::random_vec(C, 31), b = ref::random_vec(C, 32);
  for (int c = 0; c < C; ++c) x[c] += 10.0;  // a row with a large mean
  Vec r = ref::random_vec(N * C, 33);
  std::vector<float> xf = ref::to_float(x), wf = ref::to_float(w), bf = ref::to_float(b), rf = ref::to_float(r);
  std::vector<float> y(N * C), mean(N), rstd(N);
  kc::layernorm_forward(y.data(), mean.data(), rstd.data(), xf.data(), wf.data(), bf.data(), N, C);
  EXPECT_LT(ref_rel_err(y, ref::layernorm(x, w, &b, N, C)), 1e-5);
  Vec dx0 = ref::random_vec(N * C, 34);
  std::vector<float> dx = ref::to_float(dx0), dw(C, 0.0f), db(C, 0.0f);
  kc::layernorm_backward(dx.data(), dw.data(), db.data(), rf.data(), xf.data(), wf.data(), mean.data(), rstd.data(), N,
                         C);
  EXPECT_LT(ref_rel_err(dx, ref::add(dx0, fd_of(x, r, [&](const Vec& v) { return ref::layernorm(v, w, &b, N, C); }))),
            1e-4);
  EXPECT_LT(ref_rel_err(dw, fd_of(w, r, [&](const Vec& v) { return ref::layernorm(x, v, &b, N, C); })), 1e-5);
  EXPECT_LT(ref_rel_err(db, fd_of(b, r, [&](const Vec& v) { return ref::layernorm(x, w, &v, N, C); })), 1e-5);
  // Without bias.
  kc::layernorm_forward(y.data(), nullptr, nullptr, xf.data(), wf.data(), nullptr, N, C);
  EXPECT_LT(ref_rel_err(y, ref::layernorm(x, w, nullptr, N, C)), 1e-5);
}

TEST(Kernels, SoftmaxForward) {
  const int N = 3, C = 70;
  Vec x = ref::random_vec(N * C, 40, 5.0);
  std::vector<float> xf = ref::to_float(x), y(N * C);
  kc::softmax_forward(y.data(), xf.data(), N, C);
  EXPECT_LT(ref_rel_err(y, ref::softmax(x, N, C)), 1e-6);
}

TEST(Kernels, CausalAttentionForwardBackward) {
  const int B = 2, T = 7, C = 12, NH = 3;
  Vec qkv = ref::random_vec(B * T * 3 * C, 50), r = ref::random_vec(B * T * C, 51);
  std::vector<float> qf = ref::to_float(qkv), rf = ref::to_float(r), y(B * T * C), lse(B * NH * T),
      dqkv(B * T * 3 * C, 99.0f);
  kc::attention_forward(y.data(), lse.data(), qf.data(), B, T, C, NH);
  EXPECT_LT(ref_rel_err(y, ref::attention(qkv, B, T, C, NH)), 1e-5);
  kc::attention_backward(dqkv.data(), rf.data(), qf.data(), y.data(), lse.data(), B, T, C, NH);
  EXPECT_LT(ref_rel_err(dqkv, fd_of(qkv, r, [&](const Vec& v) { return ref::attention(v, B, T, C, NH); })), 1e-5);
  EXPECT_THROW(kc::attention_forward(y.data(), lse.data(), qf.data(), B, T, C, 5), trident::InvalidArgument);
}

TEST(Kernels, CausalAttentionVectorPathsMatchReference) {
  // Head dims 32 and 48 (register blocks of 16 plus none / a remainder) and T not a multiple of 16.
  for (auto [C, NH] : {std::pair{64, 2}, std::pair{100, 2}}) {
    const int B = 1, T = 19;
    Vec qkv = ref::random_vec(B * T * 3 * C, 52, 0.5), r = ref::random_vec(B * T * C, 53);
    std::vector<float> qf = ref::to_float(qkv), rf = ref::to_float(r), y(B * T * C), lse(B * NH * T),
        dqkv(B * T * 3 * C);
    kc::attention_forward(y.data(), lse.data(), qf.data(), B, T, C, NH);
    EXPECT_LT(ref_rel_err(y, ref::attention(qkv, B, T, C, NH)), 1e-5) << C;
    kc::attention_backward(dqkv.data(), rf.data(), qf.data(), y.data(), lse.data(), B, T, C, NH);
    EXPECT_LT(ref_rel_err(dqkv, fd_of(qkv, r, [&](const Vec& v) { return ref::attention(v, B, T, C, NH); })), 1e-4)
        << C;
  }
}

TEST(Kernels, EmbeddingForwardBackward) {
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<int32_t> tok = {1, 4, 1, 0, 1, 3};  // repeated tokens accumulate
  Vec wte = ref::random_vec(V * C, 60), wpe = ref::random_vec(T * C, 61), r = ref::random_vec(B * T * C, 62);
  ref::Params p = {{"wte", wte}, {"wpe", wpe}};
  std::vector<float> wtef = ref::to_float(wte), wpef = ref::to_float(wpe), rf = ref::to_float(r), y(B * T * C);
  kc::embedding_forward(y.data(), tok.data(), wtef.data(), wpef.data(), B, T, C, V);
  EXPECT_LT(ref_rel_err(y, ref::embed(p, "wte", "wpe", tok, B, T, C)), 1e-7);
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  kc::embedding_backward(dwte.data(), dwpe.data(), rf.data(), tok.data(), B, T, C);
  EXPECT_LT(ref_rel_err(dwte, fd_of(wte, r, [&](const Vec& v) {
              ref::Params q = {{"wte", v}, {"wpe", wpe}};
              return ref::embed(q, "wte", "wpe", tok, B, T, C);
            })),
            1e-6);
  EXPECT_LT(ref_rel_err(dwpe, fd_of(wpe, r, [&](const Vec& v) {
              ref::Params q = {{"wte", wte}, {"wpe", v}};
              return ref::embed(q, "wte", "wpe", tok, B, T, C);
            })),
            1e-6);
  tok[2] = V;
  EXPECT_THROW(kc::embedding_forward(y.data(), tok.data(), wtef.data(), wpef.data(), B, T, C, V),
               trident::InvalidArgument);
}

TEST(Kernels, CrossEntropyFusedForwardBackward) {
  const int N = 6, V = 11;
  Vec logits = ref::random_vec(N * V, 70, 3.0);
  std::vector<int32_t> tgt = {0, 10, 3, 3, 7, 1};
  std::vector<float> lf = ref::to_float(logits), d(N * V);
  const double sum = kc::cross_entropy_forward_backward(d.data(), lf.data(), tgt.data(), N, V, 1.0f / N);
  EXPECT_NEAR(sum / N, ref::cross_entropy(logits, tgt, N, V), 1e-6);
  Vec g = ref::fd_grad(logits, [&](const Vec& v) { return ref::cross_entropy(v, tgt, N, V); });
  EXPECT_LT(ref_rel_err(d, g), 1e-5);
  // In place, forward only.
  std::vector<float> inplace = lf;
  kc::cross_entropy_forward_backward(inplace.data(), inplace.data(), tgt.data(), N, V, 1.0f / N);
  EXPECT_EQ(inplace, d);
  EXPECT_NEAR(kc::cross_entropy_forward_backward(nullptr, lf.data(), tgt.data(), N, V, 0.0f), sum, 0.0);
  tgt[0] = -1;
  EXPECT_THROW(kc::cross_entropy_forward_backward(nullptr, lf.data(), tgt.data(), N, V, 1.0f),
               trident::InvalidArgument);
}

TEST(Kernels, Bf16ConversionRoundsToNearestEven) {
  const std::vector<float> in = {1.0f, -2.5f, 1.00390625f /* exactly halfway: 1 + 2^-8 */, 3.1415926f, 0.0f};
  std::vector<uint16_t> b(in.size());
  kc::to_bf16(b.data(), in.data(), in.size());
  EXPECT_EQ(b[0], 0x3f80);
  EXPECT_EQ(b[1], 0xc020);
  EXPECT_EQ(b[2], 0x3f80);  // ties to even
  EXPECT_EQ(b[3], 0x4049);  // 3.140625
  std::vector<float> back(in.size());
  kc::from_bf16(back.data(), b.data(), b.size());
  EXPECT_EQ(back[3], 3.140625f);
  EXPECT_EQ(back[4], 0.0f);
}

TEST(Kernels, ThreadCountIsSettable) {
  kc::set_num_threads(1);
  EXPECT_EQ(kc::num_threads(), 1);
  kc::set_num_threads(0);
  EXPECT_GE(kc::num_threads(), 1);
  kc::set_num_threads(1);
}
