// Internal: launchers of the tensor-parallel layers' kernels (tp_kernels.cu), called by device_ops.cc's
// CUDA op table, which checks errors and reads back flags. Free of trident/core headers (nvcc compiles
// only kernels). Every launcher is asynchronous on `s` and checks nothing itself.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace trident::cuda::launch {

// out[r*ldo + c] = a[r*lda + c] + b[r*ldb + c] (ldb 0: one row of b broadcast).
void fill_2d(float* dst, size_t ldd, float value, size_t rows, size_t cols, cudaStream_t s);
void add_2d(float* out, size_t ldo, const float* a, size_t lda, const float* b, size_t ldb, size_t rows, size_t cols,
            cudaStream_t s);
// *bad = 1 + a position whose token is outside [0, V) (any one).
void embedding_shard_forward(float* out, const int32_t* tokens, const float* wte_shard, int64_t v0, int64_t vl,
                             int64_t V, int N, int C, int* bad, cudaStream_t s);
void embedding_shard_backward(float* dwte_shard, const float* dout, const int32_t* tokens, int64_t v0, int64_t vl,
                              int N, int C, cudaStream_t s);
// *bad = 1 + a row whose target is outside [0, V).
void ce_shard_max(float* mx, const float* logits, const int32_t* targets, int N, int64_t vl, int64_t V, int* bad,
                  cudaStream_t s);
void ce_shard_sumexp(float* st, float* dlogits, const float* logits, const float* mx, const int32_t* targets, int N,
                     int64_t vl, int64_t v0, cudaStream_t s);
// losses[N] (double) per row; dlogits nullable.
void ce_shard_finish(double* losses, float* dlogits, const float* st, const float* mx, const int32_t* targets, int N,
                     int64_t vl, int64_t v0, float dscale, cudaStream_t s);

}  // namespace trident::cuda::launch
