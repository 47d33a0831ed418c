// The CUDA op table's entries: every one set (no GPU needed: the table is a static object), and the Llama
// family's kernels (RMSNorm, rotary embeddings, SwiGLU, grouped-query kv expansion and reduction), called through
// the table as the models call them, against the CPU kernels of kernels/cpu/ops.h on the same inputs at odd sizes.
// Tolerances (expect_close: relative, floored at 0.1 x the array's largest magnitude): 1e-5 for RMSNorm (float
// warp sums against the CPU's double), rotary embeddings and SwiGLU (expf against the CPU's polynomial exp);
// kv_expand is a copy and kv_reduce adds in the CPU's order, so both must match bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "cuda_test_util.h"
#include "harness/op_table.h"
#include "trident/cuda/device.h"
#include "trident/cuda/ops.h"
#include "trident/kernels/cpu/ops.h"

namespace trident::cuda {
namespace {

namespace cpu = trident::kernels::cpu;
using testing::expect_close;
using testing::random_floats;
using testing::dev;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(CudaOpTable, HasEveryEntry) {
  // No GPU needed: cuda::device_ops() hands out the static table without touching the device.
  const auto& ops = cuda::device_ops();
  EXPECT_EQ(ops.device, kernels::Device::kCuda);
  EXPECT_EQ(trident::testing::null_op_entries(ops), std::vector<size_t>{})
      << "null entries of the CUDA op table (0 = alloc, in kernels/device.h's order)";
}

TEST(CudaLlamaKernels, RmsNormMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const auto& ops = cuda::device_ops();
  double worst = 0;
  for (auto [N, C] : {std::pair{1, 1}, {7, 13}, {33, 64}, {130, 768}, {131, 1031}}) {
    const size_t nc = size_t(N) * C;
    const float eps = 1e-6f;
    auto x = random_floats(nc, 1, -2.0f, 3.0f), w = random_floats(C, 2), g = random_floats(nc, 3);
    auto dinp = random_floats(nc, 4), dw = random_floats(C, 5);
    std::vector<float> out(nc), rstd(N);
    auto dx = dev(x), dW = dev(w), dg = dev(g), dDinp = dev(dinp), dDw = dev(dw);
    DeviceBuffer<float> dOut(nc), dRstd(N);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    cpu::rmsnorm_backward(dinp.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
    ops.rmsnorm_forward(dOut.data(), dRstd.data(), dx.data(), dW.data(), N, C, eps);
    ops.rmsnorm_backward(dDinp.data(), dDw.data(), dg.data(), dx.data(), dW.data(), dRstd.data(), N, C);
    const std::string tag = fmt::format("N={} C={}", N, C);
    worst = std::max(worst, expect_close(dOut.to_host(), out, 1e-5, "rmsnorm out " + tag));
    worst = std::max(worst, expect_close(dRstd.to_host(), rstd, 1e-5, "rmsnorm rstd " + tag));
    worst = std::max(worst, expect_close(dDinp.to_host(), dinp, 1e-5, "rmsnorm dinp (accumulated) " + tag));
    worst = std::max(worst, expect_close(dDw.to_host(), dw, 1e-5, "rmsnorm dweight (accumulated) " + tag));
    // rstd is nullable.
    DeviceBuffer<float> dOut2(nc);
    ops.rmsnorm_forward(dOut2.data(), nullptr, dx.data(), dW.data(), N, C, eps);
    EXPECT_TRUE(same_bits(dOut2.to_host(), dOut.to_host())) << tag;
  }
  std::printf("rmsnorm worst relative error %.3g\n", worst);
}

TEST(CudaLlamaKernels, RopeMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const auto& ops = cuda::device_ops();
  double worst = 0;
  for (int N : {1, 7, 33, 130})
    for (int hd : {2, 8, 16, 128})
      for (int n_heads : {1, 3}) {
        const int T = std::min(N, 17), T_max = T + 5, stride = 3 * n_heads * hd + 1;
        const size_t half = hd / 2;
        std::vector<float> cos(T_max * half), sin(T_max * half);
        for (int p = 0; p < T_max; ++p)
          for (size_t i = 0; i < half; ++i) {
            const double a = p * std::pow(10000.0, -2.0 * i / hd);
            cos[p * half + i] = static_cast<float>(std::cos(a));
            sin[p * half + i] = static_cast<float>(std::sin(a));
          }
        auto dcos = dev(cos), dsin = dev(sin);
        for (int inverse = 0; inverse < 2; ++inverse) {
          auto x = random_floats(size_t(N) * stride, 10 + hd);
          auto dX = dev(x);
          // The k heads of a packed q | k | v row: offset n_heads * hd.
          const int off = n_heads * hd;
          cpu::rope(x.data() + off, cos.data(), sin.data(), N, T, stride, n_heads, hd, inverse);
          ops.rope(dX.data() + off, dcos.data(), dsin.data(), N, T, stride, n_heads, hd, inverse);
          worst = std::max(worst, expect_close(dX.to_host(), x, 1e-5,
                                               fmt::format("rope N={} hd={} heads={} inverse={}", N, hd, n_heads,
                                                           inverse)));
        }
      }
  std::printf("rope worst relative error %.3g\n", worst);
}

TEST(CudaLlamaKernels, SwigluMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const auto& ops = cuda::device_ops();
  double worst = 0;
  for (auto [N, I] : {std::pair{1, 1}, {7, 13}, {33, 64}, {130, 1031}}) {
    auto h = random_floats(size_t(N) * 2 * I, 20, -6.0f, 6.0f), d = random_floats(size_t(N) * I, 21);
    std::vector<float> out(size_t(N) * I), dh(h.size());
    cpu::swiglu_forward(out.data(), h.data(), N, I);
    cpu::swiglu_backward(dh.data(), d.data(), h.data(), N, I);
    auto dH = dev(h), dD = dev(d);
    DeviceBuffer<float> dOut(out.size()), dDh(dh.size());
    ops.swiglu_forward(dOut.data(), dH.data(), N, I);
    ops.swiglu_backward(dDh.data(), dD.data(), dH.data(), N, I);
    const std::string tag = fmt::format("N={} I={}", N, I);
    worst = std::max(worst, expect_close(dOut.to_host(), out, 1e-5, "swiglu out " + tag));
    worst = std::max(worst, expect_close(dDh.to_host(), dh, 1e-5, "swiglu dh " + tag));
  }
  std::printf("swiglu worst relative error %.3g\n", worst);
}

TEST(CudaLlamaKernels, KvExpandReduceMatchCpuBitwise) {
  TRIDENT_REQUIRE_GPU();
  const auto& ops = cuda::device_ops();
  struct S {
    int nh, nkv, h0, group, kv0;
  };
  // MHA, MQA, GQA, tensor-parallel shards (h0, kv0 nonzero; a replicated kv head; a kv head read by no q head).
  for (const S s : {S{4, 4, 0, 1, 0}, S{4, 1, 0, 4, 0}, S{6, 2, 0, 3, 0}, S{4, 1, 4, 4, 1}, S{2, 1, 6, 2, 3},
                    S{2, 1, 2, 4, 0}, S{2, 2, 2, 2, 0}, S{32, 8, 0, 4, 0}})
    for (int N : {1, 7, 33, 130})
      for (int hd : {2, 8, 16, 128}) {
        const size_t ls = size_t(s.nh + 2 * s.nkv) * hd, ld = size_t(3 * s.nh) * hd;
        auto src = random_floats(N * ls, 30), ddst = random_floats(N * ld, 31);
        std::vector<float> dst(N * ld), dsrc(N * ls);
        cpu::kv_expand(dst.data(), src.data(), N, s.nh, s.nkv, hd, s.h0, s.group, s.kv0);
        cpu::kv_reduce(dsrc.data(), ddst.data(), N, s.nh, s.nkv, hd, s.h0, s.group, s.kv0);
        auto dSrc = dev(src), dDdst = dev(ddst);
        // Poisoned outputs: both are overwritten.
        auto dDst = dev(std::vector<float>(dst.size(), 7.0f)), dDsrc = dev(std::vector<float>(dsrc.size(), 7.0f));
        ops.kv_expand(dDst.data(), dSrc.data(), N, s.nh, s.nkv, hd, s.h0, s.group, s.kv0);
        ops.kv_reduce(dDsrc.data(), dDdst.data(), N, s.nh, s.nkv, hd, s.h0, s.group, s.kv0);
        const std::string tag =
            fmt::format("nh={} nkv={} h0={} group={} kv0={} N={} hd={}", s.nh, s.nkv, s.h0, s.group, s.kv0, N, hd);
        EXPECT_TRUE(same_bits(dDst.to_host(), dst)) << "kv_expand " << tag;
        EXPECT_TRUE(same_bits(dDsrc.to_host(), dsrc)) << "kv_reduce " << tag;
      }
}

TEST(CudaLlamaKernels, KvHeadsOutsideTheShardAreRefused) {
  // Checked on the host before any launch: no GPU needed, and nothing is dereferenced.
  EXPECT_THROW(cuda::kv_expand(nullptr, nullptr, 1, 4, 2, 2, 0, 2, 1), InvalidArgument);
  EXPECT_THROW(cuda::kv_reduce(nullptr, nullptr, 1, 4, 1, 2, 0, 2, 0), InvalidArgument);
  EXPECT_THROW(cuda::rope(nullptr, nullptr, nullptr, 1, 1, 6, 2, 3, false), InvalidArgument);
}

}  // namespace
}  // namespace trident::cuda
