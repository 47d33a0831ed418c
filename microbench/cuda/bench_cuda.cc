// CUDA micro-benchmarks for docs/PERFORMANCE.md ("GPU"): cuBLAS GEMM TFLOP/s (float32 and bf16),
// kernel times of layernorm / attention / cross-entropy at the nanoGPT CPU shape and at GPT-2 small,
// attention alone at head dims 32, 64, 96, 128 and T up to 2048,
// device memory bandwidth of a copy kernel, and the NCCL all-reduce at world size 1 (a device-local copy).
// Timing: CUDA events around each call; warm-up, then the median of `iters` runs. Prints Markdown.
// Usage: bench_cuda [--quick]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "trident/comm/backends/nccl_pg.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/hash_store.h"
#include "trident/cuda/device.h"
#include "trident/cuda/ops.h"
#include "trident/nn/models.h"

using namespace trident;
using namespace trident::cuda;

namespace {

double median_ms(const std::function<void()>& fn, int iters, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn();
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  Event a(true), b(true);
  for (int i = 0; i < iters; ++i) {
    a.record(nullptr);
    fn();
    b.record(nullptr);
    b.synchronize();
    t.push_back(b.elapsed_ms_since(a));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void fill(float* p, size_t n, float v) {
  std::vector<float> h(n, v);
  TRIDENT_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
}

void bench_gemm(int iters) {
  std::printf("\n### cuBLAS GEMM (C[M,N] = A[M,K] B[N,K]^T, as Linear forward)\n\n");
  std::printf("| M | N | K | what | float32 ms | float32 TFLOP/s | bf16 ms | bf16 TFLOP/s |\n|---|---|---|---|---|---|---|---|\n");
  struct G {
    int M, N, K;
    std::string what;
  };
  std::vector<G> gs = {{4096, 4096, 4096, "square"}};
  for (int C : {128, 384, 768}) {
    gs.push_back({768, 3 * C, C, "qkv, N=768 rows, C=" + std::to_string(C)});
    gs.push_back({768, 4 * C, C, "mlp fc"});
    gs.push_back({768, C, 4 * C, "mlp proj"});
  }
  for (const auto& g : gs) {
    DeviceBuffer<float> A(size_t(g.M) * g.K), B(size_t(g.N) * g.K), C(size_t(g.M) * g.N);
    fill(A.data(), A.size(), 0.01f);
    fill(B.data(), B.size(), 0.02f);
    DeviceBuffer<uint16_t> A16(A.size()), B16(B.size());
    to_bf16(A16.data(), A.data(), A.size());
    to_bf16(B16.data(), B.data(), B.size());
    const double flop = 2.0 * g.M * g.N * g.K;
    const double t32 = median_ms([&] { gemm(false, true, g.M, g.N, g.K, 1.0f, A.data(), g.K, B.data(), g.K, 0.0f,
                                            C.data(), g.N); }, iters);
    const double t16 = median_ms([&] { gemm_bf16(false, true, g.M, g.N, g.K, 1.0f, A16.data(), g.K, B16.data(), g.K,
                                                 0.0f, C.data(), g.N); }, iters);
    std::printf("| %d | %d | %d | %s | %.4f | %.1f | %.4f | %.1f |\n", g.M, g.N, g.K, g.what.c_str(), t32,
                flop / t32 / 1e9, t16, flop / t16 / 1e9);
  }
}

struct Shape {
  const char* name;
  int B, T, C, NH, V;
};

void bench_kernels(int iters) {
  std::printf("\n### Kernel times (median ms)\n\n");
  std::printf("| shape | layernorm fwd | layernorm bwd | attention fwd | attention bwd | cross-entropy fwd+bwd | gelu fwd |\n|---|---|---|---|---|---|---|\n");
  for (const Shape s : {Shape{"nanoGPT CPU config: B=12 T=64 C=128 NH=4 V=65", 12, 64, 128, 4, 65},
                        Shape{"GPT-2 small: B=8 T=1024 C=768 NH=12 V=50257", 8, 1024, 768, 12, 50257}}) {
    const int N = s.B * s.T;
    const size_t nc = size_t(N) * s.C;
    DeviceBuffer<float> x(nc), out(nc), w(s.C), b(s.C), mean(N), rstd(N), dx(nc), dw(s.C), db(s.C);
    fill(x.data(), nc, 0.5f);
    fill(w.data(), s.C, 1.0f);
    fill(b.data(), s.C, 0.0f);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, s.C);
    const double ln_f = median_ms([&] { layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                                          b.data(), N, s.C); }, iters);
    const double ln_b = median_ms([&] { layernorm_backward(dx.data(), dw.data(), db.data(), out.data(), x.data(),
                                                           w.data(), mean.data(), rstd.data(), N, s.C); }, iters);
    DeviceBuffer<float> qkv(3 * nc), att(nc), lse(size_t(s.B) * s.NH * s.T), dqkv(3 * nc);
    fill(qkv.data(), 3 * nc, 0.1f);
    attention_forward(att.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    const double at_f = median_ms([&] { attention_forward(att.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH); },
                                  iters);
    const double at_b = median_ms([&] { attention_backward(dqkv.data(), out.data(), qkv.data(), att.data(), lse.data(),
                                                           s.B, s.T, s.C, s.NH); }, iters);
    DeviceBuffer<float> logits(size_t(N) * s.V), losses(N);
    fill(logits.data(), logits.size(), 0.25f);
    DeviceBuffer<int32_t> tg(N);
    TRIDENT_CUDA_CHECK(cudaMemset(tg.data(), 0, N * sizeof(int32_t)));
    const double ce = median_ms([&] { cross_entropy_rows(losses.data(), logits.data(), logits.data(), tg.data(), N,
                                                         s.V, 1.0f / N); }, iters);
    DeviceBuffer<float> h(4 * nc), hg(4 * nc);
    const double ge = median_ms([&] { cuda::gelu_forward(hg.data(), h.data(), 4 * nc, GeluKind::kTanh); }, iters);
    std::printf("| %s | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n", s.name, ln_f, ln_b, at_f, at_b, ce, ge);
  }
}

// Attention alone at more head dims and lengths. FLOPs counted as the causal half of the score matrix:
// forward 2 products (Q K^T, P V) = 4 B NH hd T(T+1)/2; backward 4 (dV, dP, dS^T Q, dS K) = twice that
// (the deterministic kernel does 7 products, recomputing Q K^T and dP for dQ, which is not counted).
void bench_attention(int iters) {
  std::printf("\n### Attention (median ms; TFLOP/s of the causal FLOPs; float32 on CUDA cores, bfloat16 on tensor "
              "cores)\n\n| shape | head dim | precision | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |\n"
              "|---|---|---|---|---|---|---|\n");
  struct A {
    int B, T, C, NH;
  };
  for (const A s : {A{12, 64, 128, 4}, A{8, 1024, 768, 12}, A{16, 1024, 768, 12}, A{8, 1024, 1024, 8},
                    A{4, 2048, 768, 12}, A{8, 1024, 1152, 12}}) {
    const size_t nc = size_t(s.B) * s.T * s.C;
    DeviceBuffer<float> qkv(3 * nc), att(nc), lse(size_t(s.B) * s.NH * s.T), dqkv(3 * nc), dout(nc);
    fill(qkv.data(), 3 * nc, 0.1f);
    fill(dout.data(), nc, 0.01f);
    for (const Precision p : {Precision::kFloat32, Precision::kBFloat16}) {
      const double tf = median_ms(
          [&] { trident::cuda::attention_forward(att.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, p); }, iters);
      const double tb = median_ms([&] { trident::cuda::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(),
                                                           lse.data(), s.B, s.T, s.C, s.NH, p); }, iters);
      const double flop = 4.0 * s.B * s.NH * (s.C / s.NH) * (double(s.T) * (s.T + 1) / 2);
      std::printf("| B=%d T=%d C=%d NH=%d | %d | %s | %.4f | %.1f | %.4f | %.1f |\n", s.B, s.T, s.C, s.NH,
                  s.C / s.NH, p == Precision::kBFloat16 ? "bf16" : "float32", tf, flop / tf / 1e9, tb,
                  2 * flop / tb / 1e9);
    }
  }
}

void bench_bandwidth(int iters) {
  std::printf("\n### Device memory bandwidth (bytes read + written per second)\n\n| bytes copied | copy kernel ms | copy kernel GB/s | cudaMemcpy D2D GB/s |\n|---|---|---|---|\n");
  for (size_t bytes : {size_t(64) << 20, size_t(1) << 30}) {
    const size_t n = bytes / 4;
    DeviceBuffer<float> a(n), b(n);
    fill(a.data(), n, 1.0f);
    const double tk = median_ms([&] { copy(b.data(), a.data(), n); }, iters);
    const double tm = median_ms([&] { TRIDENT_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes,
                                                                           cudaMemcpyDeviceToDevice, nullptr)); },
                                iters);
    std::printf("| %zu MiB | %.4f | %.0f | %.0f |\n", bytes >> 20, tk, 2.0 * bytes / tk / 1e6, 2.0 * bytes / tm / 1e6);
  }
}

void bench_nccl(int iters) {
  std::printf("\n### NCCL all-reduce at world size 1 (NCCL copies send to recv on the device; no network)\n\n"
              "| bytes | time us (host-observed, Work::wait) | algbw GB/s |\n|---|---|---|\n");
  GroupOptions o;
  o.backend = "nccl";
  auto pg = new_process_group(std::make_shared<HashStore>(), 0, 1, o);
  for (size_t bytes : {size_t(4) << 10, size_t(1) << 20, size_t(64) << 20, size_t(1) << 30}) {
    const size_t n = bytes / 4;
    DeviceBuffer<float> a(n), b(n);
    std::vector<double> t;
    for (int i = 0; i < iters + 3; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      pg->all_reduce(a.data(), b.data(), n, DType::kFloat32, ReduceOp::kSum);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 3) t.push_back(us);
    }
    std::sort(t.begin(), t.end());
    const double us = t[t.size() / 2];
    std::printf("| %zu KiB | %.1f | %.1f |\n", bytes >> 10, us, bytes / us / 1e3);
  }
}

void bench_gpt(int iters) {
  std::printf("\n### GPT forward+backward on the GPU (nn::make_model with device cuda; loss synchronizes each step)\n\n"
              "| model | GEMM precision | step ms (median) | tokens/s |\n|---|---|---|---|\n");
  struct M {
    const char* name;
    nlohmann::json c;
    int B, T;
  };
  std::vector<M> ms;
  const nlohmann::json small = {{"n_layer", 4},     {"n_head", 4},      {"n_embd", 128}, {"block_size", 64},
                                {"vocab_size", 65}, {"gelu", "exact"},  {"device", "cuda"}};
  const nlohmann::json gpt2 = {{"n_layer", 12},       {"n_head", 12},    {"n_embd", 768}, {"block_size", 1024},
                               {"vocab_size", 50257}, {"gelu", "tanh"}, {"device", "cuda"}};
  ms.push_back({"nanoGPT CPU config (L4 H4 C128, B=12 T=64, V=65)", small, 12, 64});
  ms.push_back({"GPT-2 small (L12 H12 C768, B=8 T=1024, V=50257)", gpt2, 8, 1024});
  for (auto m : ms) {
    for (const char* dtype : {"float32", "bfloat16"}) {
      m.c["dtype"] = dtype;
      auto g = nn::make_model(m.c);
      const int V = m.c["vocab_size"].get<int>();
      std::vector<int32_t> tok(size_t(m.B) * m.T);
      for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 7919) % V);
      // Host tokens: each step includes the model's copy of the batch to the device.
      const double ms_step = median_ms([&] { g->forward_backward(tok.data(), tok.data(), m.B, m.T, true); }, iters, 2);
      std::printf("| %s | %s | %.2f | %.0f |\n", m.name, dtype, ms_step, m.B * m.T / (ms_step / 1e3));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (device_count() == 0) {
    std::printf("bench_cuda: %s\n", no_device_reason().c_str());
    return 0;
  }
  const int iters = quick ? 3 : 20;
  std::printf("## bench_cuda on %s\n", device_description(0).c_str());
  bench_gemm(iters);
  bench_kernels(quick ? 3 : 10);
  bench_attention(quick ? 3 : 10);
  bench_bandwidth(iters);
  if (nccl_backend_built()) bench_nccl(iters);
  bench_gpt(quick ? 2 : 5);
  return 0;
}
