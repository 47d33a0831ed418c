// Causal multi-head self-attention on the GPU, correctness first (see ops.h).
// Forward: one block per (b, h, query i): scores of row i in shared memory, block max/sum, then
// out_i = sum_j p_ij v_j and lse_i. Backward (FlashAttention's recomputation from lse):
//   kernel A, one block per (b, h, query i): D_i = dO_i . O_i, ds_ij = p_ij (dO_i . v_j - D_i) scale,
//            dq_i = sum_j ds_ij k_j;
//   kernel B, one block per (b, h, key j):   dk_j = sum_{i>=j} ds_ij q_i, dv_j = sum_{i>=j} p_ij dO_i.
// No atomics: every output element is written by one thread, in a fixed order of summation.
// Head dims up to 128 take the warp-cooperative kernels below (lanes over head dims, one warp reduction
// per score, online softmax per warp); larger heads take the simple shared-memory kernels.
#include <cuda_runtime.h>

#include "trident/cuda/common.cuh"
#include "trident/cuda/launch.h"

namespace trident::cuda::launch {

using detail::block_max;
using detail::block_sum;

namespace {

constexpr int kThreads = 128;

// Shared layout: vec[2*hd] | rows[nrows * T] | scratch[32].
__global__ void attn_fwd_k(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale) {
  extern __shared__ float sh[];
  const int hd = C / NH;
  const int i = blockIdx.x % T;
  const int h = (blockIdx.x / T) % NH;
  const int b = blockIdx.x / (T * NH);
  float* q = sh;
  float* s = sh + 2 * hd;
  float* scratch = s + T;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;  // q at +0, k at +C, v at +2C
  for (int d = threadIdx.x; d < hd; d += blockDim.x) q[d] = base[i * ld + d];
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* k = base + j * ld + C;
    float dot = 0.0f;
    for (int d = 0; d < hd; ++d) dot += q[d] * k[d];
    s[j] = dot * scale;
    mx = fmaxf(mx, s[j]);
  }
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float p = expf(s[j] - mx);
    s[j] = p;
    sum += p;
  }
  sum = block_sum(sum, scratch);  // ends with a barrier: s[] complete
  const float inv = 1.0f / sum;
  float* o = out + (size_t(b) * T + i) * C + h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    const float* v = base + 2 * C + d;
    float acc = 0.0f;
    for (int j = 0; j <= i; ++j) acc += s[j] * v[j * ld];
    o[d] = acc * inv;
  }
  if (threadIdx.x == 0) lse[(size_t(b) * NH + h) * T + i] = mx + logf(sum);
}

// Kernel A: dq and D. Shared: q[hd] | dO[hd] | ds[T] | scratch.
__global__ void attn_bwd_q_k(float* dqkv, float* dbuf, const float* dout, const float* qkv, const float* out,
                             const float* lse, int T, int C, int NH, float scale) {
  extern __shared__ float sh[];
  const int hd = C / NH;
  const int i = blockIdx.x % T;
  const int h = (blockIdx.x / T) % NH;
  const int b = blockIdx.x / (T * NH);
  float* q = sh;
  float* go = sh + hd;
  float* ds = sh + 2 * hd;
  float* scratch = ds + T;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;
  const size_t orow = (size_t(b) * T + i) * C + h * hd;
  float dpart = 0.0f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    q[d] = base[i * ld + d];
    go[d] = dout[orow + d];
    dpart += go[d] * out[orow + d];
  }
  const float D = block_sum(dpart, scratch);  // barrier: q, go ready
  const size_t li = (size_t(b) * NH + h) * T + i;
  if (threadIdx.x == 0) dbuf[li] = D;
  const float l = lse[li];
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* k = base + j * ld + C;
    const float* v = base + j * ld + 2 * C;
    float sc = 0.0f, dp = 0.0f;
    for (int d = 0; d < hd; ++d) {
      sc += q[d] * k[d];
      dp += go[d] * v[d];
    }
    const float p = expf(sc * scale - l);
    ds[j] = p * (dp - D) * scale;
  }
  __syncthreads();
  float* dq = dqkv + size_t(b) * T * ld + i * ld + h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    const float* k = base + C + d;
    float acc = 0.0f;
    for (int j = 0; j <= i; ++j) acc += ds[j] * k[j * ld];
    dq[d] = acc;
  }
}

// Kernel B: dk and dv of key j. Shared: k[hd] | v[hd] | p[T] | ds[T].
__global__ void attn_bwd_kv_k(float* dqkv, const float* dbuf, const float* dout, const float* qkv, const float* lse,
                              int T, int C, int NH, float scale) {
  extern __shared__ float sh[];
  const int hd = C / NH;
  const int j = blockIdx.x % T;
  const int h = (blockIdx.x / T) % NH;
  const int b = blockIdx.x / (T * NH);
  float* k = sh;
  float* v = sh + hd;
  float* p = sh + 2 * hd;
  float* ds = p + T;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    k[d] = base[j * ld + C + d];
    v[d] = base[j * ld + 2 * C + d];
  }
  __syncthreads();
  const size_t lrow = (size_t(b) * NH + h) * T;
  for (int i = j + threadIdx.x; i < T; i += blockDim.x) {
    const float* q = base + i * ld;
    const float* go = dout + (size_t(b) * T + i) * C + h * hd;
    float sc = 0.0f, dp = 0.0f;
    for (int d = 0; d < hd; ++d) {
      sc += q[d] * k[d];
      dp += go[d] * v[d];
    }
    const float pij = expf(sc * scale - lse[lrow + i]);
    p[i - j] = pij;
    ds[i - j] = pij * (dp - dbuf[lrow + i]) * scale;
  }
  __syncthreads();
  float* dk = dqkv + size_t(b) * T * ld + j * ld + C + h * hd;
  float* dv = dk + C;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float ak = 0.0f, av = 0.0f;
    for (int i = j; i < T; ++i) {
      ak += ds[i - j] * base[i * ld + d];
      av += p[i - j] * dout[(size_t(b) * T + i) * C + h * hd + d];
    }
    dk[d] = ak;
    dv[d] = av;
  }
}

// ---- Warp-cooperative kernels (head dim <= 128): lanes own head dimensions d = lane + 32 r, so every
// row access is coalesced and each score is one warp reduction. A block of kWarps warps handles one row;
// warp w takes every kWarps-th partner row, keeps its own running state in registers, and the warps are
// merged in a fixed order at the end (deterministic, no atomics). ----
constexpr int kWarps = 4;
constexpr int kPer = 4;  // head dims per lane: hd <= 32 * kPer
constexpr int kMaxHd = 32 * kPer;

__device__ inline float warp_allsum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(kWarps * 32) attn_fwd_warp_k(float* out, float* lse, const float* qkv, int T, int C,
                                                               int NH, float scale) {
  __shared__ float sm[kWarps], sl[kWarps], so[kWarps][kMaxHd];
  const int hd = C / NH;
  const int i = blockIdx.x % T, h = (blockIdx.x / T) % NH, b = blockIdx.x / (T * NH);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;
  float q[kPer], o[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int d = lane + 32 * r;
    q[r] = d < hd ? base[i * ld + d] : 0.0f;
    o[r] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = warp; j <= i; j += kWarps) {
    const float* k = base + j * ld + C;
    const float* v = k + C;
    float dot = 0.0f;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int d = lane + 32 * r;
      if (d < hd) dot += q[r] * k[d];
    }
    const float s = warp_allsum(dot) * scale;
    const float mn = fmaxf(m, s);
    const float corr = expf(m - mn), p = expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int d = lane + 32 * r;
      o[r] = o[r] * corr + (d < hd ? p * v[d] : 0.0f);
    }
    m = mn;
  }
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int d = lane + 32 * r;
    if (d < hd) so[warp][d] = o[r];
  }
  __syncthreads();
  float M = sm[0];
  for (int w = 1; w < kWarps; ++w) M = fmaxf(M, sm[w]);  // warp 0 always saw key 0: M is finite
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w) L += sl[w] * expf(sm[w] - M);
  const float inv = 1.0f / L;
  float* orow = out + (size_t(b) * T + i) * C + h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int w = 0; w < kWarps; ++w) acc += so[w][d] * expf(sm[w] - M);
    orow[d] = acc * inv;
  }
  if (threadIdx.x == 0) lse[(size_t(b) * NH + h) * T + i] = M + logf(L);
}

// dq_i and D_i = dO_i . O_i for query i.
__global__ void __launch_bounds__(kWarps * 32) attn_bwd_q_warp_k(float* dqkv, float* dbuf, const float* dout,
                                                                 const float* qkv, const float* out, const float* lse,
                                                                 int T, int C, int NH, float scale) {
  __shared__ float sdq[kWarps][kMaxHd];
  const int hd = C / NH;
  const int i = blockIdx.x % T, h = (blockIdx.x / T) % NH, b = blockIdx.x / (T * NH);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;
  const size_t orow = (size_t(b) * T + i) * C + h * hd;
  float q[kPer], go[kPer], dq[kPer];
  float dpart = 0.0f;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int d = lane + 32 * r;
    q[r] = d < hd ? base[i * ld + d] : 0.0f;
    go[r] = d < hd ? dout[orow + d] : 0.0f;
    dpart += d < hd ? go[r] * out[orow + d] : 0.0f;
    dq[r] = 0.0f;
  }
  const float D = warp_allsum(dpart);
  const size_t li = (size_t(b) * NH + h) * T + i;
  const float li_lse = lse[li];
  for (int j = warp; j <= i; j += kWarps) {
    const float* k = base + j * ld + C;
    const float* v = k + C;
    float sc = 0.0f, dp = 0.0f;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int d = lane + 32 * r;
      if (d < hd) {
        sc += q[r] * k[d];
        dp += go[r] * v[d];
      }
    }
    sc = warp_allsum(sc);
    dp = warp_allsum(dp);
    const float ds = expf(sc * scale - li_lse) * (dp - D) * scale;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int d = lane + 32 * r;
      if (d < hd) dq[r] += ds * k[d];
    }
  }
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int d = lane + 32 * r;
    if (d < hd) sdq[warp][d] = dq[r];
  }
  __syncthreads();
  float* dqrow = dqkv + size_t(b) * T * ld + i * ld + h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int w = 0; w < kWarps; ++w) acc += sdq[w][d];
    dqrow[d] = acc;
  }
  if (threadIdx.x == 0) dbuf[li] = D;
}

// dk_j and dv_j for key j.
__global__ void __launch_bounds__(kWarps * 32) attn_bwd_kv_warp_k(float* dqkv, const float* dbuf, const float* dout,
                                                                  const float* qkv, const float* lse, int T, int C,
                                                                  int NH, float scale) {
  __shared__ float sdk[kWarps][kMaxHd], sdv[kWarps][kMaxHd];
  const int hd = C / NH;
  const int j = blockIdx.x % T, h = (blockIdx.x / T) % NH, b = blockIdx.x / (T * NH);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;
  float k[kPer], v[kPer], dk[kPer], dv[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int d = lane + 32 * r;
    k[r] = d < hd ? base[j * ld + C + d] : 0.0f;
    v[r] = d < hd ? base[j * ld + 2 * C + d] : 0.0f;
    dk[r] = dv[r] = 0.0f;
  }
  const size_t lrow = (size_t(b) * NH + h) * T;
  for (int i = j + warp; i < T; i += kWarps) {
    const float* q = base + i * ld;
    const float* go = dout + (size_t(b) * T + i) * C + h * hd;
    float qr[kPer], gr[kPer];
    float sc = 0.0f, dp = 0.0f;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int d = lane + 32 * r;
      qr[r] = d < hd ? q[d] : 0.0f;
      gr[r] = d < hd ? go[d] : 0.0f;
      sc += qr[r] * k[r];
      dp += gr[r] * v[r];
    }
    sc = warp_allsum(sc);
    dp = warp_allsum(dp);
    const float p = expf(sc * scale - lse[lrow + i]);
    const float ds = p * (dp - dbuf[lrow + i]) * scale;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      dk[r] += ds * qr[r];
      dv[r] += p * gr[r];
    }
  }
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int d = lane + 32 * r;
    if (d < hd) {
      sdk[warp][d] = dk[r];
      sdv[warp][d] = dv[r];
    }
  }
  __syncthreads();
  float* dkrow = dqkv + size_t(b) * T * ld + j * ld + C + h * hd;
  float* dvrow = dkrow + C;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float ak = 0.0f, av = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      ak += sdk[w][d];
      av += sdv[w][d];
    }
    dkrow[d] = ak;
    dvrow[d] = av;
  }
}

bool set_smem(const void* fn, size_t bytes) {
  if (bytes <= 48 * 1024) return true;
  int dev = 0, max_optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
  if (bytes > static_cast<size_t>(max_optin)) return false;
  return cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) ==
         cudaSuccess;
}

}  // namespace

bool attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, cudaStream_t s) {
  const int hd = C / NH;
  const size_t smem = (2 * size_t(hd) + T + 32) * sizeof(float);
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  if (B * T * NH == 0) return true;
  if (hd <= kMaxHd) {
    attn_fwd_warp_k<<<B * NH * T, kWarps * 32, 0, s>>>(out, lse, qkv, T, C, NH, scale);
    return true;
  }
  if (!set_smem(reinterpret_cast<const void*>(&attn_fwd_k), smem)) return false;
  attn_fwd_k<<<B * NH * T, kThreads, smem, s>>>(out, lse, qkv, T, C, NH, scale);
  return true;
}

bool attention_backward(float* dqkv, float* dscratch, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t s) {
  const int hd = C / NH;
  const size_t smem_a = (2 * size_t(hd) + T + 32) * sizeof(float);
  const size_t smem_b = (2 * size_t(hd) + 2 * size_t(T)) * sizeof(float);
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  if (B * T * NH == 0) return true;
  if (hd <= kMaxHd) {
    attn_bwd_q_warp_k<<<B * NH * T, kWarps * 32, 0, s>>>(dqkv, dscratch, dout, qkv, out, lse, T, C, NH, scale);
    attn_bwd_kv_warp_k<<<B * NH * T, kWarps * 32, 0, s>>>(dqkv, dscratch, dout, qkv, lse, T, C, NH, scale);
    return true;
  }
  if (!set_smem(reinterpret_cast<const void*>(&attn_bwd_q_k), smem_a)) return false;
  if (!set_smem(reinterpret_cast<const void*>(&attn_bwd_kv_k), smem_b)) return false;
  attn_bwd_q_k<<<B * NH * T, kThreads, smem_a, s>>>(dqkv, dscratch, dout, qkv, out, lse, T, C, NH, scale);
  attn_bwd_kv_k<<<B * NH * T, kThreads, smem_b, s>>>(dqkv, dscratch, dout, qkv, lse, T, C, NH, scale);
  return true;
}

}  // namespace trident::cuda::launch
