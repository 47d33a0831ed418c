// The CUDA op table (kernels/device.h): cuda/ops.h's kernels on the legacy default stream, and device
// memory through cudaMalloc. register_device.cc registers it with the kernels layer.
#include <cuda_runtime_api.h>

#include "trident/cuda/check.h"
#include "trident/cuda/device.h"
#include "trident/cuda/ops.h"
#include "trident/kernels/device.h"

namespace trident::cuda {
namespace {

namespace k = kernels;

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
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

const k::DeviceOps kCudaOps = {
    k::Device::kCuda,
    dev_alloc,
    dev_free,
    dev_to_device,
    dev_to_host,
    dev_copy,
    dev_memset_zero,
    dev_synchronize,
    [](bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
       float beta, float* C, int ldc, Precision p) {
      cuda::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p);
    },
    [](float* out, const float* inp, const float* w, const float* b, int N, int C, int OC, Precision p) {
      cuda::linear_forward(out, inp, w, b, N, C, OC, p);
    },
    [](float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, int N, int C, int OC,
       float beta, Precision p) { cuda::linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, beta, p); },
    [](float* out, const float* inp, size_t n, GeluKind kind) { cuda::gelu_forward(out, inp, n, kind); },
    [](float* out, float* grad, const float* inp, size_t n, GeluKind kind) {
      cuda::gelu_forward_and_grad(out, grad, inp, n, kind);
    },
    [](float* dinp, const float* inp, const float* dout, size_t n, GeluKind kind) {
      cuda::gelu_backward(dinp, inp, dout, n, kind);
    },
    [](float* out, const float* a, const float* b, size_t n) { cuda::mul(out, a, b, n); },
    [](float* out, const float* a, const float* b, size_t n) { cuda::add(out, a, b, n); },
    [](float* acc, const float* x, size_t n) { cuda::add_inplace(acc, x, n); },
    [](float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N, int C,
       float eps) { cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps); },
    [](float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, const float* mean,
       const float* rstd, int N, int C) { cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); },
    [](float* out, const float* inp, int N, int C) { cuda::softmax_forward(out, inp, N, C); },
    [](float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
      cuda::attention_forward(out, lse, qkv, B, T, C, NH);
    },
    [](float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B, int T, int C,
       int NH) { cuda::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH); },
    [](float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C, int V) {
      cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, V);
    },
    [](float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
      cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
    },
    [](float* dlogits, const float* logits, const int32_t* targets, int N, int V, float dscale) {
      return cuda::cross_entropy_forward_backward(dlogits, logits, targets, N, V, dscale);
    },
    [](float* param, const float* grad, float* m, float* v, size_t n, float lr, float b1, float b2, float eps,
       float wd, int64_t t) { cuda::adamw_update(param, grad, m, v, n, lr, b1, b2, eps, wd, t); },
    [](const float* x, size_t n) { return cuda::sum_squares(x, n); },
    [](float* x, float a, size_t n) { cuda::scale_inplace(x, a, n); },
    [](uint16_t* out, const float* in, size_t n) { cuda::to_bf16(out, in, n); },
    [](float* out, const uint16_t* in, size_t n) { cuda::from_bf16(out, in, n); },
};

}  // namespace

const kernels::DeviceOps& device_ops() { return kCudaOps; }

}  // namespace trident::cuda
