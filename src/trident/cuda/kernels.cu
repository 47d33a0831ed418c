// Elementwise, row-wise and reduction kernels of the CUDA layer (launchers declared in launch.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "trident/cuda/common.cuh"
#include "trident/cuda/launch.h"

namespace trident::cuda::launch {

using detail::block_max;
using detail::block_sum;
using detail::grid_for;
using detail::warp_sum;

namespace {

constexpr int kThreads = 256;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;

#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

__global__ void fill_bias_rows_k(float* out, const float* bias, int N, int OC) {
  const size_t n = size_t(N) * OC;
  GRID_STRIDE(i, n) out[i] = bias[i % OC];
}

__global__ void column_sums_partial_k(float* partial, const float* x, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int k = blockIdx.y;
  if (c >= C) return;
  const int r0 = k * kColumnChunkRows, r1 = min(N, r0 + kColumnChunkRows);
  float s = 0.0f;
  for (int r = r0; r < r1; ++r) s += x[size_t(r) * C + c];
  partial[size_t(k) * C + c] = s;
}

__global__ void column_sums_finish_k(float* acc, const float* partial, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int k = 0; k < chunks; ++k) s += partial[size_t(k) * C + c];
  acc[c] += s;
}

__global__ void gelu_fwd_k(float* out, const float* inp, size_t n, int tanh_kind) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    if (tanh_kind) {
      const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
      out[i] = 0.5f * x * (1.0f + tanhf(u));
    } else {
      out[i] = 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    }
  }
}

// gelu'(x), the derivative of either form.
__device__ __forceinline__ float gelu_grad(float x, int tanh_kind) {
  if (tanh_kind) {
    const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
  }
  const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
  return cdf + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}

__global__ void gelu_bwd_k(float* dinp, const float* inp, const float* dout, size_t n, int tanh_kind) {
  GRID_STRIDE(i, n) dinp[i] = dout[i] * gelu_grad(inp[i], tanh_kind);
}

// out = gelu(x), grad = gelu'(x); grad may alias inp (each element read before it is written).
__global__ void gelu_fwd_grad_k(float* out, float* grad, const float* inp, size_t n, int tanh_kind) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float y = tanh_kind ? 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)))
                              : 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    grad[i] = gelu_grad(x, tanh_kind);
    out[i] = y;
  }
}

__global__ void add_k(float* out, const float* a, const float* b, size_t n) { GRID_STRIDE(i, n) out[i] = a[i] + b[i]; }
__global__ void add_inplace_k(float* acc, const float* x, size_t n) { GRID_STRIDE(i, n) acc[i] += x[i]; }
__global__ void mul_k(float* out, const float* a, const float* b, size_t n) { GRID_STRIDE(i, n) out[i] = a[i] * b[i]; }
__global__ void scale_k(float* x, float a, size_t n) { GRID_STRIDE(i, n) x[i] *= a; }

__global__ void copy4_k(float4* __restrict__ dst, const float4* __restrict__ src, size_t n4) {
  GRID_STRIDE(i, n4) dst[i] = src[i];
}
__global__ void copy_k(float* __restrict__ dst, const float* __restrict__ src, size_t n) { GRID_STRIDE(i, n) dst[i] = src[i]; }

__device__ inline uint16_t f2bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__global__ void to_bf16_k(uint16_t* out, const float* in, size_t n) { GRID_STRIDE(i, n) out[i] = f2bf(in[i]); }
__global__ void from_bf16_k(float* out, const uint16_t* in, size_t n) {
  GRID_STRIDE(i, n) out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}

// One warp per row; kRowsPerBlock rows per block.
constexpr int kRowsPerBlock = kThreads / 32;

__global__ void layernorm_fwd_k(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + size_t(row) * C;
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += x[i];
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float d = x[i] - m;
    v += d * d;
  }
  const float rs = rsqrtf(warp_sum(v) / C + eps);
  float* o = out + size_t(row) * C;
  for (int i = lane; i < C; i += 32) o[i] = (x[i] - m) * rs * w[i] + (b ? b[i] : 0.0f);
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

__global__ void layernorm_bwd_dinp_k(float* dinp, const float* dout, const float* inp, const float* w,
                                     const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + size_t(row) * C;
  const float* g = dout + size_t(row) * C;
  float* dx = dinp + size_t(row) * C;
  const float m = mean[row], rs = rstd[row];
  float s1 = 0.0f, s2 = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float norm = (x[i] - m) * rs;
    const float dn = w[i] * g[i];
    s1 += dn;
    s2 += dn * norm;
  }
  s1 = warp_sum(s1) / C;
  s2 = warp_sum(s2) / C;
  for (int i = lane; i < C; i += 32) {
    const float norm = (x[i] - m) * rs;
    dx[i] += (w[i] * g[i] - s1 - norm * s2) * rs;
  }
}

__global__ void layernorm_bwd_params_k(float* partial_w, float* partial_b, const float* dout, const float* inp,
                                       const float* mean, const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int k = blockIdx.y;
  if (c >= C) return;
  const int r0 = k * kColumnChunkRows, r1 = min(N, r0 + kColumnChunkRows);
  float sw = 0.0f, sb = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const float g = dout[size_t(r) * C + c];
    sw += (inp[size_t(r) * C + c] - mean[r]) * rstd[r] * g;
    sb += g;
  }
  partial_w[size_t(k) * C + c] = sw;
  if (partial_b) partial_b[size_t(k) * C + c] = sb;
}

__global__ void softmax_fwd_k(float* out, const float* inp, int N, int C) {
  __shared__ float scratch[32];
  const float* x = inp + size_t(blockIdx.x) * C;
  float* o = out + size_t(blockIdx.x) * C;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < C; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx, scratch);
  float s = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float e = expf(x[i] - mx);
    o[i] = e;
    s += e;
  }
  s = block_sum(s, scratch);
  const float inv = 1.0f / s;
  for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] *= inv;
}

__global__ void embedding_fwd_k(float* out, const int32_t* tokens, const float* wte, const float* wpe, int T, int C,
                                int V, size_t n, int* bad) {
  GRID_STRIDE(i, n) {
    const size_t row = i / C;
    const int c = static_cast<int>(i % C);
    const int tok = tokens[row];
    if (tok < 0 || tok >= V) {
      atomicCAS(bad, 0, static_cast<int>(row) + 1);
      out[i] = 0.0f;
      continue;
    }
    const int t = static_cast<int>(row % T);
    out[i] = wte[size_t(tok) * C + c] + (wpe ? wpe[size_t(t) * C + c] : 0.0f);
  }
}

__global__ void embedding_bwd_wte_k(float* dwte, const float* dout, const int32_t* tokens, int C, size_t n) {
  GRID_STRIDE(i, n) {
    const size_t row = i / C;
    atomicAdd(dwte + size_t(tokens[row]) * C + (i % C), dout[i]);
  }
}

__global__ void embedding_bwd_wpe_k(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t n = size_t(T) * C;
  GRID_STRIDE(i, n) {
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += dout[size_t(b) * n + i];  // positions t of every batch row, in order
    dwpe[i] += s;
  }
}

// The running maximum of a row and the sum of exp(x - max) over what has been seen: one read of the row gives
// both (the sum is rescaled whenever the maximum grows). -inf entries (padded vocabulary ids) add nothing.
struct MaxSum {
  float m, s;
};
__device__ inline void max_sum_add(MaxSum& a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;  // a.m = -inf: expf(-inf) = 0
    a.m = x;
  } else if (x != -INFINITY) {
    a.s += expf(x - a.m);
  }
}
__device__ inline MaxSum max_sum_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
// Over the block; every thread gets the result. Ends with a barrier.
__device__ inline MaxSum block_max_sum(MaxSum v, float* sm, float* ss) {
  for (int o = 16; o > 0; o >>= 1)
    v = max_sum_merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) {
    sm[warp] = v.m;
    ss[warp] = v.s;
  }
  __syncthreads();
  MaxSum r = lane < nwarps ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.0f};
  for (int o = 16; o > 0; o >>= 1)
    r = max_sum_merge(r, {__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)});
  __syncthreads();
  return r;
}

// A row whose target is outside [0, V): flagged (the first such row + 1 in *bad), loss 0, no gradient.
__device__ inline bool target_outside(int y, int V, int row, float* losses, int* bad) {
  if (y >= 0 && y < V) return false;
  if (threadIdx.x == 0) {
    if (bad) atomicCAS(bad, 0, row + 1);
    if (losses) losses[row] = 0.0f;
  }
  return true;
}

// Separate passes over the logits for the maximum, the sum of exponentials and the gradient.
__global__ void cross_entropy_k(float* losses, float* dlogits, const float* logits, const int32_t* targets, int V,
                                float dscale, int* bad) {
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const float* x = logits + size_t(row) * V;
  const int y = targets[row];
  if (target_outside(y, V, row, losses, bad)) return;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx, scratch);
  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(x[i] - mx);
  s = block_sum(s, scratch);  // ends with a barrier: every thread has read what it needs of x except x[y]
  const float xy = x[y];
  __syncthreads();  // x[y] is read by all before dlogits (which may alias logits) is written
  if (threadIdx.x == 0 && losses) losses[row] = mx + logf(s) - xy;
  if (dlogits) {
    float* d = dlogits + size_t(row) * V;
    const float inv = dscale / s;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float p = expf(x[i] - mx) * inv;
      d[i] = i == y ? p - dscale : p;
    }
  }
}

// One block per row: the maximum and the sum of exponentials in one pass over the logits, then the gradient
// (softmax - one-hot) x dscale written in a second (it may overwrite the logits); 16-byte loads and stores
// where the rows allow them (V a multiple of 4, 16-byte aligned buffers).
__global__ void cross_entropy_one_pass_k(float* losses, float* dlogits, const float* logits, const int32_t* targets, int V,
                                float dscale, int* bad) {
  __shared__ float sm[32], ss[32];
  const int row = blockIdx.x;
  const float* x = logits + size_t(row) * V;
  float* d = dlogits ? dlogits + size_t(row) * V : nullptr;
  const int y = targets[row];
  if (target_outside(y, V, row, losses, bad)) return;
  const float xy = x[y];  // read by every thread before the first barrier, so before any write to d
  const bool vec = (V & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(d) & 15) == 0;
  MaxSum a{-INFINITY, 0.0f};
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 v = x4[i];
      max_sum_add(a, v.x);
      max_sum_add(a, v.y);
      max_sum_add(a, v.z);
      max_sum_add(a, v.w);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) max_sum_add(a, x[i]);
  }
  a = block_max_sum(a, sm, ss);
  const float mx = a.m, s = a.s;
  if (threadIdx.x == 0 && losses) losses[row] = mx + logf(s) - xy;
  if (!d) return;
  const float inv = dscale / s;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* d4 = reinterpret_cast<float4*>(d);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 v = x4[i];
      float4 p{expf(v.x - mx) * inv, expf(v.y - mx) * inv, expf(v.z - mx) * inv, expf(v.w - mx) * inv};
      if (i == y / 4) {
        const int k = y % 4;
        if (k == 0) p.x -= dscale;
        if (k == 1) p.y -= dscale;
        if (k == 2) p.z -= dscale;
        if (k == 3) p.w -= dscale;
      }
      d4[i] = p;
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float p = expf(x[i] - mx) * inv;
      d[i] = i == y ? p - dscale : p;
    }
  }
}

__global__ void adamw_k(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                        float* __restrict__ v, size_t n, float lr, float beta1, float beta2, float eps, float decay,
                        float bc1, float bc2_sqrt_inv) {
  const float step_size = lr / bc1;
  GRID_STRIDE(i, n) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * bc2_sqrt_inv + eps;
    param[i] = param[i] * decay - step_size * mi / denom;
  }
}

__global__ void sum_squares_partial_k(double* partial, const float* x, size_t n) {
  __shared__ double scratch[32];
  double s = 0.0;
  GRID_STRIDE(i, n) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_finish_k(double* out, const double* partial) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < kSumSquaresBlocks; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[0] = s;
}

}  // namespace

void fill_bias_rows(float* out, const float* bias, int N, int OC, cudaStream_t s) {
  fill_bias_rows_k<<<grid_for(size_t(N) * OC, kThreads), kThreads, 0, s>>>(out, bias, N, OC);
}
void column_sums_partial(float* partial, const float* x, int N, int C, cudaStream_t s) {
  dim3 grid((C + kThreads - 1) / kThreads, column_chunks(N));
  column_sums_partial_k<<<grid, kThreads, 0, s>>>(partial, x, N, C);
}
void column_sums_finish(float* acc, const float* partial, int chunks, int C, cudaStream_t s) {
  column_sums_finish_k<<<(C + kThreads - 1) / kThreads, kThreads, 0, s>>>(acc, partial, chunks, C);
}
void gelu_forward(float* out, const float* inp, size_t n, int tanh_kind, cudaStream_t s) {
  gelu_fwd_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, inp, n, tanh_kind);
}
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, int tanh_kind, cudaStream_t s) {
  gelu_bwd_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, inp, dout, n, tanh_kind);
}
void gelu_forward_and_grad(float* out, float* grad, const float* inp, size_t n, int tanh_kind, cudaStream_t s) {
  gelu_fwd_grad_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, grad, inp, n, tanh_kind);
}
void add(float* out, const float* a, const float* b, size_t n, cudaStream_t s) {
  add_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, a, b, n);
}
void add_inplace(float* acc, const float* x, size_t n, cudaStream_t s) {
  add_inplace_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(acc, x, n);
}
void mul(float* out, const float* a, const float* b, size_t n, cudaStream_t s) {
  mul_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, a, b, n);
}
void scale(float* x, float a, size_t n, cudaStream_t s) { scale_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, a, n); }
void copy(float* dst, const float* src, size_t n, cudaStream_t s) {
  const bool aligned = (reinterpret_cast<uintptr_t>(dst) % 16 == 0) && (reinterpret_cast<uintptr_t>(src) % 16 == 0);
  if (aligned && n % 4 == 0) {
    // A grid of a few waves of resident blocks, each thread striding over float4s.
    copy4_k<<<grid_for(n / 4, kThreads, 132 * 8), kThreads, 0, s>>>(reinterpret_cast<float4*>(dst),
                                                                   reinterpret_cast<const float4*>(src), n / 4);
  } else {
    copy_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dst, src, n);
  }
}
void to_bf16(uint16_t* out, const float* in, size_t n, cudaStream_t s) {
  to_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, in, n);
}
void from_bf16(float* out, const uint16_t* in, size_t n, cudaStream_t s) {
  from_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, in, n);
}
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C, float eps, cudaStream_t s) {
  layernorm_fwd_k<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(out, mean, rstd, inp, w, b, N, C, eps);
}
void layernorm_backward_dinp(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                             const float* rstd, int N, int C, cudaStream_t s) {
  layernorm_bwd_dinp_k<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(dinp, dout, inp, w, mean, rstd,
                                                                                    N, C);
}
void layernorm_backward_params_partial(float* partial_w, float* partial_b, const float* dout, const float* inp,
                                       const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
  dim3 grid((C + kThreads - 1) / kThreads, column_chunks(N));
  layernorm_bwd_params_k<<<grid, kThreads, 0, s>>>(partial_w, partial_b, dout, inp, mean, rstd, N, C);
}
void softmax_forward(float* out, const float* inp, int N, int C, cudaStream_t s) {
  softmax_fwd_k<<<N, kThreads, 0, s>>>(out, inp, N, C);
}
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V, int* bad, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  embedding_fwd_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, tokens, wte, wpe, T, C, V, n, bad);
}
void embedding_backward_wte(float* dwte, const float* dout, const int32_t* tokens, int N, int C, cudaStream_t s) {
  const size_t n = size_t(N) * C;
  embedding_bwd_wte_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dwte, dout, tokens, C, n);
}
void embedding_backward_wpe(float* dwpe, const float* dout, int B, int T, int C, cudaStream_t s) {
  embedding_bwd_wpe_k<<<grid_for(size_t(T) * C, kThreads), kThreads, 0, s>>>(dwpe, dout, B, T, C);
}
void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                   float dscale, int* bad, bool one_pass, cudaStream_t s) {
  if (one_pass) cross_entropy_one_pass_k<<<N, 512, 0, s>>>(losses, dlogits, logits, targets, V, dscale, bad);
  else cross_entropy_k<<<N, 512, 0, s>>>(losses, dlogits, logits, targets, V, dscale, bad);
}
void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
           float eps, float decay, float bc1, float bc2_sqrt_inv, cudaStream_t s) {
  adamw_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(param, grad, m, v, n, lr, beta1, beta2, eps, decay, bc1,
                                                     bc2_sqrt_inv);
}
void sum_squares_partial(double* partial, const float* x, size_t n, cudaStream_t s) {
  sum_squares_partial_k<<<kSumSquaresBlocks, kThreads, 0, s>>>(partial, x, n);
}
void sum_squares_finish(double* out, const double* partial, cudaStream_t s) {
  sum_squares_finish_k<<<1, 1024, 0, s>>>(out, partial);
}

}  // namespace trident::cuda::launch
