// The CUDA op table (kernels/device.h): cuda/ops.h's kernels on the legacy default stream, and device
// memory through cudaMalloc. register_device.cc registers it with the kernels layer.
#include <cuda_runtime_api.h>

#include <atomic>
#include <vector>

#include "trident/cuda/check.h"
#include "trident/cuda/device.h"
#include "trident/cuda/ops.h"
#include "trident/cuda/tp_launch.h"
#include "trident/kernels/device.h"

namespace trident::cuda {
namespace {

namespace k = kernels;

std::atomic<bool> g_allocated{false};

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  g_allocated.store(true, std::memory_order_relaxed);
  TRIDENT_CUDA_CHECK(cudaMalloc(&p, bytes));  // 256-byte aligned
  TRIDENT_CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}
void dev_free(void* p) {
  if (p) cudaFree(p);  // no throw: called from destructors; a failing free means the context is gone
}
void dev_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) TRIDENT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void dev_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) TRIDENT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void dev_copy(void* dst, const void* src, size_t bytes) {
  if (bytes) TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr));
}
void dev_memset_zero(void* p, size_t bytes) {
  if (bytes) TRIDENT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, nullptr));
}
void dev_synchronize() { TRIDENT_CUDA_CHECK(cudaDeviceSynchronize()); }

void dev_copy_2d(float* dst, size_t ldd, const float* src, size_t lds, size_t rows, size_t cols) {
  if (rows == 0 || cols == 0) return;
  TRIDENT_CUDA_CHECK(cudaMemcpy2DAsync(dst, ldd * sizeof(float), src, lds * sizeof(float), cols * sizeof(float), rows,
                                       cudaMemcpyDeviceToDevice, nullptr));
}

void dev_fill_2d(float* dst, size_t ldd, float value, size_t rows, size_t cols) {
  launch::fill_2d(dst, ldd, value, rows, cols, nullptr);
  TRIDENT_CUDA_CHECK_LAUNCH("fill_2d");
}

void dev_add_2d(float* out, size_t ldo, const float* a, size_t lda, const float* b, size_t ldb, size_t rows,
                size_t cols) {
  launch::add_2d(out, ldo, a, lda, b, ldb, rows, cols, nullptr);
  TRIDENT_CUDA_CHECK_LAUNCH("add_2d");
}

// A device allocation of n T for one call (these entries block anyway: they read a flag or the losses back).
template <class T>
struct Temp {
  explicit Temp(size_t n) { TRIDENT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T))); }
  ~Temp() { cudaFree(p); }
  T* p = nullptr;
};

// Runs `launch_fn(flag)` and returns the flag (0: fine, else 1 + a bad row) after the device is done.
template <class F>
int with_flag(const char* what, F&& launch_fn) {
  Temp<int> flag(1);
  TRIDENT_CUDA_CHECK(cudaMemsetAsync(flag.p, 0, sizeof(int), nullptr));
  launch_fn(flag.p);
  TRIDENT_CUDA_CHECK_LAUNCH(what);
  int host = 0;
  TRIDENT_CUDA_CHECK(cudaMemcpy(&host, flag.p, sizeof(int), cudaMemcpyDeviceToHost));
  return host;
}

void dev_embedding_shard_forward(float* out, const int32_t* tokens, const float* wte_shard, int64_t v0, int64_t vl,
                                 int64_t V, int N, int C) {
  const int bad = with_flag("embedding_shard_forward", [&](int* flag) {
    launch::embedding_shard_forward(out, tokens, wte_shard, v0, vl, V, N, C, flag, nullptr);
  });
  if (bad) {
    int32_t tok = 0;
    TRIDENT_CUDA_CHECK(cudaMemcpy(&tok, tokens + (bad - 1), sizeof(int32_t), cudaMemcpyDeviceToHost));
    TRIDENT_THROW(InvalidArgument,
                  "embedding: token {} at position {} is outside the vocabulary [0, {}); check the data and "
                  "vocab_size",
                  tok, bad - 1, V);
  }
}

void dev_embedding_shard_backward(float* dwte_shard, const float* dout, const int32_t* tokens, int64_t v0, int64_t vl,
                                  int N, int C) {
  launch::embedding_shard_backward(dwte_shard, dout, tokens, v0, vl, N, C, nullptr);
  TRIDENT_CUDA_CHECK_LAUNCH("embedding_shard_backward");
}

void dev_ce_shard_max(float* mx, const float* logits, const int32_t* targets, int N, int64_t vl, int64_t V) {
  const int bad =
      with_flag("ce_shard_max", [&](int* flag) { launch::ce_shard_max(mx, logits, targets, N, vl, V, flag, nullptr); });
  if (bad) {
    int32_t t = 0;
    TRIDENT_CUDA_CHECK(cudaMemcpy(&t, targets + (bad - 1), sizeof(int32_t), cudaMemcpyDeviceToHost));
    TRIDENT_THROW(InvalidArgument, "cross-entropy: target {} at position {} is outside the vocabulary [0, {})", t,
                  bad - 1, V);
  }
}

void dev_ce_shard_sumexp(float* st, float* dlogits, const float* logits, const float* mx, const int32_t* targets,
                         int N, int64_t vl, int64_t v0) {
  launch::ce_shard_sumexp(st, dlogits, logits, mx, targets, N, vl, v0, nullptr);
  TRIDENT_CUDA_CHECK_LAUNCH("ce_shard_sumexp");
}

double dev_ce_shard_finish(float* dlogits, const float* st, const float* mx, const int32_t* targets, int N, int64_t vl,
                           int64_t v0, float dscale) {
  if (N <= 0) return 0.0;
  Temp<double> losses(static_cast<size_t>(N));
  launch::ce_shard_finish(losses.p, dlogits, st, mx, targets, N, vl, v0, dscale, nullptr);
  TRIDENT_CUDA_CHECK_LAUNCH("ce_shard_finish");
  std::vector<double> host(static_cast<size_t>(N));
  TRIDENT_CUDA_CHECK(cudaMemcpy(host.data(), losses.p, host.size() * sizeof(double), cudaMemcpyDeviceToHost));
  double total = 0;
  for (double x : host) total += x;  // row order, as the CPU reference
  return total;
}

// Designated initializers in declaration order: a misordered entry does not compile, nor (by the pragma) a missing
// one; tests/unit/cuda's table test (no GPU needed) checks every entry is non-null as well.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wmissing-field-initializers"
const k::DeviceOps kCudaOps = {
    .device = k::Device::kCuda,
    .alloc = dev_alloc,
    .free = dev_free,
    .to_device = dev_to_device,
    .to_host = dev_to_host,
    .copy = dev_copy,
    .memset_zero = dev_memset_zero,
    .synchronize = dev_synchronize,
    .gemm = [](bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
               float beta, float* C, int ldc,
               Precision p) { cuda::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p); },
    .linear_forward = [](float* out, const float* inp, const float* w, const float* b, int N, int C, int OC,
                         Precision p) { cuda::linear_forward(out, inp, w, b, N, C, OC, p); },
    .linear_backward = [](float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          int N, int C, int OC, float beta, Precision p,
                          const float* dinp_mul) {
      cuda::linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, beta, p, dinp_mul);
    },
    .gelu_forward = [](float* out, const float* inp, size_t n,
                       GeluKind kind) { cuda::gelu_forward(out, inp, n, kind); },
    .gelu_forward_and_grad = [](float* out, float* grad, const float* inp, size_t n,
                                GeluKind kind) { cuda::gelu_forward_and_grad(out, grad, inp, n, kind); },
    .gelu_backward = [](float* dinp, const float* inp, const float* dout, size_t n,
                        GeluKind kind) { cuda::gelu_backward(dinp, inp, dout, n, kind); },
    .mul = [](float* out, const float* a, const float* b, size_t n) { cuda::mul(out, a, b, n); },
    .add = [](float* out, const float* a, const float* b, size_t n) { cuda::add(out, a, b, n); },
    .add_inplace = [](float* acc, const float* x, size_t n) { cuda::add_inplace(acc, x, n); },
    .layernorm_forward = [](float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                            int N, int C,
                            float eps) { cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps); },
    .layernorm_backward = [](float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                             const float* mean, const float* rstd, int N,
                             int C) { cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); },
    .softmax_forward = [](float* out, const float* inp, int N, int C) { cuda::softmax_forward(out, inp, N, C); },
    .attention_forward = [](float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                            Precision p) { cuda::attention_forward(out, lse, qkv, B, T, C, NH, p); },
    .attention_backward = [](float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int B, int T, int C, int NH,
                             Precision p) { cuda::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, p); },
    .embedding_forward = [](float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                            int C, int V) { cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, V); },
    .embedding_backward = [](float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                             int C) { cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T, C); },
    .cross_entropy_forward_backward = [](float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                                         float dscale) {
      return cuda::cross_entropy_forward_backward(dlogits, logits, targets, N, V, dscale);
    },
    .adamw_update = [](float* param, const float* grad, float* m, float* v, size_t n, float lr, float b1, float b2,
                       float eps, float wd,
                       int64_t t) { cuda::adamw_update(param, grad, m, v, n, lr, b1, b2, eps, wd, t); },
    .sum_squares = [](const float* x, size_t n) { return cuda::sum_squares(x, n); },
    .scale_inplace = [](float* x, float a, size_t n) { cuda::scale_inplace(x, a, n); },
    .to_bf16 = [](uint16_t* out, const float* in, size_t n) { cuda::to_bf16(out, in, n); },
    .from_bf16 = [](float* out, const uint16_t* in, size_t n) { cuda::from_bf16(out, in, n); },
    .copy_2d = dev_copy_2d,
    .fill_2d = dev_fill_2d,
    .add_2d = dev_add_2d,
    .embedding_shard_forward = dev_embedding_shard_forward,
    .embedding_shard_backward = dev_embedding_shard_backward,
    .ce_shard_max = dev_ce_shard_max,
    .ce_shard_sumexp = dev_ce_shard_sumexp,
    .ce_shard_finish = dev_ce_shard_finish,
    .rmsnorm_forward = [](float* out, float* rstd, const float* inp, const float* w, int N, int C,
                          float eps) { cuda::rmsnorm_forward(out, rstd, inp, w, N, C, eps); },
    .rmsnorm_backward = [](float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                           const float* rstd, int N,
                           int C) { cuda::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); },
    .rope = [](float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd,
               bool inverse) { cuda::rope(x, cos, sin, N, T, stride, n_heads, hd, inverse); },
    .swiglu_forward = [](float* out, const float* h, int N, int I) { cuda::swiglu_forward(out, h, N, I); },
    .swiglu_backward = [](float* dh, const float* dout, const float* h, int N,
                          int I) { cuda::swiglu_backward(dh, dout, h, N, I); },
    .kv_expand = [](float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group,
                    int kv0) { cuda::kv_expand(dst, src, N, nh, nkv, hd, h0, group, kv0); },
    .kv_reduce = [](float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group,
                    int kv0) { cuda::kv_reduce(dsrc, ddst, N, nh, nkv, hd, h0, group, kv0); },
    .describe =
        [] {
          int d = 0;
          TRIDENT_CUDA_CHECK(cudaGetDevice(&d));
          return cuda::device_description(d);
        },
    .kernel_summary = [](int head_dim, Precision p) { return cuda::kernel_summary(head_dim, p); },
};
#pragma GCC diagnostic pop

}  // namespace

const kernels::DeviceOps& device_ops() { return kCudaOps; }

bool allocated_device_memory() { return g_allocated.load(std::memory_order_relaxed); }

}  // namespace trident::cuda
