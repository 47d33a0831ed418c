// Kernels of the tensor-parallel layers' op-table entries (kernels/device.h: add_2d, the vocab-parallel
// embedding and cross-entropy passes); the CPU reference is kernels/device.cc.
#include <cuda_runtime.h>

#include <cmath>

#include "trident/cuda/common.cuh"
#include "trident/cuda/tp_launch.h"

namespace trident::cuda::launch {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::grid_for;

constexpr int kThreads = 256;

__global__ void add_2d_k(float* out, size_t ldo, const float* a, size_t lda, const float* b, size_t ldb, size_t rows,
                         size_t cols) {
  const size_t n = rows * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / cols, c = i % cols;
    out[r * ldo + c] = a[r * lda + c] + b[r * ldb + c];
  }
}

__global__ void fill_2d_k(float* dst, size_t ldd, float value, size_t rows, size_t cols) {
  const size_t n = rows * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[(i / cols) * ldd + i % cols] = value;
}

__global__ void emb_shard_fwd_k(float* out, const int32_t* tokens, const float* wte, int64_t v0, int64_t vl,
                                int64_t V, int N, int C, int* bad) {
  const size_t n = size_t(N) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / C, c = i % C;
    const int64_t tok = tokens[row];
    if (tok < 0 || tok >= V) {
      if (c == 0) atomicCAS(bad, 0, static_cast<int>(row) + 1);
      out[i] = 0.0f;
      continue;
    }
    out[i] = (tok >= v0 && tok < v0 + vl) ? wte[size_t(tok - v0) * C + c] : 0.0f;
  }
}

__global__ void emb_shard_bwd_k(float* dwte, const float* dout, const int32_t* tokens, int64_t v0, int64_t vl, int N,
                                int C) {
  const size_t n = size_t(N) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / C, c = i % C;
    const int64_t tok = tokens[row];
    if (tok >= v0 && tok < v0 + vl) atomicAdd(dwte + size_t(tok - v0) * C + c, dout[i]);
  }
}

// One block per row.
__global__ void ce_max_k(float* mx, const float* logits, const int32_t* targets, int64_t vl, int64_t V, int* bad) {
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const float* x = logits + size_t(row) * vl;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_max(m, scratch);
  if (threadIdx.x == 0) {
    mx[row] = m;
    const int32_t t = targets[row];
    if (t < 0 || t >= V) atomicCAS(bad, 0, row + 1);
  }
}

__global__ void ce_sumexp_k(float* st, float* dlogits, const float* logits, const float* mx, const int32_t* targets,
                            int N, int64_t vl, int64_t v0) {
  __shared__ double scratch[32];
  const int row = blockIdx.x;
  const float* x = logits + size_t(row) * vl;
  const int64_t t = targets[row] - v0;
  // The target's logit is read before dlogits (which may alias the logits) is written.
  if (threadIdx.x == 0) st[N + row] = (t >= 0 && t < vl) ? x[t] : 0.0f;
  __syncthreads();
  const float m = mx[row];
  float* ex = dlogits != nullptr ? dlogits + size_t(row) * vl : nullptr;
  double s = 0;
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) {
    const float v = expf(x[j] - m);
    if (ex != nullptr) ex[j] = v;
    s += v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) st[row] = static_cast<float>(s);
}

__global__ void ce_finish_k(double* losses, float* dlogits, const float* st, const float* mx, const int32_t* targets,
                            int N, int64_t vl, int64_t v0, float dscale) {
  const int row = blockIdx.x;
  const int64_t t = targets[row] - v0;
  if (threadIdx.x == 0) losses[row] = log(static_cast<double>(st[row])) + mx[row] - st[N + row];
  if (dlogits == nullptr) return;
  float* d = dlogits + size_t(row) * vl;
  const float k = static_cast<float>(dscale / static_cast<double>(st[row]));
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) d[j] = d[j] * k - (j == t ? dscale : 0.0f);
}

}  // namespace

void fill_2d(float* dst, size_t ldd, float value, size_t rows, size_t cols, cudaStream_t s) {
  if (rows * cols == 0) return;
  fill_2d_k<<<grid_for(rows * cols, kThreads), kThreads, 0, s>>>(dst, ldd, value, rows, cols);
}
void add_2d(float* out, size_t ldo, const float* a, size_t lda, const float* b, size_t ldb, size_t rows, size_t cols,
            cudaStream_t s) {
  if (rows * cols == 0) return;
  add_2d_k<<<grid_for(rows * cols, kThreads), kThreads, 0, s>>>(out, ldo, a, lda, b, ldb, rows, cols);
}
void embedding_shard_forward(float* out, const int32_t* tokens, const float* wte_shard, int64_t v0, int64_t vl,
                             int64_t V, int N, int C, int* bad, cudaStream_t s) {
  emb_shard_fwd_k<<<grid_for(size_t(N) * C, kThreads), kThreads, 0, s>>>(out, tokens, wte_shard, v0, vl, V, N, C, bad);
}
void embedding_shard_backward(float* dwte_shard, const float* dout, const int32_t* tokens, int64_t v0, int64_t vl,
                              int N, int C, cudaStream_t s) {
  emb_shard_bwd_k<<<grid_for(size_t(N) * C, kThreads), kThreads, 0, s>>>(dwte_shard, dout, tokens, v0, vl, N, C);
}
void ce_shard_max(float* mx, const float* logits, const int32_t* targets, int N, int64_t vl, int64_t V, int* bad,
                  cudaStream_t s) {
  if (N > 0) ce_max_k<<<N, kThreads, 0, s>>>(mx, logits, targets, vl, V, bad);
}
void ce_shard_sumexp(float* st, float* dlogits, const float* logits, const float* mx, const int32_t* targets, int N,
                     int64_t vl, int64_t v0, cudaStream_t s) {
  if (N > 0) ce_sumexp_k<<<N, kThreads, 0, s>>>(st, dlogits, logits, mx, targets, N, vl, v0);
}
void ce_shard_finish(double* losses, float* dlogits, const float* st, const float* mx, const int32_t* targets, int N,
                     int64_t vl, int64_t v0, float dscale, cudaStream_t s) {
  if (N > 0) ce_finish_k<<<N, kThreads, 0, s>>>(losses, dlogits, st, mx, targets, N, vl, v0, dscale);
}

}  // namespace trident::cuda::launch
