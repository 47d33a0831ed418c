// Internal: launchers of the Llama family's kernels (llama_kernels.cu: RMSNorm, rotary embeddings, SwiGLU,
// grouped-query key/value expansion and reduction), called by ops.cc, which validates arguments, owns scratch
// and checks errors. Free of trident/core headers (nvcc compiles only kernels). Every launcher is asynchronous
// on `s` and checks nothing itself; the CPU reference is kernels/cpu/llama.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace trident::cuda::launch {

// One warp per row; rstd nullable.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps,
                     cudaStream_t s);
// dinp += d inp, one warp per row.
void rmsnorm_backward_dinp(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd, int N,
                           int C, cudaStream_t s);
// partial_w[k][c] = sum over chunk k (kColumnChunkRows rows, in order) of dout * inp * rstd; column_sums_finish
// (launch.h) adds the chunks in order.
void rmsnorm_backward_weight_partial(float* partial_w, const float* dout, const float* inp, const float* rstd, int N,
                                     int C, cudaStream_t s);
void rope(float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd, bool inverse,
          cudaStream_t s);
void swiglu_forward(float* out, const float* h, int N, int I, cudaStream_t s);
void swiglu_backward(float* dh, const float* dout, const float* h, int N, int I, cudaStream_t s);
void kv_expand(float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group, int kv0,
               cudaStream_t s);
void kv_reduce(float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group, int kv0,
               cudaStream_t s);

}  // namespace trident::cuda::launch
