// Kernels of the Llama family's op-table entries (launchers in llama_launch.h): RMSNorm, rotary position
// embeddings, SwiGLU, and grouped-query attention's key/value expansion and its adjoint. The CPU reference is
// kernels/cpu/llama.cc. No atomics: every sum runs in a fixed order, so results repeat run to run.
#include <cuda_runtime.h>

#include <cstdint>

#include "trident/cuda/common.cuh"
#include "trident/cuda/launch.h"
#include "trident/cuda/llama_launch.h"

namespace trident::cuda::launch {
namespace {

using detail::grid_for;
using detail::warp_sum;

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row

#define LLAMA_GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

__global__ void rmsnorm_fwd_k(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + size_t(row) * C;
  float ss = 0.0f;
  for (int i = lane; i < C; i += 32) ss += x[i] * x[i];
  const float rs = rsqrtf(warp_sum(ss) / C + eps);
  float* o = out + size_t(row) * C;
  for (int i = lane; i < C; i += 32) o[i] = x[i] * rs * w[i];
  if (lane == 0 && rstd) rstd[row] = rs;
}

// dx += rs (w g - x rs mean_c(w g x rs)).
__global__ void rmsnorm_bwd_dinp_k(float* dinp, const float* dout, const float* inp, const float* w,
                                   const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + size_t(row) * C;
  const float* g = dout + size_t(row) * C;
  float* dx = dinp + size_t(row) * C;
  const float rs = rstd[row];
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += w[i] * g[i] * (x[i] * rs);
  const float m = warp_sum(s) / C;
  for (int i = lane; i < C; i += 32) dx[i] += (w[i] * g[i] - x[i] * rs * m) * rs;
}

__global__ void rmsnorm_bwd_weight_k(float* partial_w, const float* dout, const float* inp, const float* rstd, int N,
                                     int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int k = blockIdx.y;
  if (c >= C) return;
  const int r0 = k * kColumnChunkRows, r1 = min(N, r0 + kColumnChunkRows);
  float sw = 0.0f;
  for (int r = r0; r < r1; ++r) sw += inp[size_t(r) * C + c] * rstd[r] * dout[size_t(r) * C + c];
  partial_w[size_t(k) * C + c] = sw;
}

// One thread per (row, head, i < hd/2) pair.
__global__ void rope_k(float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd,
                       bool inverse) {
  const int half = hd / 2;
  const size_t n = size_t(N) * n_heads * half;
  LLAMA_GRID_STRIDE(e, n) {
    const int i = static_cast<int>(e % half);
    const size_t rh = e / half;
    const int h = static_cast<int>(rh % n_heads);
    const size_t r = rh / n_heads;
    const int p = static_cast<int>(r % T);
    const float c = cos[size_t(p) * half + i];
    const float sn = inverse ? -sin[size_t(p) * half + i] : sin[size_t(p) * half + i];
    float* lo = x + r * stride + size_t(h) * hd + i;
    const float a = lo[0], b = lo[half];
    lo[0] = a * c - b * sn;
    lo[half] = b * c + a * sn;
  }
}

__device__ inline float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void swiglu_fwd_k(float* out, const float* h, int N, int I) {
  const size_t n = size_t(N) * I;
  LLAMA_GRID_STRIDE(e, n) {
    const size_t r = e / I, i = e % I;
    const float g = h[r * 2 * I + i], u = h[r * 2 * I + I + i];
    out[e] = g * sigmoid(g) * u;
  }
}

__global__ void swiglu_bwd_k(float* dh, const float* dout, const float* h, int N, int I) {
  const size_t n = size_t(N) * I;
  LLAMA_GRID_STRIDE(e, n) {
    const size_t r = e / I, i = e % I;
    const float g = h[r * 2 * I + i], u = h[r * 2 * I + I + i], d = dout[e];
    const float sig = sigmoid(g);
    dh[r * 2 * I + i] = d * u * sig * (1.0f + g * (1.0f - sig));
    dh[r * 2 * I + I + i] = d * (g * sig);
  }
}

// One thread per dst element: q copied, k and v of q head j from kv head (h0 + j) / group - kv0.
__global__ void kv_expand_k(float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group,
                            int kv0) {
  const size_t q = size_t(nh) * hd, kv = size_t(nkv) * hd, ls = q + 2 * kv, ld = 3 * q;
  const size_t n = size_t(N) * ld;
  LLAMA_GRID_STRIDE(e, n) {
    const size_t r = e / ld, c = e % ld;
    const float* s = src + r * ls;
    float v;
    if (c < q) {
      v = s[c];
    } else {
      const size_t part = c / q, cc = c % q;  // part 1: k, 2: v
      const int j = static_cast<int>(cc / hd), d = static_cast<int>(cc % hd);
      const size_t m = size_t((h0 + j) / group - kv0);
      v = s[q + (part - 1) * kv + m * hd + d];
    }
    dst[e] = v;
  }
}

// One thread per dsrc element: dq copied; d k (d v) of kv head m sums the q heads j that read it, ascending.
__global__ void kv_reduce_k(float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group,
                            int kv0) {
  const size_t q = size_t(nh) * hd, kv = size_t(nkv) * hd, ls = q + 2 * kv, ld = 3 * q;
  const size_t n = size_t(N) * ls;
  LLAMA_GRID_STRIDE(e, n) {
    const size_t r = e / ls, c = e % ls;
    const float* d = ddst + r * ld;
    float v;
    if (c < q) {
      v = d[c];
    } else {
      const size_t part = (c - q) / kv, cc = (c - q) % kv;  // part 0: k, 1: v
      const int m = static_cast<int>(cc / hd), dd = static_cast<int>(cc % hd);
      // The q heads j with (h0 + j) / group == m + kv0 form [lo, hi).
      const int lo = max(0, (m + kv0) * group - h0), hi = min(nh, (m + kv0 + 1) * group - h0);
      v = 0.0f;
      for (int j = lo; j < hi; ++j) v += d[(part + 1) * q + size_t(j) * hd + dd];
    }
    dsrc[e] = v;
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps,
                     cudaStream_t s) {
  rmsnorm_fwd_k<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(out, rstd, inp, w, N, C, eps);
}
void rmsnorm_backward_dinp(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd, int N,
                           int C, cudaStream_t s) {
  rmsnorm_bwd_dinp_k<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(dinp, dout, inp, w, rstd, N, C);
}
void rmsnorm_backward_weight_partial(float* partial_w, const float* dout, const float* inp, const float* rstd, int N,
                                     int C, cudaStream_t s) {
  dim3 grid((C + kThreads - 1) / kThreads, column_chunks(N));
  rmsnorm_bwd_weight_k<<<grid, kThreads, 0, s>>>(partial_w, dout, inp, rstd, N, C);
}
void rope(float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd, bool inverse,
          cudaStream_t s) {
  const size_t n = size_t(N) * n_heads * (hd / 2);
  rope_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, cos, sin, N, T, stride, n_heads, hd, inverse);
}
void swiglu_forward(float* out, const float* h, int N, int I, cudaStream_t s) {
  swiglu_fwd_k<<<grid_for(size_t(N) * I, kThreads), kThreads, 0, s>>>(out, h, N, I);
}
void swiglu_backward(float* dh, const float* dout, const float* h, int N, int I, cudaStream_t s) {
  swiglu_bwd_k<<<grid_for(size_t(N) * I, kThreads), kThreads, 0, s>>>(dh, dout, h, N, I);
}
void kv_expand(float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group, int kv0,
               cudaStream_t s) {
  const size_t n = size_t(N) * 3 * nh * hd;
  kv_expand_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dst, src, N, nh, nkv, hd, h0, group, kv0);
}
void kv_reduce(float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group, int kv0,
               cudaStream_t s) {
  const size_t n = size_t(N) * (nh + 2 * size_t(nkv)) * hd;
  kv_reduce_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dsrc, ddst, N, nh, nkv, hd, h0, group, kv0);
}

}  // namespace trident::cuda::launch
