// CUDA kernels for training: the device twins of kernels/cpu/ops.h, with the same conventions.
//
// Call these as cuda::name(...): GeluKind and Precision live in kernels::cpu, so an unqualified call that
// passes one is ambiguous with the CPU kernel by argument-dependent lookup.
// Conventions (as the CPU kernels): row-major; a "row" is one of N = B*T positions; Linear weights in
// PyTorch's layout W[out, in] (y = x W^T + b); gradient outputs named d<param> ACCUMULATE (+=),
// activation gradients overwrite unless the argument says otherwise; "nullable" pointers may be null.
// Every pointer is DEVICE memory (cudaMalloc) unless named host_*; tokens/targets are device int32.
// Ownership: kernels own no memory beyond stream-ordered scratch (cudaMallocAsync) freed on the same
// stream, and one cuBLAS handle per host thread and device (created on first use, reused).
// Blocking: every call is asynchronous on `stream` (default: the legacy default stream) EXCEPT the calls
// that return a host value or validate indices (cross_entropy_forward_backward, sum_squares,
// embedding_forward): they synchronize `stream` and so block the caller.
// Determinism: every kernel is run-to-run deterministic except embedding_backward's dwte, which adds rows
// with atomicAdd (sort-free; the order of additions into one vocabulary row varies between runs).
// dwpe, dweight/dbias of layernorm and linear, and attention's dk/dv use fixed-order reductions.
// Thread-safety: calls on disjoint outputs may run concurrently from different threads. No timeouts.
// Built only where nvcc is found (TRIDENT_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "trident/kernels/cpu/ops.h"

namespace trident::cuda {

using kernels::cpu::GeluKind;
using kernels::cpu::Precision;

// C[M,N] = alpha * op(A) op(B) + beta * C (row-major), through cuBLAS in float32 (no TF32). With
// kBFloat16 the float32 operands are rounded to bfloat16 (round-to-nearest-even, as the CPU kernel) and
// multiplied by cublasGemmEx with float32 accumulation and float32 output.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision p = Precision::kFloat32, cudaStream_t stream = nullptr);
// The same on operands already in bfloat16 (uint16_t bit patterns); C stays float32.
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A, int lda,
               const uint16_t* B, int ldb, float beta, float* C, int ldc, cudaStream_t stream = nullptr);

// out[N,OC] = inp[N,C] W[OC,C]^T + bias[OC] (bias nullable). With a bias, one cuBLASLt call adds it as the
// product is written (its epilogue); where cuBLASLt has no algorithm for the operands (their alignment), the
// bias rows are filled first and the GEMM adds onto them.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    Precision p = Precision::kFloat32, cudaStream_t stream = nullptr);
// How many linear_forward calls with a bias took each path in this process (the tests check the epilogue's).
struct LinearBiasPaths {
  long epilogue = 0, fill = 0;
};
LinearBiasPaths linear_bias_paths();

// dinp[N,C] = dinp_beta * dinp + dout W (dinp nullable); dweight[OC,C] += dout^T inp; dbias[OC] += column
// sums of dout (nullable; fixed-order two-stage sum). dinp_mul (nullable, N x C): dinp is then multiplied
// by it elementwise, as the CPU kernel does (here a separate elementwise pass after the product).
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, float dinp_beta = 0.0f,
                     Precision p = Precision::kFloat32, const float* dinp_mul = nullptr,
                     cudaStream_t stream = nullptr);

void gelu_forward(float* out, const float* inp, size_t n, GeluKind kind, cudaStream_t stream = nullptr);
// out = gelu(inp) and grad = gelu'(inp) in one pass (grad may alias inp), as the CPU kernel.
void gelu_forward_and_grad(float* out, float* grad, const float* inp, size_t n, GeluKind kind,
                           cudaStream_t stream = nullptr);
// dinp = dout * gelu'(inp); dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, GeluKind kind,
                   cudaStream_t stream = nullptr);
void add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream = nullptr);
void add_inplace(float* acc, const float* x, size_t n, cudaStream_t stream = nullptr);
void mul(float* out, const float* a, const float* b, size_t n, cudaStream_t stream = nullptr);

// LayerNorm over the last dim C: out = (x-mean)*rstd*w + b; mean/rstd [N] nullable; bias nullable.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps = 1e-5f, cudaStream_t stream = nullptr);
// dinp += ...; dweight += ...; dbias += ... (nullable).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream = nullptr);

void softmax_forward(float* out, const float* inp, int N, int C, cudaStream_t stream = nullptr);

// ---- Llama-family layers (llama_kernels.cu), with the CPU kernels' layouts and formulas (kernels/cpu/ops.h) ----
// RMSNorm: out = inp * rstd * weight, rstd[r] = 1/sqrt(mean of squares + eps) (warp sums in float32); rstd
// nullable.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps,
                     cudaStream_t stream = nullptr);
// dinp += ...; dweight += sum over rows of dout * inp * rstd (fixed-order two-stage column sums).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C, cudaStream_t stream = nullptr);
// Rotary embedding in place (rotate-half layout), inverse = the backward; cos/sin [T_max, hd/2] on the device.
void rope(float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd, bool inverse,
          cudaStream_t stream = nullptr);
// out[N, I] = silu(gate) * up from h[N, 2I] = [gate | up]; dh[N, 2I] overwritten.
void swiglu_forward(float* out, const float* h, int N, int I, cudaStream_t stream = nullptr);
void swiglu_backward(float* dh, const float* dout, const float* h, int N, int I, cudaStream_t stream = nullptr);
// Grouped-query key/value sharing: kv_expand builds q | k | v with nh heads each from q | k | v with nkv key/value
// heads; kv_reduce is its adjoint (dq copied, each kv head's gradient the sum over the q heads that read it, in
// ascending order: the CPU kernel's bits). Kv indices outside [0, nkv) throw InvalidArgument (checked on the host).
void kv_expand(float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group, int kv0,
               cudaStream_t stream = nullptr);
void kv_reduce(float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group, int kv0,
               cudaStream_t stream = nullptr);

// The GEMM and attention paths a model with head dim `head_dim` (0: none) takes at precision p, in words
// ("GEMMs: cuBLAS, bf16 operands, float32 accumulation; attention (head dim 64): tensor cores, ...").
// Needs no GPU.
std::string kernel_summary(int head_dim, Precision p);

// Causal multi-head self-attention, same layout as the CPU kernel: qkv[B,T,3C] (q | k | v), out[B,T,C],
// lse[B,NH,T] (natural log-sum-exp of the scaled scores). No atomics: deterministic.
// Float32 (p = kFloat32, or a head dim other than 32, 64, 128): CUDA cores, matching the CPU kernel to
// float32 rounding. Head dims <= 128: tiled FlashAttention-2-style kernels (64-row query and key tiles in
// shared memory, online softmax; backward recomputes P from lse, dk/dv per key tile and dq per query tile),
// any T. Larger heads: simple kernels with a row of scores in shared memory, so T is limited by shared memory
// (two rows of T floats per block: about 28000 on an H100).
// kBFloat16 at head dims 32, 64, 128: the same algorithm on tensor cores (attention_bf16.cu): q, k, v, dO
// and the probabilities are rounded to bfloat16 as operands, with float32 accumulation, softmax and lse,
// as a bf16 autocast attention; any T.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       Precision p = Precision::kFloat32, cudaStream_t stream = nullptr);
// dqkv[B,T,3C] (overwritten).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int B, int T, int C, int NH, Precision p = Precision::kFloat32,
                        cudaStream_t stream = nullptr);

// out[B*T,C] = wte[tokens] + wpe[t] (wpe nullable). Out-of-range tokens throw InvalidArgument (this call
// synchronizes `stream` to check).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V, cudaStream_t stream = nullptr);
// dwte[tok] += dout (atomicAdd: order of additions not deterministic); dwpe[t] += dout (deterministic).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        cudaStream_t stream = nullptr);

// Fused softmax + cross-entropy over logits[N,V]. Returns the SUM of per-row losses (summed on the host in
// double, after a synchronize). dlogits (nullable, may alias logits) = (softmax - onehot) * dscale.
// Out-of-range targets throw InvalidArgument.
double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                                      float dscale, cudaStream_t stream = nullptr);
// Asynchronous form: losses[N] (device) receives each row's loss; targets are not checked.
void cross_entropy_rows(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                        float dscale, cudaStream_t stream = nullptr);

// One AdamW step (PyTorch semantics, decoupled decay), t 1-based.
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t, cudaStream_t stream = nullptr);

// Sum of squares accumulated in double, fixed-order (deterministic); synchronizes. x *= a.
double sum_squares(const float* x, size_t n, cudaStream_t stream = nullptr);
void scale_inplace(float* x, float a, size_t n, cudaStream_t stream = nullptr);

// Float32 <-> bfloat16 (round-to-nearest-even).
void to_bf16(uint16_t* out, const float* in, size_t n, cudaStream_t stream = nullptr);
void from_bf16(float* out, const uint16_t* in, size_t n, cudaStream_t stream = nullptr);

// Device-to-device copy kernel (bench: memory bandwidth of a plain kernel, not cudaMemcpy).
void copy(float* dst, const float* src, size_t n, cudaStream_t stream = nullptr);

}  // namespace trident::cuda
