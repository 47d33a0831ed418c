// Every CUDA kernel against the CPU kernel of kernels/cpu/ops.h on random inputs, odd sizes included.
// Tolerances (see expect_close: relative, floored at 0.1 x the array's largest magnitude):
//   float32 kernels 1e-5; bfloat16 GEMMs 1e-4 (both sides round operands to bf16 and accumulate in float32;
//   only the order of accumulation differs); embedding dwte (atomicAdd, order varies) 1e-5; sums in double
//   1e-12.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "cuda_test_util.h"
#include "harness/scoped_env.h"
#include "harness/temp_dir.h"
#include "trident/cuda/ops.h"
#include "trident/kernels/cpu/ops.h"

namespace trident::cuda {
namespace {

namespace cpu = trident::kernels::cpu;
using testing::expect_close;
using testing::random_floats;
using testing::random_ints;
using testing::dev;

TEST(CudaDevice, ErrorsNameTheCudaCall) {
  TRIDENT_REQUIRE_GPU();
  try {
    DeviceBuffer<float> huge(size_t(1) << 50);  // 4 PiB
    FAIL() << "cudaMalloc of 4 PiB succeeded";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
    EXPECT_NE(e.code, 0);
  }
  cudaGetLastError();
  std::printf("device 0: %s\n", device_description(0).c_str());
}

struct GemmCase {
  int M, N, K;
};

TEST(CudaKernels, GemmMatchesCpuFloat32AndBf16) {
  TRIDENT_REQUIRE_GPU();
  const GemmCase cases[] = {{1, 1, 1}, {7, 13, 5}, {37, 61, 129}, {128, 96, 257}, {1, 300, 7}};
  double worst32 = 0, worst16 = 0;
  uint32_t seed = 1;
  for (const auto& c : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (int prec = 0; prec < 2; ++prec) {
          const int lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 1, ldc = c.N + 2;
          auto A = random_floats(size_t(ta ? c.K : c.M) * lda, seed++);
          auto B = random_floats(size_t(tb ? c.N : c.K) * ldb, seed++);
          auto C = random_floats(size_t(c.M) * ldc, seed++);
          auto dA = dev(A), dB = dev(B), dC = dev(C);
          const auto p = prec ? Precision::kBFloat16 : Precision::kFloat32;
          cpu::gemm(ta, tb, c.M, c.N, c.K, 0.75f, A.data(), lda, B.data(), ldb, 0.5f, C.data(), ldc, p);
          cuda::gemm(ta, tb, c.M, c.N, c.K, 0.75f, dA.data(), lda, dB.data(), ldb, 0.5f, dC.data(), ldc, p);
          const std::string what = fmt::format("gemm M={} N={} K={} ta={} tb={} {}", c.M, c.N, c.K, ta, tb,
                                               prec ? "bf16" : "f32");
          const double w = expect_close(dC.to_host(), C, prec ? 1e-4 : 1e-5, what);
          (prec ? worst16 : worst32) = std::max(prec ? worst16 : worst32, w);
        }
      }
    }
  }
  std::printf("gemm worst relative error: float32 %.3g, bf16 %.3g\n", worst32, worst16);
}

TEST(CudaKernels, Bf16GemmOnBf16Operands) {
  TRIDENT_REQUIRE_GPU();
  const int M = 33, N = 17, K = 65;
  auto A = random_floats(size_t(M) * K, 11), B = random_floats(size_t(N) * K, 12);
  std::vector<uint16_t> A16(A.size()), B16(B.size());
  cpu::to_bf16(A16.data(), A.data(), A.size());
  cpu::to_bf16(B16.data(), B.data(), B.size());
  std::vector<float> C(size_t(M) * N, 0.0f);
  cpu::gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N, Precision::kBFloat16);
  auto dA = dev(A16), dB = dev(B16);
  DeviceBuffer<float> dC(C.size());
  cuda::gemm_bf16(false, true, M, N, K, 1.0f, dA.data(), K, dB.data(), K, 0.0f, dC.data(), N);
  expect_close(dC.to_host(), C, 1e-4, "gemm_bf16");
}

TEST(CudaKernels, LinearForwardBackwardAccumulate) {
  TRIDENT_REQUIRE_GPU();
  struct S {
    int N, C, OC;
    bool bias;
  };
  double worst = 0;
  const LinearBiasPaths before = linear_bias_paths();
  // The last shape is GPT-2's qkv projection over 512 tokens (tensor-core algorithms of the bias epilogue).
  for (const S s : {S{1, 1, 1, true}, S{7, 13, 5, false}, S{37, 64, 129, true}, S{130, 97, 31, true},
                    S{512, 768, 2304, true}}) {
    for (int variant = 0; variant < 4; ++variant) {
      const int prec = variant & 1;
      const bool epilogue = variant >= 2;  // the bias added by cuBLASLt, or filled before the GEMM
      trident::testing::ScopedEnv use_epilogue("TRIDENT_CUDA_BIAS_EPILOGUE", epilogue ? "1" : "0");
      const auto p = prec ? Precision::kBFloat16 : Precision::kFloat32;
      const double tol = prec ? 1e-4 : 1e-5;
      auto x = random_floats(size_t(s.N) * s.C, 1), w = random_floats(size_t(s.OC) * s.C, 2),
           b = random_floats(s.OC, 3), dout = random_floats(size_t(s.N) * s.OC, 4);
      auto dinp = random_floats(x.size(), 5), dw = random_floats(w.size(), 6), db = random_floats(b.size(), 7);
      std::vector<float> out(size_t(s.N) * s.OC);
      auto dx = dev(x), dW = dev(w), dB = dev(b), dDout = dev(dout), dDinp = dev(dinp), dDw = dev(dw),
           dDb = dev(db);
      // Poisoned: an element the GPU does not write fails the comparison.
      auto dOut = dev(std::vector<float>(out.size(), std::nanf("")));
      cpu::linear_forward(out.data(), x.data(), w.data(), s.bias ? b.data() : nullptr, s.N, s.C, s.OC, p);
      const long epilogue_before = linear_bias_paths().epilogue;
      cuda::linear_forward(dOut.data(), dx.data(), dW.data(), s.bias ? dB.data() : nullptr, s.N, s.C, s.OC, p);
      // At a real layer's shape, with buffers from cudaMalloc (256-byte aligned), cuBLASLt adds the bias.
      if (s.N == 512 && epilogue) {
        EXPECT_EQ(linear_bias_paths().epilogue - epilogue_before, 1) << "no bias epilogue at N=512";
      }
      // dinp_beta = 1 accumulates into dinp; dweight and dbias always accumulate.
      cpu::linear_backward(dinp.data(), dw.data(), s.bias ? db.data() : nullptr, dout.data(), x.data(), w.data(), s.N,
                           s.C, s.OC, 1.0f, p);
      cuda::linear_backward(dDinp.data(), dDw.data(), s.bias ? dDb.data() : nullptr, dDout.data(), dx.data(), dW.data(),
                      s.N, s.C, s.OC, 1.0f, p);
      const std::string tag =
          fmt::format("N={} C={} OC={} {}{}", s.N, s.C, s.OC, prec ? "bf16" : "f32", epilogue ? " epilogue" : "");
      worst = std::max(worst, expect_close(dOut.to_host(), out, tol, "linear out " + tag));
      worst = std::max(worst, expect_close(dDinp.to_host(), dinp, tol, "linear dinp " + tag));
      worst = std::max(worst, expect_close(dDw.to_host(), dw, tol, "linear dweight " + tag));
      worst = std::max(worst, expect_close(dDb.to_host(), db, 1e-5, "linear dbias " + tag));
    }
  }
  std::printf("linear worst relative error %.3g\n", worst);
  const LinearBiasPaths after = linear_bias_paths();
  std::printf("linear_forward with a bias: %ld through the cuBLASLt epilogue, %ld by fill + GEMM\n",
              after.epilogue - before.epilogue, after.fill - before.fill);
}

// A bias that starts 4 bytes into a buffer (as a parameter at an odd offset of a flat buffer can): whichever
// path linear_forward takes, the result is the CPU's.
TEST(CudaKernels, LinearForwardBiasAtAnyAlignment) {
  TRIDENT_REQUIRE_GPU();
  const int N = 64, C = 96, OC = 48;
  trident::testing::ScopedEnv use_epilogue("TRIDENT_CUDA_BIAS_EPILOGUE", "1");
  for (int prec = 0; prec < 2; ++prec) {
    const auto p = prec ? Precision::kBFloat16 : Precision::kFloat32;
    auto x = random_floats(size_t(N) * C, 11), w = random_floats(size_t(OC) * C, 12), b = random_floats(OC + 1, 13);
    std::vector<float> out(size_t(N) * OC);
    cpu::linear_forward(out.data(), x.data(), w.data(), b.data() + 1, N, C, OC, p);
    auto dx = dev(x), dW = dev(w), dB = dev(b);
    auto dOut = dev(std::vector<float>(out.size(), std::nanf("")));
    cuda::linear_forward(dOut.data(), dx.data(), dW.data(), dB.data() + 1, N, C, OC, p);
    expect_close(dOut.to_host(), out, prec ? 1e-4 : 1e-5,
                 std::string("linear out, bias at +4 bytes, ") + (prec ? "bf16" : "f32"));
  }
}

TEST(CudaKernels, GeluExactAndTanhForwardBackward) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : {size_t(1), size_t(7), size_t(1031), size_t(100003)}) {
    for (auto kind : {GeluKind::kExact, GeluKind::kTanh}) {
      auto x = random_floats(n, 21, -6.0f, 6.0f), g = random_floats(n, 22);
      std::vector<float> out(n), din(n);
      cpu::gelu_forward(out.data(), x.data(), n, kind);
      cpu::gelu_backward(din.data(), x.data(), g.data(), n, kind);
      auto dx = dev(x), dg = dev(g);
      DeviceBuffer<float> dout(n);
      cuda::gelu_forward(dout.data(), dx.data(), n, kind);
      cuda::gelu_backward(dg.data(), dx.data(), dg.data(), n, kind);  // dinp aliases dout
      const std::string tag = fmt::format("n={} {}", n, kind == GeluKind::kTanh ? "tanh" : "exact");
      const auto got_out = dout.to_host(), got_din = dg.to_host();
      expect_close(got_out, out, 1e-5, "gelu forward " + tag);
      // The CPU's tanh backward uses a fast tanh whose ~2e-6 absolute error shows where gelu' crosses zero
      // (x near -0.75): against the CPU 3e-5; against a double-precision reference 1e-5 like the rest.
      expect_close(got_din, din, kind == GeluKind::kTanh ? 3e-5 : 1e-5, "gelu backward vs CPU " + tag);
      std::vector<float> ref_out(n), ref_din(n);
      for (size_t i = 0; i < n; ++i) {
        const double xd = x[i];
        if (kind == GeluKind::kTanh) {
          const double k = std::sqrt(2.0 / M_PI), u = k * (xd + 0.044715 * xd * xd * xd), th = std::tanh(u);
          ref_out[i] = static_cast<float>(0.5 * xd * (1 + th));
          ref_din[i] = static_cast<float>(g[i] * (0.5 * (1 + th) + 0.5 * xd * (1 - th * th) * k *
                                                                    (1 + 3 * 0.044715 * xd * xd)));
        } else {
          const double cdf = 0.5 * (1 + std::erf(xd / std::sqrt(2.0)));
          ref_out[i] = static_cast<float>(xd * cdf);
          ref_din[i] = static_cast<float>(g[i] * (cdf + xd * std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI)));
        }
      }
      // (Not for n = 1 and 7: a lone tiny gelu(x) at x < -5 is 1 + erf(x) cancelling in float32 on both
      // devices; the floor at 0.1 x max|ref| needs an array with a range of values.)
      if (n >= 1031) {
        expect_close(got_out, ref_out, 1e-5, "gelu forward vs double " + tag);
        expect_close(got_din, ref_din, 1e-5, "gelu backward vs double " + tag);
      }
      // The fused form (what the models use): out = gelu(x) and grad = gelu'(x) written over x; then
      // mul(grad, g) is the backward. The values of the two kernels above (1e-6: contraction may differ).
      auto dxf = dev(x);
      DeviceBuffer<float> dof(n);
      cuda::gelu_forward_and_grad(dof.data(), dxf.data(), dxf.data(), n, kind);
      auto dgf = dev(g);
      cuda::mul(dgf.data(), dgf.data(), dxf.data(), n);
      expect_close(dof.to_host(), got_out, 1e-6, "gelu_forward_and_grad out vs gelu_forward " + tag);
      expect_close(dgf.to_host(), got_din, 1e-6, "gelu_forward_and_grad grad * g vs gelu_backward " + tag);
    }
  }
}

TEST(CudaKernels, ElementwiseAddMulScaleBf16) {
  TRIDENT_REQUIRE_GPU();
  const size_t n = 4099;
  auto a = random_floats(n, 31), b = random_floats(n, 32);
  std::vector<float> sum(n), prod(n), acc = a, sc = a;
  cpu::add(sum.data(), a.data(), b.data(), n);
  cpu::mul(prod.data(), a.data(), b.data(), n);
  cpu::add_inplace(acc.data(), b.data(), n);
  cpu::scale_inplace(sc.data(), -0.3f, n);
  auto da = dev(a), db = dev(b), dacc = dev(a), dsc = dev(a);
  DeviceBuffer<float> dsum(n), dprod(n), dcopy(n);
  cuda::add(dsum.data(), da.data(), db.data(), n);
  cuda::mul(dprod.data(), da.data(), db.data(), n);
  cuda::add_inplace(dacc.data(), db.data(), n);
  cuda::scale_inplace(dsc.data(), -0.3f, n);
  cuda::copy(dcopy.data(), da.data(), n);
  EXPECT_EQ(dsum.to_host(), sum);
  EXPECT_EQ(dprod.to_host(), prod);
  EXPECT_EQ(dacc.to_host(), acc);
  EXPECT_EQ(dsc.to_host(), sc);
  EXPECT_EQ(dcopy.to_host(), a);
  // bf16 round trip: bit-identical to the CPU conversion (round-to-nearest-even, NaN kept).
  a[0] = std::nanf("");
  a[1] = 1.00390625f;  // halfway between two bf16 values: rounds to even
  std::vector<uint16_t> h16(n), g16(n);
  cpu::to_bf16(h16.data(), a.data(), n);
  auto da2 = dev(a);
  DeviceBuffer<uint16_t> d16(n);
  cuda::to_bf16(d16.data(), da2.data(), n);
  g16 = d16.to_host();
  EXPECT_EQ(g16, h16);
  std::vector<float> back(n);
  cpu::from_bf16(back.data(), h16.data(), n);
  DeviceBuffer<float> dback(n);
  cuda::from_bf16(dback.data(), d16.data(), n);
  auto gb = dback.to_host();
  for (size_t i = 1; i < n; ++i) ASSERT_EQ(gb[i], back[i]) << i;
  EXPECT_TRUE(std::isnan(gb[0]));
}

TEST(CudaKernels, LayerNormForwardBackward) {
  TRIDENT_REQUIRE_GPU();
  struct S {
    int N, C;
  };
  double worst = 0;
  for (const S s : {S{1, 1}, S{1, 7}, S{7, 13}, S{37, 768}, S{130, 97}, S{131, 1031}}) {
    for (int with_bias = 0; with_bias < 2; ++with_bias) {
      const size_t nc = size_t(s.N) * s.C;
      auto x = random_floats(nc, 41, -2.0f, 3.0f), w = random_floats(s.C, 42), b = random_floats(s.C, 43),
           g = random_floats(nc, 44);
      auto dinp = random_floats(nc, 45), dw = random_floats(s.C, 46), db = random_floats(s.C, 47);
      std::vector<float> out(nc), mean(s.N), rstd(s.N);
      const float* bp = with_bias ? b.data() : nullptr;
      cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bp, s.N, s.C);
      cpu::layernorm_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, g.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), s.N, s.C);
      auto dx = dev(x), dW = dev(w), dB = dev(b), dg = dev(g), dDinp = dev(random_floats(nc, 45)),
           dDw = dev(random_floats(s.C, 46)), dDb = dev(random_floats(s.C, 47));
      DeviceBuffer<float> dout(nc), dmean(s.N), drstd(s.N);
      cuda::layernorm_forward(dout.data(), dmean.data(), drstd.data(), dx.data(), dW.data(), with_bias ? dB.data() : nullptr,
                        s.N, s.C);
      cuda::layernorm_backward(dDinp.data(), dDw.data(), with_bias ? dDb.data() : nullptr, dg.data(), dx.data(), dW.data(),
                         dmean.data(), drstd.data(), s.N, s.C);
      const std::string tag = fmt::format("N={} C={} bias={}", s.N, s.C, with_bias);
      worst = std::max(worst, expect_close(dout.to_host(), out, 1e-5, "layernorm out " + tag));
      worst = std::max(worst, expect_close(dmean.to_host(), mean, 1e-5, "layernorm mean " + tag));
      worst = std::max(worst, expect_close(drstd.to_host(), rstd, 1e-5, "layernorm rstd " + tag));
      worst = std::max(worst, expect_close(dDinp.to_host(), dinp, 1e-5, "layernorm dinp " + tag));
      worst = std::max(worst, expect_close(dDw.to_host(), dw, 1e-5, "layernorm dweight " + tag));
      if (with_bias) worst = std::max(worst, expect_close(dDb.to_host(), db, 1e-5, "layernorm dbias " + tag));
    }
  }
  std::printf("layernorm worst relative error %.3g\n", worst);
}

TEST(CudaKernels, SoftmaxForward) {
  TRIDENT_REQUIRE_GPU();
  for (auto [N, C] : {std::pair{1, 1}, {7, 13}, {33, 50257}}) {
    auto x = random_floats(size_t(N) * C, 51, -8.0f, 8.0f);
    std::vector<float> out(x.size());
    cpu::softmax_forward(out.data(), x.data(), N, C);
    auto dx = dev(x);
    cuda::softmax_forward(dx.data(), dx.data(), N, C);  // in place
    expect_close(dx.to_host(), out, 1e-5, fmt::format("softmax N={} C={}", N, C), 1e-3);
  }
}

TEST(CudaKernels, AttentionForwardBackward) {
  TRIDENT_REQUIRE_GPU();
  struct S {
    int B, T, C, NH;
  };
  double worst = 0;
  // Head dims <= 128 take the tiled kernels (64-row tiles, head dim zero-padded to 32, 64 or 128): T below,
  // at and across tile edges (1, 63, 64, 65, 257, 1000), every padded width, partial and full.
  for (const S s : {S{1, 1, 8, 2}, S{2, 7, 21, 3}, S{1, 33, 64, 1}, S{2, 67, 48, 4}, S{1, 257, 128, 2},
                    S{2, 130, 64, 2}, S{1, 64, 66, 2}, S{1, 65, 192, 2}, S{1, 129, 256, 2}, S{1, 63, 128, 1},
                    S{1, 1000, 64, 1}, S{1, 1, 128, 1},
                    // head dims above 128 take the shared-memory fallback kernels
                    S{1, 19, 258, 1}, S{2, 37, 300, 2}, S{1, 5, 129, 1}}) {
    const size_t btc = size_t(s.B) * s.T * s.C;
    auto qkv = random_floats(3 * btc, 61, -2.0f, 2.0f), dout = random_floats(btc, 62);
    std::vector<float> out(btc), lse(size_t(s.B) * s.NH * s.T), dqkv(3 * btc);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH);
    auto dq = dev(qkv), ddout = dev(dout);
    DeviceBuffer<float> dOut(btc), dLse(lse.size()), dDqkv(3 * btc), dDqkv2(3 * btc);
    cuda::attention_forward(dOut.data(), dLse.data(), dq.data(), s.B, s.T, s.C, s.NH);
    cuda::attention_backward(dDqkv.data(), ddout.data(), dq.data(), dOut.data(), dLse.data(), s.B, s.T, s.C, s.NH);
    cuda::attention_backward(dDqkv2.data(), ddout.data(), dq.data(), dOut.data(), dLse.data(), s.B, s.T, s.C, s.NH);
    const std::string tag = fmt::format("B={} T={} C={} NH={}", s.B, s.T, s.C, s.NH);
    worst = std::max(worst, expect_close(dOut.to_host(), out, 1e-5, "attention out " + tag));
    worst = std::max(worst, expect_close(dLse.to_host(), lse, 1e-5, "attention lse " + tag));
    auto g = dDqkv.to_host();
    worst = std::max(worst, expect_close(g, dqkv, 1e-5, "attention dqkv " + tag));
    EXPECT_EQ(dDqkv2.to_host(), g) << "attention backward is not deterministic " << tag;
  }
  std::printf("attention worst relative error %.3g\n", worst);
}

// The startup line of a CUDA run names the path each op takes; it needs no GPU.
TEST(CudaKernels, SummaryNamesThePathTaken) {
  const auto bf = Precision::kBFloat16, f32 = Precision::kFloat32;
  EXPECT_CONTAINS(cuda::kernel_summary(64, bf), "bf16 operands");
  EXPECT_CONTAINS(cuda::kernel_summary(64, bf), "attention (head dim 64): tensor cores");
  EXPECT_CONTAINS(cuda::kernel_summary(48, bf), "attention (head dim 48): float32 on CUDA cores, tiled");
  EXPECT_CONTAINS(cuda::kernel_summary(48, bf), "the tensor-core kernels take head dims 32, 64 and 128");
  EXPECT_CONTAINS(cuda::kernel_summary(64, f32), "GEMMs: cuBLAS float32 (no TF32)");
  EXPECT_CONTAINS(cuda::kernel_summary(64, f32), "float32 on CUDA cores, tiled");
  EXPECT_CONTAINS(cuda::kernel_summary(200, f32), "head dim > 128");
  EXPECT_EQ(cuda::kernel_summary(0, f32).find("attention"), std::string::npos);
}

// The tensor-core kernels (kBFloat16, head dims 32, 64, 128) against the float32 CPU kernel run on the same
// bf16-rounded q, k, v and dO: what differs is the rounding of P and dS to bfloat16 as operands and the
// order of float32 sums, so out and dqkv agree to about 1% of the tensor's scale (bounds 2e-2 and 4e-2,
// floored at 0.1 x its largest magnitude) and lse, whose scores are exact products of bf16 values summed in
// float32, to 1e-4. Head dims the tensor cores do not take fall back to the float32 kernels (1e-5).
TEST(CudaKernels, AttentionBf16TensorCores) {
  TRIDENT_REQUIRE_GPU();
  struct S {
    int B, T, C, NH;
  };
  double worst_out = 0, worst_grad = 0;
  for (const S s : {S{1, 1, 64, 2}, S{2, 7, 96, 3}, S{1, 64, 64, 1}, S{2, 65, 192, 3}, S{1, 257, 128, 2},
                    S{1, 130, 256, 2}, S{2, 1000, 128, 2}, S{1, 63, 128, 1}, S{1, 9, 48, 1}, S{1, 40, 400, 2}}) {
    const int hd = s.C / s.NH;
    const bool tensor_cores = hd == 32 || hd == 64 || hd == 128;
    const size_t btc = size_t(s.B) * s.T * s.C;
    auto qkv = random_floats(3 * btc, 71, -2.0f, 2.0f), dout = random_floats(btc, 72);
    for (auto* v : {&qkv, &dout}) {  // the kernels' own rounding is then exact
      std::vector<uint16_t> h(v->size());
      cpu::to_bf16(h.data(), v->data(), h.size());
      cpu::from_bf16(v->data(), h.data(), h.size());
    }
    std::vector<float> out(btc), lse(size_t(s.B) * s.NH * s.T), dqkv(3 * btc);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH);
    auto dq = dev(qkv), ddout = dev(dout);
    DeviceBuffer<float> dOut(btc), dLse(lse.size()), dDqkv(3 * btc), dDqkv2(3 * btc);
    const auto bf = Precision::kBFloat16;
    cuda::attention_forward(dOut.data(), dLse.data(), dq.data(), s.B, s.T, s.C, s.NH, bf);
    cuda::attention_backward(dDqkv.data(), ddout.data(), dq.data(), dOut.data(), dLse.data(), s.B, s.T, s.C, s.NH, bf);
    cuda::attention_backward(dDqkv2.data(), ddout.data(), dq.data(), dOut.data(), dLse.data(), s.B, s.T, s.C, s.NH,
                             bf);
    const std::string tag = fmt::format("bf16 B={} T={} C={} NH={}", s.B, s.T, s.C, s.NH);
    const double r_out = tensor_cores ? 2e-2 : 1e-5, r_lse = tensor_cores ? 1e-4 : 1e-5,
                 r_grad = tensor_cores ? 4e-2 : 1e-5;
    const double eo = expect_close(dOut.to_host(), out, r_out, "attention out " + tag);
    expect_close(dLse.to_host(), lse, r_lse, "attention lse " + tag);
    auto g = dDqkv.to_host();
    const double eg = expect_close(g, dqkv, r_grad, "attention dqkv " + tag);
    if (tensor_cores) {
      worst_out = std::max(worst_out, eo);
      worst_grad = std::max(worst_grad, eg);
    }
    EXPECT_EQ(dDqkv2.to_host(), g) << "attention backward is not deterministic " << tag;
  }
  std::printf("attention bf16 worst relative error: out %.3g, dqkv %.3g\n", worst_out, worst_grad);
}

TEST(CudaKernels, EmbeddingForwardBackward) {
  TRIDENT_REQUIRE_GPU();
  struct S {
    int B, T, C, V;
  };
  for (const S s : {S{1, 1, 1, 1}, S{2, 7, 13, 5}, S{4, 64, 96, 65}, S{3, 31, 33, 50257}}) {
    const size_t n = size_t(s.B) * s.T;
    auto tok = random_ints(n, 71, 0, s.V);
    auto wte = random_floats(size_t(s.V) * s.C, 72), wpe = random_floats(size_t(s.T) * s.C, 73),
         dout = random_floats(n * s.C, 74);
    auto dwte = random_floats(wte.size(), 75), dwpe = random_floats(wpe.size(), 76);
    std::vector<float> out(n * s.C);
    cpu::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), s.B, s.T, s.C, s.V);
    cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), s.B, s.T, s.C);
    auto dtok = dev(tok);
    auto dWte = dev(wte), dWpe = dev(wpe), dDout = dev(dout), dDwte = dev(random_floats(wte.size(), 75)),
         dDwpe = dev(random_floats(wpe.size(), 76));
    DeviceBuffer<float> dOut(out.size());
    cuda::embedding_forward(dOut.data(), dtok.data(), dWte.data(), dWpe.data(), s.B, s.T, s.C, s.V);
    cuda::embedding_backward(dDwte.data(), dDwpe.data(), dDout.data(), dtok.data(), s.B, s.T, s.C);
    const std::string tag = fmt::format("B={} T={} C={} V={}", s.B, s.T, s.C, s.V);
    EXPECT_EQ(dOut.to_host(), out) << "embedding forward " << tag;
    expect_close(dDwte.to_host(), dwte, 1e-5, "embedding dwte (atomicAdd) " + tag);
    expect_close(dDwpe.to_host(), dwpe, 1e-5, "embedding dwpe " + tag);
  }
  // A token outside the vocabulary is an InvalidArgument naming it, as on the CPU.
  std::vector<int32_t> bad = {0, 1, 9, 2};
  auto dbad = dev(bad);
  DeviceBuffer<float> wte(5 * 4), out(4 * 4);
  try {
    cuda::embedding_forward(out.data(), dbad.data(), wte.data(), nullptr, 1, 4, 4, 5);
    FAIL() << "token 9 of a 5-token vocabulary was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token 9"), std::string::npos) << e.what();
  }
}

TEST(CudaKernels, CrossEntropyFused) {
  TRIDENT_REQUIRE_GPU();
  struct S {
    int N, V, padded;  // the last `padded` ids of each row take -inf logits (a vocabulary padded to a multiple)
  };
  // V a multiple of 4 takes the kernel's 16-byte loads; the others its scalar loop.
  for (const char* one_pass : {"0", "1"}) {  // passes for the maximum and the sum, or one (online softmax)
    trident::testing::ScopedEnv kernel("TRIDENT_CUDA_XENT_ONE_PASS", one_pass);
    for (const S s : {S{1, 1, 0}, S{7, 7, 0}, S{37, 257, 0}, S{65, 50257, 0}, S{9, 128, 0}, S{33, 50304, 47},
                      S{5, 8, 7}}) {
      auto logits = random_floats(size_t(s.N) * s.V, 81, -5.0f, 5.0f);
      for (int r = 0; r < s.N; ++r)
        for (int i = s.V - s.padded; i < s.V; ++i) logits[size_t(r) * s.V + i] = -INFINITY;
      auto targets = random_ints(s.N, 82, 0, s.V - s.padded);
      const float dscale = 1.0f / s.N;
      std::vector<float> dl(logits.size());
      const double loss = cpu::cross_entropy_forward_backward(dl.data(), logits.data(), targets.data(), s.N, s.V, dscale);
      auto dlog = dev(logits);
      auto dt = dev(targets);
      DeviceBuffer<float> dDl(logits.size());
      const double gl = cuda::cross_entropy_forward_backward(dDl.data(), dlog.data(), dt.data(), s.N, s.V, dscale);
      const std::string tag = fmt::format("N={} V={} one_pass={}", s.N, s.V, one_pass);
      EXPECT_NEAR(gl, loss, 1e-5 * std::max(1.0, std::fabs(loss))) << tag;
      expect_close(dDl.to_host(), dl, 1e-5, "cross_entropy dlogits " + tag);
      // In place (dlogits aliases logits), loss only (dlogits null).
      const double gl2 = cuda::cross_entropy_forward_backward(dlog.data(), dlog.data(), dt.data(), s.N, s.V, dscale);
      EXPECT_EQ(gl2, gl);
      expect_close(dlog.to_host(), dl, 1e-5, "cross_entropy in place " + tag);
      auto dlog2 = dev(logits);
      EXPECT_EQ(cuda::cross_entropy_forward_backward(nullptr, dlog2.data(), dt.data(), s.N, s.V, dscale), gl);
    }
  }
  std::vector<int32_t> bad = {3, -1};
  auto dbad = dev(bad);
  DeviceBuffer<float> logits(2 * 4);
  logits.zero();
  EXPECT_THROW(cuda::cross_entropy_forward_backward(nullptr, logits.data(), dbad.data(), 2, 4, 1.0f), InvalidArgument);
}

TEST(CudaKernels, AdamWSumSquaresScale) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : {size_t(1), size_t(7), size_t(1000003)}) {
    for (int64_t t : {int64_t(1), int64_t(10)}) {
      auto p = random_floats(n, 91), g = random_floats(n, 92), m = random_floats(n, 93, -0.1f, 0.1f),
           v = random_floats(n, 94, 0.0f, 0.01f);
      auto dp = dev(p), dg = dev(g), dm = dev(m), dv = dev(v);
      cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
      cuda::adamw_update(dp.data(), dg.data(), dm.data(), dv.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
      const std::string tag = fmt::format("n={} t={}", n, t);
      expect_close(dp.to_host(), p, 1e-5, "adamw param " + tag);
      expect_close(dm.to_host(), m, 1e-5, "adamw m " + tag);
      expect_close(dv.to_host(), v, 1e-5, "adamw v " + tag);
    }
  }
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1) << 20 | 3}) {
    auto x = random_floats(n, 95, -3.0f, 3.0f);
    const double ref = cpu::sum_squares(x.data(), n);
    auto dx = dev(x);
    const double got = cuda::sum_squares(dx.data(), n);
    EXPECT_NEAR(got, ref, 1e-12 * std::max(1.0, ref)) << "sum_squares n=" << n;
    EXPECT_EQ(cuda::sum_squares(dx.data(), n), got) << "sum_squares is not deterministic";
  }
}

}  // namespace
}  // namespace trident::cuda
