// Causal multi-head self-attention on tensor cores: the bfloat16 path of attention_forward/backward (ops.h),
// taken when the model computes in bfloat16 and the head dim is 32, 64 or 128.
//
// FlashAttention-2 on mma.sync (m16n8k16, bfloat16 operands, float32 accumulation), no T x T matrix in
// memory. The caller (ops.cc) rounds q, k, v and dO to bfloat16 copies once per call (round to nearest
// even, as every bf16 GEMM here), so tiles move as 16-byte pieces of bf16: half the bytes of float32 and no
// conversion in the loops. Scores, softmax statistics, lse and every accumulator are float32; P and dS are
// rounded to bfloat16 as the A operand of the next product; out and dqkv are written in float32.
//
// A block is 4 warps; each warp owns 16 rows of a 64-row tile, so a block covers 64 queries (forward, dQ)
// or 64 keys (dK/dV), and loops over 64-row tiles of the other side:
//   forward: S = Q K^T, online softmax in registers, O += P V; writes O and lse once.
//   dK, dV (block per key tile, over the query tiles at or after it): S^T = K Q^T, P^T from lse,
//          dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q.
//   dQ (block per query tile, over the key tiles at or before it): S, dP, dS as above, dQ += dS K.
// D_i = dO_i . O_i comes from attention_row_dots (attention.cu). dQ has its own kernel, as in the float32
// path, so that no output needs atomics: every element is written once, in a fixed order (deterministic).
//
// Fragment layouts are PTX's for m16n8k16 (lane = 4 g + t): A (16 x 16, row-major) holds rows g and g + 8
// at columns 2t, 2t + 1 and 2t + 8, 2t + 9; B (16 x 8) holds rows (the k index) 2t, 2t + 1 and 2t + 8,
// 2t + 9 of column g; C (16 x 8) holds rows g, g + 8 at columns 2t, 2t + 1. A C fragment pair (columns
// 0-7, 8-15) is therefore an A fragment: P and dS go from accumulators to operands without shared memory.
// A B operand whose k index runs along the rows of a row-major shared tile (V in P V, dO in P^T dO, Q in
// dS^T Q, K in dS K) is read with ldmatrix.trans.
// Shared tiles are [64][HD + 8] bfloat16: a row stride of HD/2 + 4 words puts the 8 rows of a fragment
// load in distinct banks and keeps rows 16-byte aligned for ldmatrix.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "trident/cuda/common.cuh"
#include "trident/cuda/launch.h"

namespace trident::cuda::launch {

namespace {

constexpr int kRows = 64;  // rows per tile, both sides
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

using bf16 = __nv_bfloat16;

__device__ inline uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half: the lower-indexed element
  return *reinterpret_cast<uint32_t*>(&v);
}

// d += a b (m16n8k16, bf16 x bf16 -> f32).
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment of rows r0..r0+15, columns 16 kk..16 kk+15 of a row-major shared tile.
template <int LD>
__device__ inline void load_a(uint32_t (&a)[4], const bf16* tile, int r0, int kk, int g, int t) {
  const bf16* p = tile + (r0 + g) * LD + 16 * kk + 2 * t;
  a[0] = ld32(p);
  a[1] = ld32(p + 8 * LD);
  a[2] = ld32(p + 8);
  a[3] = ld32(p + 8 * LD + 8);
}

// B fragment (k = columns 16 kk.., n = rows 8 n..8 n+7) of a row-major shared tile: the tile's rows are
// the columns of B (K in Q K^T, V in dO V^T, Q in K Q^T, dO in V dO^T).
template <int LD>
__device__ inline void load_b(uint32_t& b0, uint32_t& b1, const bf16* tile, int n, int kk, int g, int t) {
  const bf16* p = tile + (8 * n + g) * LD + 16 * kk + 2 * t;
  b0 = ld32(p);
  b1 = ld32(p + 8);
}

// B fragments of n-tiles n and n + 1 (columns 8 n..8 n+15), k = rows 16 kk..16 kk+15 of a row-major shared
// tile (the tile's rows are the k index): ldmatrix.x4.trans, lane l addresses row 16 kk + 8 ((l >> 3) & 1)
// + (l & 7) at column 8 (n + (l >> 4)).
template <int LD>
__device__ inline void load_bt2(uint32_t (&b)[4], const bf16* tile, int n, int kk, int lane) {
  const bf16* p = tile + (16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)) * LD + 8 * (n + (lane >> 4));
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr));
}

// A fragment for k-step kk from the accumulators of n-tiles 2 kk and 2 kk + 1 (see the header).
__device__ inline void acc_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// s = A1 B1^T and d = A2 B2^T over the head dim, for the 16 rows r0.. of A1/A2 and the 64 rows of B1/B2 (all
// row-major shared tiles): S and dP in the backward kernels (S^T and dP^T in dK/dV, with the roles swapped).
template <int HD>
__device__ inline void two_products(float (&s)[8][4], float (&d)[8][4], const bf16* A1, const bf16* A2,
                                    const bf16* B1, const bf16* B2, int r0, int g, int t) {
  constexpr int LD = HD + 8;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = d[n][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t a1[4], a2[4];
    load_a<LD>(a1, A1, r0, kk, g, t);
    load_a<LD>(a2, A2, r0, kk, g, t);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      uint32_t b0, b1;
      load_b<LD>(b0, b1, B1, n, kk, g, t);
      mma(s[n], a1, b0, b1);
      load_b<LD>(b0, b1, B2, n, kk, g, t);
      mma(d[n], a2, b0, b1);
    }
  }
}

// acc += P M for P the 16 x 64 accumulator block `p` (rounded to bf16 as the A operand) and M a row-major
// 64 x HD shared tile whose rows are the k index (O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K).
template <int HD>
__device__ inline void acc_times_tile(float (&acc)[HD / 8][4], const float (&p)[8][4], const bf16* M, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t pa[4];
    acc_to_a(pa, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int d = 0; d < HD / 8; d += 2) {
      uint32_t mb[4];
      load_bt2<HD + 8>(mb, M, d, kk, lane);
      mma(acc[d], pa, mb[0], mb[1]);
      mma(acc[d + 1], pa, mb[2], mb[3]);
    }
  }
}

// row[8 d + 2 t + {0, 1}] = acc[d][2 hi + {0, 1}] * scale: this thread's columns of accumulator row g + 8 hi.
template <int HD>
__device__ inline void store_row(float* row, const float (&acc)[HD / 8][4], int hi, int t, float scale) {
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) {
    row[8 * d + 2 * t] = acc[d][2 * hi] * scale;
    row[8 * d + 2 * t + 1] = acc[d][2 * hi + 1] * scale;
  }
}

// dst[r][:] = src[(row0 + r) * ld_src + :HD] for row0 + r < T, else 0, in 16-byte pieces (8 bf16; consecutive
// threads read consecutive pieces of a row: coalesced). Rows of src start 16-byte aligned: ld_src and the
// head offset are multiples of 8 elements at these head dims.
template <int HD>
__device__ inline void load_tile(bf16* dst, const bf16* src, size_t ld_src, int row0, int T) {
  constexpr int LD = HD + 8, PIECES = HD / 8;
  for (int idx = threadIdx.x; idx < kRows * PIECES; idx += kThreads) {
    const int r = idx / PIECES, c = 8 * (idx % PIECES), row = row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < T) v = __ldg(reinterpret_cast<const uint4*>(src + size_t(row) * ld_src + c));
    *reinterpret_cast<uint4*>(dst + r * LD + c) = v;
  }
}

// Over the 4 lanes of a row's quad (lanes 4 g..4 g+3).
__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int HD>
constexpr size_t tile_bytes() {
  return size_t(kRows) * (HD + 8) * sizeof(bf16);
}

template <int HD>
__global__ void __launch_bounds__(kThreads) fwd_k(float* out, float* lse, const bf16* qkv, int T, int C, int NH,
                                                  float scale_log2) {
  constexpr int LD = HD + 8, KS = HD / 16, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kRows * LD;
  bf16* Vs = Ks + kRows * LD;
  const int nt = (T + kRows - 1) / kRows;
  int qt, h, b;
  detail::attention_tile_coords(nt, NH, true, qt, h, b);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const size_t ld = size_t(3) * C;
  const bf16* base = qkv + size_t(b) * T * ld + size_t(h) * HD;
  const int q0 = qt * kRows, r0 = 16 * w;
  load_tile<HD>(Qs, base, ld, q0, T);
  __syncthreads();
  uint32_t qa[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) load_a<LD>(qa[kk], Qs, r0, kk, g, t);
  float o[ND][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row[2] = {q0 + r0 + g, q0 + r0 + g + 8};
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kRows;
    __syncthreads();  // the previous tile's products are done with Ks, Vs
    load_tile<HD>(Ks, base + C, ld, k0, T);
    load_tile<HD>(Vs, base + 2 * C, ld, k0, T);
    __syncthreads();
    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        uint32_t b0, b1;
        load_b<LD>(b0, b1, Ks, n, kk, g, t);
        mma(s[n], qa[kk], b0, b1);
      }
    // Scale into log2 units and mask the keys after the row (key k0 <= row is always visible, so every
    // row's maximum is finite: rows past T see key k0 too).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = k0 + 8 * n + 2 * t + (e & 1);
        const int hi = e >> 1;
        s[n][e] = j > row[hi] ? -INFINITY : s[n][e] * scale_log2;
        mx[hi] = fmaxf(mx[hi], s[n][e]);
      }
    float corr[2];
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float mn = fmaxf(m[hi], quad_max(mx[hi]));
      corr[hi] = exp2f(m[hi] - mn);
      m[hi] = mn;
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - m[e >> 1]);
        rs[e >> 1] += s[n][e];
      }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) l[hi] = l[hi] * corr[hi] + quad_sum(rs[hi]);
#pragma unroll
    for (int d = 0; d < ND; ++d) {
      o[d][0] *= corr[0];
      o[d][1] *= corr[0];
      o[d][2] *= corr[1];
      o[d][3] *= corr[1];
    }
    acc_times_tile<HD>(o, s, Vs, lane);
  }
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    if (row[hi] >= T) continue;
    store_row<HD>(out + (size_t(b) * T + row[hi]) * C + size_t(h) * HD, o, hi, t, 1.0f / l[hi]);
    if (t == 0) lse[(size_t(b) * NH + h) * T + row[hi]] = (m[hi] + log2f(l[hi])) / kLog2e;
  }
}

// dK, dV: block per (b, h, key tile); warp w owns keys 16 w..16 w+15 of it.
template <int HD>
__global__ void __launch_bounds__(kThreads) bwd_kv_k(float* dqkv, const float* dbuf, const bf16* dout,
                                                     const bf16* qkv, const float* lse, int T, int C, int NH,
                                                     float scale) {
  constexpr int LD = HD + 8, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kRows * LD;
  bf16* Qs = Vs + kRows * LD;
  bf16* dOs = Qs + kRows * LD;
  float* ls = reinterpret_cast<float*>(dOs + kRows * LD);  // lse of the query tile, in log2 units
  float* Ds = ls + kRows;
  const int nt = (T + kRows - 1) / kRows;
  int kt, h, b;
  detail::attention_tile_coords(nt, NH, false, kt, h, b);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const size_t ld = size_t(3) * C;
  const bf16* base = qkv + size_t(b) * T * ld + size_t(h) * HD;
  const bf16* gbase = dout + size_t(b) * T * C + size_t(h) * HD;
  const size_t lrow = (size_t(b) * NH + h) * T;
  const int k0 = kt * kRows, r0 = 16 * w;
  const float scale_log2 = scale * kLog2e;
  load_tile<HD>(Ks, base + C, ld, k0, T);
  load_tile<HD>(Vs, base + 2 * C, ld, k0, T);
  const int key[2] = {k0 + r0 + g, k0 + r0 + g + 8};
  float dk[ND][4] = {}, dv[ND][4] = {};
  for (int qt = kt; qt < nt; ++qt) {
    const int q0 = qt * kRows;
    __syncthreads();
    load_tile<HD>(Qs, base, ld, q0, T);
    load_tile<HD>(dOs, gbase, C, q0, T);
    if (threadIdx.x < kRows) {
      const int i = q0 + threadIdx.x;
      ls[threadIdx.x] = i < T ? lse[lrow + i] * kLog2e : 0.0f;
      Ds[threadIdx.x] = i < T ? dbuf[lrow + i] : 0.0f;
    }
    __syncthreads();
    float st[8][4], dpt[8][4];
    two_products<HD>(st, dpt, Ks, Vs, Qs, dOs, r0, g, t);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ic = 8 * n + 2 * t + (e & 1), i = q0 + ic;
        const bool ok = key[e >> 1] <= i && i < T;
        const float p = ok ? exp2f(st[n][e] * scale_log2 - ls[ic]) : 0.0f;
        st[n][e] = p;
        dpt[n][e] = ok ? p * (dpt[n][e] - Ds[ic]) * scale : 0.0f;
      }
    acc_times_tile<HD>(dv, st, dOs, lane);
    acc_times_tile<HD>(dk, dpt, Qs, lane);
  }
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    if (key[hi] >= T) continue;
    float* krow = dqkv + (size_t(b) * T + key[hi]) * ld + C + size_t(h) * HD;
    store_row<HD>(krow, dk, hi, t, 1.0f);
    store_row<HD>(krow + C, dv, hi, t, 1.0f);
  }
}

// dQ: block per (b, h, query tile); warp w owns queries 16 w..16 w+15 of it.
template <int HD>
__global__ void __launch_bounds__(kThreads) bwd_q_k(float* dqkv, const float* dbuf, const bf16* dout,
                                                    const bf16* qkv, const float* lse, int T, int C, int NH,
                                                    float scale) {
  constexpr int LD = HD + 8, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* dOs = Qs + kRows * LD;
  bf16* Ks = dOs + kRows * LD;
  bf16* Vs = Ks + kRows * LD;
  const int nt = (T + kRows - 1) / kRows;
  int qt, h, b;
  detail::attention_tile_coords(nt, NH, true, qt, h, b);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const size_t ld = size_t(3) * C;
  const bf16* base = qkv + size_t(b) * T * ld + size_t(h) * HD;
  const size_t lrow = (size_t(b) * NH + h) * T;
  const int q0 = qt * kRows, r0 = 16 * w;
  const float scale_log2 = scale * kLog2e;
  load_tile<HD>(Qs, base, ld, q0, T);
  load_tile<HD>(dOs, dout + size_t(b) * T * C + size_t(h) * HD, C, q0, T);
  const int row[2] = {q0 + r0 + g, q0 + r0 + g + 8};
  float lr[2], Dr[2];
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    lr[hi] = row[hi] < T ? lse[lrow + row[hi]] * kLog2e : 0.0f;
    Dr[hi] = row[hi] < T ? dbuf[lrow + row[hi]] : 0.0f;
  }
  float dq[ND][4] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kRows;
    __syncthreads();
    load_tile<HD>(Ks, base + C, ld, k0, T);
    load_tile<HD>(Vs, base + 2 * C, ld, k0, T);
    __syncthreads();
    float s[8][4], dp[8][4];
    two_products<HD>(s, dp, Qs, dOs, Ks, Vs, r0, g, t);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = k0 + 8 * n + 2 * t + (e & 1), hi = e >> 1;
        const bool ok = j <= row[hi] && row[hi] < T;
        s[n][e] = ok ? exp2f(s[n][e] * scale_log2 - lr[hi]) * (dp[n][e] - Dr[hi]) * scale : 0.0f;
      }
    acc_times_tile<HD>(dq, s, Ks, lane);
  }
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    if (row[hi] >= T) continue;
    store_row<HD>(dqkv + (size_t(b) * T + row[hi]) * ld + size_t(h) * HD, dq, hi, t, 1.0f);
  }
}

template <int HD>
bool forward_hd(float* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t s) {
  const size_t smem = 3 * tile_bytes<HD>();
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&fwd_k<HD>), smem)) return false;
  const int nt = (T + kRows - 1) / kRows;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  fwd_k<HD><<<nt * B * NH, kThreads, smem, s>>>(out, lse, qkv, T, C, NH, scale * kLog2e);
  return true;
}

template <int HD>
bool backward_hd(float* dqkv, const float* dbuf, const bf16* dout, const bf16* qkv, const float* lse, int B, int T,
                 int C, int NH, cudaStream_t s) {
  const size_t smem_kv = 4 * tile_bytes<HD>() + 2 * kRows * sizeof(float), smem_q = 4 * tile_bytes<HD>();
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&bwd_kv_k<HD>), smem_kv)) return false;
  if (!detail::allow_dynamic_smem(reinterpret_cast<const void*>(&bwd_q_k<HD>), smem_q)) return false;
  const int nt = (T + kRows - 1) / kRows;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  bwd_kv_k<HD><<<nt * B * NH, kThreads, smem_kv, s>>>(dqkv, dbuf, dout, qkv, lse, T, C, NH, scale);
  bwd_q_k<HD><<<nt * B * NH, kThreads, smem_q, s>>>(dqkv, dbuf, dout, qkv, lse, T, C, NH, scale);
  return true;
}

}  // namespace

bool attention_bf16_supported(int C, int NH) {
  if (NH <= 0 || C % NH != 0) return false;
  const int hd = C / NH;
  return hd == 32 || hd == 64 || hd == 128;
}

bool attention_forward_bf16(float* out, float* lse, const uint16_t* qkv16, int B, int T, int C, int NH,
                            cudaStream_t s) {
  if (B * T * NH == 0) return true;
  const bf16* qkv = reinterpret_cast<const bf16*>(qkv16);
  switch (C / NH) {
    case 32: return forward_hd<32>(out, lse, qkv, B, T, C, NH, s);
    case 64: return forward_hd<64>(out, lse, qkv, B, T, C, NH, s);
    case 128: return forward_hd<128>(out, lse, qkv, B, T, C, NH, s);
    default: return false;
  }
}

bool attention_backward_bf16(float* dqkv, const float* dbuf, const uint16_t* dout16, const uint16_t* qkv16,
                             const float* lse, int B, int T, int C, int NH, cudaStream_t s) {
  if (B * T * NH == 0) return true;
  const bf16* dout = reinterpret_cast<const bf16*>(dout16);
  const bf16* qkv = reinterpret_cast<const bf16*>(qkv16);
  switch (C / NH) {
    case 32: return backward_hd<32>(dqkv, dbuf, dout, qkv, lse, B, T, C, NH, s);
    case 64: return backward_hd<64>(dqkv, dbuf, dout, qkv, lse, B, T, C, NH, s);
    case 128: return backward_hd<128>(dqkv, dbuf, dout, qkv, lse, B, T, C, NH, s);
    default: return false;
  }
}

}  // namespace trident::cuda::launch
