// Internal: kernel launchers of the CUDA layer (kernels.cu, attention.cu), called by ops.cc, which checks
// errors, validates arguments and owns scratch. Kept free of trident/core headers so nvcc compiles only
// kernels. Every launcher is asynchronous on `s` and performs no error checking of its own.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace trident::cuda::launch {

// Rows of a column-sum chunk (two-stage, fixed-order column reductions).
inline constexpr int kColumnChunkRows = 64;
inline int column_chunks(int N) { return (N + kColumnChunkRows - 1) / kColumnChunkRows; }
// Blocks of the first stage of sum_squares (fixed, so the reduction order depends only on n).
inline constexpr int kSumSquaresBlocks = 1024;

// dst[i] = srcs[0][i] op srcs[1][i] op ... (nsrc <= kMaxReduceSources sources, n elements of `dtype`, one
// of the kReduce* codes); op 0 sum, 1 max, 2 min, 3 prod; divide: the result is divided by nsrc (avg).
// False (nothing launched) for a dtype, op or source count it has no kernel for.
inline constexpr int kMaxReduceSources = 16;
inline constexpr int kReduceFloat32 = 0, kReduceFloat64 = 1, kReduceInt32 = 4, kReduceInt64 = 5;
bool reduce_sources(void* dst, const void* const* srcs, int nsrc, size_t n, int dtype, int op, int divide,
                    cudaStream_t s);

void fill_bias_rows(float* out, const float* bias, int N, int OC, cudaStream_t s);
// partial[k][c] = sum of x[r][c] over rows r of chunk k (x has N rows of C).
void column_sums_partial(float* partial, const float* x, int N, int C, cudaStream_t s);
// acc[c] += sum_k partial[k][c] in order k = 0, 1, ...
void column_sums_finish(float* acc, const float* partial, int chunks, int C, cudaStream_t s);

void gelu_forward(float* out, const float* inp, size_t n, int tanh_kind, cudaStream_t s);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, int tanh_kind, cudaStream_t s);
void gelu_forward_and_grad(float* out, float* grad, const float* inp, size_t n, int tanh_kind, cudaStream_t s);
void add(float* out, const float* a, const float* b, size_t n, cudaStream_t s);
void add_inplace(float* acc, const float* x, size_t n, cudaStream_t s);
void mul(float* out, const float* a, const float* b, size_t n, cudaStream_t s);
void scale(float* x, float a, size_t n, cudaStream_t s);
void copy(float* dst, const float* src, size_t n, cudaStream_t s);
void to_bf16(uint16_t* out, const float* in, size_t n, cudaStream_t s);
void from_bf16(float* out, const uint16_t* in, size_t n, cudaStream_t s);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C, float eps, cudaStream_t s);
void layernorm_backward_dinp(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                             const float* rstd, int N, int C, cudaStream_t s);
// partial_w[k][c] = sum over chunk k of norm*g; partial_b (nullable) likewise of g.
void layernorm_backward_params_partial(float* partial_w, float* partial_b, const float* dout, const float* inp,
                                       const float* mean, const float* rstd, int N, int C, cudaStream_t s);
void softmax_forward(float* out, const float* inp, int N, int C, cudaStream_t s);

// Returns false when T needs more shared memory than the device allows.
bool attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, cudaStream_t s);
// dscratch: B*NH*T floats (D_i = dO_i . O_i).
bool attention_backward(float* dqkv, float* dscratch, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t s);

// dbuf[b, h, t] = dO . O over head h's columns of row (b, t) (the backward's D).
void attention_row_dots(float* dbuf, const float* dout, const float* out, int B, int T, int C, int NH,
                        cudaStream_t s);
// Tensor-core (bfloat16 operand) kernels, attention_bf16.cu: head dims 32, 64 and 128 only.
bool attention_bf16_supported(int C, int NH);
// qkv16 and dout16 are the bf16 roundings of qkv and dout (same layouts); outputs float32. Return false
// when the device lacks the shared memory (or the head dim is not supported).
bool attention_forward_bf16(float* out, float* lse, const uint16_t* qkv16, int B, int T, int C, int NH,
                            cudaStream_t s);
// dbuf from attention_row_dots.
bool attention_backward_bf16(float* dqkv, const float* dbuf, const uint16_t* dout16, const uint16_t* qkv16,
                             const float* lse, int B, int T, int C, int NH, cudaStream_t s);

// *bad is set to 1 + the first bad position seen (any) when a token is outside [0, V).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V, int* bad, cudaStream_t s);
void embedding_backward_wte(float* dwte, const float* dout, const int32_t* tokens, int N, int C, cudaStream_t s);
void embedding_backward_wpe(float* dwpe, const float* dout, int B, int T, int C, cudaStream_t s);

// bad nullable (targets then unchecked; a bad row gets loss 0 and no gradient). one_pass: the maximum and the
// sum of exponentials from one read of the logits (online softmax), else a pass for each.
void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                   float dscale, int* bad, bool one_pass, cudaStream_t s);

void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
           float eps, float decay, float bc1, float bc2_sqrt_inv, cudaStream_t s);

// partial[kSumSquaresBlocks]; then out[0] = sum of partial (fixed order).
void sum_squares_partial(double* partial, const float* x, size_t n, cudaStream_t s);
void sum_squares_finish(double* out, const double* partial, cudaStream_t s);

}  // namespace trident::cuda::launch
