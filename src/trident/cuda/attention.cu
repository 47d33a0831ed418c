// Causal multi-head self-attention on the GPU (see ops.h), float32 throughout (no tensor cores: the
// results match the CPU kernel to float32 rounding of a different summation order).
// Head dims <= 128: tiled, FlashAttention-2 style (kernels after "Tiled kernels" below).
//   Forward, one block per (b, h, 64-query tile): K and V tiles of 64 keys through shared memory, scores in
//   registers, online softmax (running max and sum per row), out and lse written once.
//   Backward recomputes P from q, k and lse (no T x T matrix is kept), in three kernels:
//     D_i = dO_i . O_i (a warp per row);
//     dK, dV: one block per (b, h, 64-key tile), looping over the query tiles at or after it;
//     dQ:     one block per (b, h, 64-query tile), looping over the key tiles at or before it.
//   dQ is recomputed in its own kernel instead of atomicAdd across key tiles: 7 tile products per tile
//   pair instead of 5, but every output element is written once in a fixed order: deterministic.
// Head dims > 128 (simple shared-memory kernels, T limited by shared memory):
//   forward, one block per (b, h, query i): scores of row i in shared memory, block max/sum, then
//   out_i = sum_j p_ij v_j and lse_i. Backward:
//   kernel A, one block per (b, h, query i): D_i = dO_i . O_i, ds_ij = p_ij (dO_i . v_j - D_i) scale,
//            dq_i = sum_j ds_ij k_j;
//   kernel B, one block per (b, h, key j):   dk_j = sum_{i>=j} ds_ij q_i, dv_j = sum_{i>=j} p_ij dO_i.
// No atomics anywhere: every output element is written by one thread, in a fixed order of summation.
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

// ---- Tiled kernels (FlashAttention-2 style, float32 on CUDA cores), head dims <= 128 ----
// Head dims are zero-padded to HDP in {32, 64, 128}: padded columns add nothing to a dot product and are
// never written. Query and key tiles are kTile = 64 rows; a block of 128 threads is a 16 x 8 grid, thread
// (ty, tx) owns the 4 x 8 score block rows 4ty..4ty+3, columns tx, tx+8, ..., tx+56 of a tile, and of the
// output accumulator the same 4 rows x HDP/8 head columns col_of(c, tx) = 32(c/4) + 4tx + c%4 (groups of
// 4 adjacent columns, so they load as one float4). The 8 threads of a row group are 8 consecutive lanes,
// so row max/sum are 3 shuffles. Every sum has a fixed order: deterministic.
// Shared tiles keep a row stride of HDP + 4 (kTile + 4 for score tiles): rows stay 16-byte aligned for
// float4 loads, and the 8 rows or column groups one row group reads fall in distinct banks. VW is the
// width of those shared loads (4; 1 where registers are short: plain float loads, same results).
constexpr int kTile = 64;
constexpr int kTileThreads = 128;
constexpr int kLdP = kTile + 4;

template <int HDP>
__host__ __device__ constexpr int tile_ld() {
  return HDP + 4;
}

__device__ inline int col_of(int c, int tx) { return 32 * (c >> 2) + 4 * tx + (c & 3); }

template <int VW>
__device__ inline void ld_vec(float* dst, const float* p) {
  if constexpr (VW == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    dst[0] = t.x;
    dst[1] = t.y;
    dst[2] = t.z;
    dst[3] = t.w;
  } else if constexpr (VW == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    dst[0] = t.x;
    dst[1] = t.y;
  } else {
    dst[0] = *p;
  }
}

// dst[r][d] = src[(row0 + r) * ld_src + d] for row0 + r < T and d < hd, else 0.
template <int HDP>
__device__ inline void load_tile(float* dst, const float* src, size_t ld_src, int row0, int T, int hd) {
  constexpr int LD = tile_ld<HDP>();
  for (int idx = threadIdx.x; idx < kTile * HDP; idx += kTileThreads) {
    const int r = idx / HDP, d = idx % HDP, row = row0 + r;
    dst[r * LD + d] = (row < T && d < hd) ? __ldg(src + size_t(row) * ld_src + d) : 0.0f;
  }
}

// acc[r][c] = sum_d A[4ty + r][d] * Bm[tx + 8c][d] (both tiles kTile x HDP, stride HDP + 4); d in steps of VW,
// summed in increasing d (the same order for every VW).
template <int HDP, int VW>
__device__ inline void tile_abt(float (&acc)[4][8], const float* A, const float* Bm, int ty, int tx) {
  constexpr int LD = tile_ld<HDP>();
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[r][c] = 0.0f;
  const float* a0 = A + 4 * ty * LD;
  const float* b0 = Bm + tx * LD;
#pragma unroll(VW == 4 ? 1 : 4)
  for (int d = 0; d < HDP; d += VW) {
    float a[4][VW], bv[8][VW];
#pragma unroll
    for (int r = 0; r < 4; ++r) ld_vec<VW>(a[r], a0 + r * LD + d);
#pragma unroll
    for (int c = 0; c < 8; ++c) ld_vec<VW>(bv[c], b0 + 8 * c * LD + d);
#pragma unroll
    for (int v = 0; v < VW; ++v)
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(a[r][v], bv[c][v], acc[r][c]);
  }
}

// acc[r][c] += sum_j P[4ty + r][j] * V[j][col_of(c, tx)] (P kTile x kTile stride kLdP; V kTile x HDP),
// j in increasing order.
template <int HDP, int VW>
__device__ inline void tile_pv(float (&acc)[4][HDP / 8], const float* P, const float* V, int ty, int tx) {
  constexpr int LD = tile_ld<HDP>(), NC = HDP / 8;
  const float* p0 = P + 4 * ty * kLdP;
  const float* v0 = V + 4 * tx;
#pragma unroll(VW == 4 ? 1 : 4)
  for (int j0 = 0; j0 < kTile; j0 += VW) {
    float p[4][VW];
#pragma unroll
    for (int r = 0; r < 4; ++r) ld_vec<VW>(p[r], p0 + r * kLdP + j0);
#pragma unroll
    for (int u = 0; u < VW; ++u) {
      const float* vr = v0 + (j0 + u) * LD;
      float v[NC];
#pragma unroll
      for (int g = 0; g < NC / 4; ++g) {
        if constexpr (VW == 4) {
          ld_vec<4>(v + 4 * g, vr + 32 * g);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) v[4 * g + e] = vr[32 * g + e];
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[r][c] = fmaf(p[r][u], v[c], acc[r][c]);
    }
  }
}

// Over the 8 lanes of a row group (consecutive lanes, xor 1, 2, 4 stays inside the group).
__device__ inline float group8_max(float v) {
  for (int o = 1; o < 8; o <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float group8_sum(float v) {
  for (int o = 1; o < 8; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int HDP>
constexpr size_t fwd_tile_smem() {
  return (2 * size_t(kTile) * tile_ld<HDP>() + size_t(kTile) * kLdP) * sizeof(float);
}

// Forward: block per (b, h, query tile). Shared: Q | K-or-V | P. Online softmax in registers.
template <int HDP, int VW>
__global__ void __launch_bounds__(kTileThreads) attn_fwd_tile_k(float* out, float* lse, const float* qkv, int T,
                                                                int C, int NH, float scale) {
  extern __shared__ __align__(16) float tsh[];  // float4 reads need 16-byte alignment
  float* sh = tsh;
  constexpr int LD = tile_ld<HDP>(), NC = HDP / 8;
  float* Qs = sh;
  float* KVs = Qs + kTile * LD;
  float* Ps = KVs + kTile * LD;
  const int hd = C / NH, nt = (T + kTile - 1) / kTile;
  int qt, h, b;
  detail::attention_tile_coords(nt, NH, true, qt, h, b);
  const int tx = threadIdx.x & 7, ty = threadIdx.x >> 3;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;
  const int q0 = qt * kTile;
  load_tile<HDP>(Qs, base, ld, q0, T, hd);
  float m[4], l[4], o[4][NC];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) o[r][c] = 0.0f;
  }
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's P V is done with KVs and Ps
    load_tile<HDP>(KVs, base + C, ld, k0, T, hd);
    __syncthreads();
    float s[4][8];
    tile_abt<HDP, VW>(s, Qs, KVs, ty, tx);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = q0 + 4 * ty + r;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int j = k0 + tx + 8 * c;
        s[r][c] = (j > i || j >= T) ? -INFINITY : s[r][c] * scale;
        mx = fmaxf(mx, s[r][c]);
      }
      // Key k0 <= i is visible to every row (k0 <= q0 <= i, k0 < T): mx and mn are finite.
      const float mn = fmaxf(m[r], group8_max(mx));
      const float corr = expf(m[r] - mn);
      float rs = 0.0f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const float p = expf(s[r][c] - mn);
        Ps[(4 * ty + r) * kLdP + tx + 8 * c] = p;
        rs += p;
      }
      l[r] = l[r] * corr + group8_sum(rs);
      m[r] = mn;
#pragma unroll
      for (int c = 0; c < NC; ++c) o[r][c] *= corr;
    }
    __syncthreads();  // P complete, K no longer read
    load_tile<HDP>(KVs, base + 2 * C, ld, k0, T, hd);
    __syncthreads();
    tile_pv<HDP, VW>(o, Ps, KVs, ty, tx);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int i = q0 + 4 * ty + r;
    if (i >= T) continue;
    const float inv = 1.0f / l[r];
    float* orow = out + (size_t(b) * T + i) * C + h * hd;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = col_of(c, tx);
      if (d < hd) orow[d] = o[r][c] * inv;
    }
    if (tx == 0) lse[(size_t(b) * NH + h) * T + i] = m[r] + logf(l[r]);
  }
}

// D_i = dO_i . O_i, one warp per (b, t, h) row; dbuf laid out as lse [B, NH, T].
__global__ void attn_bwd_dot_k(float* dbuf, const float* dout, const float* out, int B, int T, int C, int NH) {
  const size_t row = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= size_t(B) * T * NH) return;
  const int hd = C / NH;
  const int h = int(row % NH);
  const size_t bt = row / NH;
  const float* go = dout + bt * C + h * hd;
  const float* o = out + bt * C + h * hd;
  float acc = 0.0f;
  for (int d = lane; d < hd; d += 32) acc += go[d] * o[d];
  acc = detail::warp_sum(acc);
  const size_t b = bt / T, t = bt % T;
  if (lane == 0) dbuf[(b * NH + h) * T + t] = acc;
}

template <int HDP>
constexpr size_t bwd_q_tile_smem() {
  return (4 * size_t(kTile) * tile_ld<HDP>() + size_t(kTile) * kLdP) * sizeof(float);
}

// dQ: block per (b, h, query tile). Shared: Q | dO | K | V | dS. dq_i = sum_j ds_ij k_j over key tiles.
template <int HDP, int VW>
__global__ void __launch_bounds__(kTileThreads) attn_bwd_q_tile_k(float* dqkv, const float* dbuf, const float* dout,
                                                                  const float* qkv, const float* lse, int T, int C,
                                                                  int NH, float scale) {
  extern __shared__ __align__(16) float tsh[];  // float4 reads need 16-byte alignment
  float* sh = tsh;
  constexpr int LD = tile_ld<HDP>(), NC = HDP / 8;
  float* Qs = sh;
  float* dOs = Qs + kTile * LD;
  float* Ks = dOs + kTile * LD;
  float* Vs = Ks + kTile * LD;
  float* Ss = Vs + kTile * LD;
  const int hd = C / NH, nt = (T + kTile - 1) / kTile;
  int qt, h, b;
  detail::attention_tile_coords(nt, NH, true, qt, h, b);
  const int tx = threadIdx.x & 7, ty = threadIdx.x >> 3;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;
  const int q0 = qt * kTile;
  load_tile<HDP>(Qs, base, ld, q0, T, hd);
  load_tile<HDP>(dOs, dout + size_t(b) * T * C + h * hd, C, q0, T, hd);
  const size_t lrow = (size_t(b) * NH + h) * T;
  float li[4], Di[4], dq[4][NC];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int i = q0 + 4 * ty + r;
    li[r] = i < T ? lse[lrow + i] : 0.0f;
    Di[r] = i < T ? dbuf[lrow + i] : 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) dq[r][c] = 0.0f;
  }
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    load_tile<HDP>(Ks, base + C, ld, k0, T, hd);
    load_tile<HDP>(Vs, base + 2 * C, ld, k0, T, hd);
    __syncthreads();
    float s[4][8], dp[4][8];
    tile_abt<HDP, VW>(s, Qs, Ks, ty, tx);
    tile_abt<HDP, VW>(dp, dOs, Vs, ty, tx);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = q0 + 4 * ty + r;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int j = k0 + tx + 8 * c;
        const bool ok = j <= i && i < T;
        Ss[(4 * ty + r) * kLdP + tx + 8 * c] = ok ? expf(s[r][c] * scale - li[r]) * (dp[r][c] - Di[r]) * scale : 0.0f;
      }
    }
    __syncthreads();
    tile_pv<HDP, VW>(dq, Ss, Ks, ty, tx);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int i = q0 + 4 * ty + r;
    if (i >= T) continue;
    float* row = dqkv + (size_t(b) * T + i) * ld + h * hd;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = col_of(c, tx);
      if (d < hd) row[d] = dq[r][c];
    }
  }
}

template <int HDP>
constexpr size_t bwd_kv_tile_smem() {
  return (4 * size_t(kTile) * tile_ld<HDP>() + 2 * size_t(kTile) * kLdP + 2 * size_t(kTile)) * sizeof(float);
}

// dK, dV: block per (b, h, key tile), looping over the query tiles at or after it. Shared: K | V | Q | dO |
// P^T | dS^T | lse | D. Thread (ty, tx) owns keys 4ty+r and queries tx+8c of the transposed score tile.
template <int HDP, int VW>
__global__ void __launch_bounds__(kTileThreads) attn_bwd_kv_tile_k(float* dqkv, const float* dbuf, const float* dout,
                                                                   const float* qkv, const float* lse, int T, int C,
                                                                   int NH, float scale) {
  extern __shared__ __align__(16) float tsh[];  // float4 reads need 16-byte alignment
  float* sh = tsh;
  constexpr int LD = tile_ld<HDP>(), NC = HDP / 8;
  float* Ks = sh;
  float* Vs = Ks + kTile * LD;
  float* Qs = Vs + kTile * LD;
  float* dOs = Qs + kTile * LD;
  float* PT = dOs + kTile * LD;
  float* dST = PT + kTile * kLdP;
  float* ls = dST + kTile * kLdP;
  float* Ds = ls + kTile;
  const int hd = C / NH, nt = (T + kTile - 1) / kTile;
  int kt, h, b;
  detail::attention_tile_coords(nt, NH, false, kt, h, b);  // key tile kt sees nt - kt query tiles: low kt first
  const int tx = threadIdx.x & 7, ty = threadIdx.x >> 3;
  const size_t ld = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * ld + h * hd;
  const float* gbase = dout + size_t(b) * T * C + h * hd;
  const size_t lrow = (size_t(b) * NH + h) * T;
  const int k0 = kt * kTile;
  load_tile<HDP>(Ks, base + C, ld, k0, T, hd);
  load_tile<HDP>(Vs, base + 2 * C, ld, k0, T, hd);
  float dk[4][NC], dv[4][NC];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) dk[r][c] = dv[r][c] = 0.0f;
  for (int qt = kt; qt < nt; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();
    load_tile<HDP>(Qs, base, ld, q0, T, hd);
    load_tile<HDP>(dOs, gbase, C, q0, T, hd);
    if (threadIdx.x < kTile) {
      const int i = q0 + threadIdx.x;
      ls[threadIdx.x] = i < T ? lse[lrow + i] : 0.0f;
      Ds[threadIdx.x] = i < T ? dbuf[lrow + i] : 0.0f;
    }
    __syncthreads();
    float st[4][8], dpt[4][8];
    tile_abt<HDP, VW>(st, Ks, Qs, ty, tx);
    tile_abt<HDP, VW>(dpt, Vs, dOs, ty, tx);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int j = k0 + 4 * ty + r;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int ic = tx + 8 * c, i = q0 + ic;
        const bool ok = j <= i && i < T;
        const float p = ok ? expf(st[r][c] * scale - ls[ic]) : 0.0f;
        PT[(4 * ty + r) * kLdP + ic] = p;
        dST[(4 * ty + r) * kLdP + ic] = ok ? p * (dpt[r][c] - Ds[ic]) * scale : 0.0f;
      }
    }
    __syncthreads();
    tile_pv<HDP, VW>(dv, PT, dOs, ty, tx);
    tile_pv<HDP, VW>(dk, dST, Qs, ty, tx);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int j = k0 + 4 * ty + r;
    if (j >= T) continue;
    float* krow = dqkv + (size_t(b) * T + j) * ld + C + h * hd;
    float* vrow = krow + C;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = col_of(c, tx);
      if (d < hd) {
        krow[d] = dk[r][c];
        vrow[d] = dv[r][c];
      }
    }
  }
}

// Launches the tiled kernels for padded head dim HDP; false when the device lacks the shared memory.
template <int HDP>
bool tiled_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, float scale,
                   cudaStream_t s) {
  constexpr int kFwdVw = 4;
  const size_t smem = fwd_tile_smem<HDP>();
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&attn_fwd_tile_k<HDP, kFwdVw>), smem)) return false;
  const int nt = (T + kTile - 1) / kTile;
  attn_fwd_tile_k<HDP, kFwdVw><<<nt * B * NH, kTileThreads, smem, s>>>(out, lse, qkv, T, C, NH, scale);
  return true;
}

template <int HDP>
bool tiled_backward(float* dqkv, const float* dbuf, const float* dout, const float* qkv, const float* lse, int B,
                    int T, int C, int NH, float scale, cudaStream_t s) {
  constexpr int kBwdVw = HDP <= 64 ? 4 : 1;  // at 128 the backward kernels already use ~250 registers
  const size_t smem_q = bwd_q_tile_smem<HDP>(), smem_kv = bwd_kv_tile_smem<HDP>();
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&attn_bwd_q_tile_k<HDP, kBwdVw>), smem_q)) return false;
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&attn_bwd_kv_tile_k<HDP, kBwdVw>), smem_kv)) return false;
  const int nt = (T + kTile - 1) / kTile;
  attn_bwd_kv_tile_k<HDP, kBwdVw><<<nt * B * NH, kTileThreads, smem_kv, s>>>(dqkv, dbuf, dout, qkv, lse, T, C, NH, scale);
  attn_bwd_q_tile_k<HDP, kBwdVw><<<nt * B * NH, kTileThreads, smem_q, s>>>(dqkv, dbuf, dout, qkv, lse, T, C, NH, scale);
  return true;
}

constexpr int kMaxTiledHd = 128;

}  // namespace

void attention_row_dots(float* dbuf, const float* dout, const float* out, int B, int T, int C, int NH,
                        cudaStream_t s) {
  const size_t rows = size_t(B) * T * NH;
  if (rows == 0) return;
  attn_bwd_dot_k<<<detail::grid_for(rows * 32, 256, 0x7fffffffu), 256, 0, s>>>(dbuf, dout, out, B, T, C, NH);
}

bool attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, cudaStream_t s) {
  const int hd = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  if (B * T * NH == 0) return true;
  if (hd <= 32) return tiled_forward<32>(out, lse, qkv, B, T, C, NH, scale, s);
  if (hd <= 64) return tiled_forward<64>(out, lse, qkv, B, T, C, NH, scale, s);
  if (hd <= kMaxTiledHd) return tiled_forward<128>(out, lse, qkv, B, T, C, NH, scale, s);
  const size_t smem = (2 * size_t(hd) + T + 32) * sizeof(float);
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&attn_fwd_k), smem)) return false;
  attn_fwd_k<<<B * NH * T, kThreads, smem, s>>>(out, lse, qkv, T, C, NH, scale);
  return true;
}

bool attention_backward(float* dqkv, float* dscratch, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t s) {
  const int hd = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  if (B * T * NH == 0) return true;
  if (hd <= kMaxTiledHd) {
    attention_row_dots(dscratch, dout, out, B, T, C, NH, s);
    if (hd <= 32) return tiled_backward<32>(dqkv, dscratch, dout, qkv, lse, B, T, C, NH, scale, s);
    if (hd <= 64) return tiled_backward<64>(dqkv, dscratch, dout, qkv, lse, B, T, C, NH, scale, s);
    return tiled_backward<128>(dqkv, dscratch, dout, qkv, lse, B, T, C, NH, scale, s);
  }
  const size_t smem_a = (2 * size_t(hd) + T + 32) * sizeof(float);
  const size_t smem_b = (2 * size_t(hd) + 2 * size_t(T)) * sizeof(float);
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&attn_bwd_q_k), smem_a)) return false;
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&attn_bwd_kv_k), smem_b)) return false;
  attn_bwd_q_k<<<B * NH * T, kThreads, smem_a, s>>>(dqkv, dscratch, dout, qkv, out, lse, T, C, NH, scale);
  attn_bwd_kv_k<<<B * NH * T, kThreads, smem_b, s>>>(dqkv, dscratch, dout, qkv, lse, T, C, NH, scale);
  return true;
}

}  // namespace trident::cuda::launch
