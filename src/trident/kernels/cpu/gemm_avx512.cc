// Single-thread float32 GEMM for AVX-512 CPUs, tuned for the small, skinny products of training
// (K and N of 64..768): C[M,N] (+)= op(A) op(B), row-major.
//
// Why not OpenBLAS for these: at these sizes OpenBLAS spends a fifth of its time outside the FMA kernel
// (packing both operands for every call, zeroing C for beta 0). Here only B is packed, 128 x 64 floats at
// a time (once per call for all tiles, or per block into L1: gemm.cc chooses); A is broadcast straight
// from its rows (or, transposed, from consecutive floats of one row, fetched ahead), and C is written once.
//
// Numerics: every C element is one fused multiply-add chain over k = 0..K-1 in order, starting from 0
// (or from C's old value when accumulating). The result therefore does not depend on the tiling, on M,
// or on where an element falls in a tile: run-to-run and batch-split deterministic.
//
// bfloat16 products (Precision::kBFloat16) run on AVX512-BF16 (vdpbf16ps) or on AMX tiles where the CPU
// and the OS allow it (below).
//
// Compiled with AVX-512 / AMX target attributes (no global -march): callers must check
// the ISA level (isa.h). No state but thread-local packing buffers; thread-safe
// for disjoint C.
#include "trident/kernels/cpu/gemm_avx512.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "trident/kernels/cpu/isa.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TRIDENT_HAVE_AVX512_GEMM 1
#include "trident/kernels/cpu/avx512_transpose.h"
// GCC 12's AVX-512 headers trip -Wuninitialized on their own "undefined vector" idiom (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace trident::kernels::cpu::detail {

#ifdef TRIDENT_HAVE_AVX512_GEMM

#define TRIDENT_AVX512_FN __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,fma")))

namespace {

constexpr int kMr = 6;    // rows of a register tile
constexpr int kNv = 4;    // zmm vectors per tile row: 64 columns
constexpr int kNr = 16 * kNv;
constexpr int kKc = 128;  // k per block: a packed 128 x 64 panel is 32 KiB, resident in L1
constexpr int kPrefetchRowsA = 8;  // a transposed A is fetched this many k (about 100 cycles) ahead
// k per block of a product over packed panels: a block of one panel is at most 768 KiB (L2 holds it while
// the row tiles pass: 1 MiB on Zen 5, 2 MiB on Sapphire Rapids). K up to 3072 runs in one block; at
// llama3.2-1b's K 8192 (three blocks) the whole K in one block ran 8% slower than 2048-deep ones.
constexpr int kPackedDepth = 3072;

alignas(64) thread_local float g_pack[kKc * kNr];

// A register tile of C: acc = (load_c ? C : 0), and C = acc; the last vector of each row under `last`.
template <int MR, int NV>
TRIDENT_AVX512_FN __attribute__((always_inline)) inline void load_tile(__m512 (&acc)[MR][NV], const float* c,
                                                                       ptrdiff_t ldc, __mmask16 last, bool load_c) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (load_c) {
        acc[i][v] =
            v == NV - 1 ? _mm512_maskz_loadu_ps(last, c + i * ldc + 16 * v) : _mm512_loadu_ps(c + i * ldc + 16 * v);
      } else {
        acc[i][v] = _mm512_setzero_ps();
      }
    }
}
template <int MR, int NV>
TRIDENT_AVX512_FN __attribute__((always_inline)) inline void store_tile(const __m512 (&acc)[MR][NV], float* c,
                                                                        ptrdiff_t ldc, __mmask16 last) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (v == NV - 1) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, last, acc[i][v]);
      else _mm512_storeu_ps(c + i * ldc + 16 * v, acc[i][v]);
    }
}

// acc[MR][NV] = (load_c ? C : 0) + sum_k A(i,k) B(k,j) for one tile. B rows at stride ldb; the last
// vector of each row is stored under mask `last` (columns past N are never written) and, with kMaskB, also
// loaded under it: B read in place. A packed panel is zero past N, so its rows load whole: a masked load
// costs Intel cores an extra vector-ALU uop, one FMA slot in every 25 of the loop. kCopyB (B read in place)
// also stores each row of B it loads into pk (rows of 64 floats, zero past N) for the tiles after it:
// the stores ride in the store port's idle slots of an FMA-bound loop, where a separate packing pass
// would read B twice.
template <int MR, int NV, bool kTransA, bool kMaskB, bool kCopyB = false>
TRIDENT_AVX512_FN __attribute__((noinline)) void micro(int K, const float* __restrict a, ptrdiff_t lda,
                                                       const float* __restrict b, ptrdiff_t ldb, __mmask16 last,
                                                       float* __restrict c, ptrdiff_t ldc, bool load_c,
                                                       float* __restrict pk) {
  __m512 acc[MR][NV];
  load_tile<MR, NV>(acc, c, ldc, last, load_c);
  const float* ar[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) ar[i] = kTransA ? a + i : a + i * lda;
  for (int k = 0; k < K; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = kMaskB && v == NV - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
    b += ldb;
    if (kCopyB) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_store_ps(pk + 16 * v, bv[v]);
      pk += kNr;
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(kTransA ? ar[0][i] : ar[i][k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
    }
    if (kTransA) {
      // A transposed: the six floats of the next k sit one row of the stored A further, typically a new
      // page; the hardware streamer stops at pages, so the line is fetched ahead here.
      _mm_prefetch(reinterpret_cast<const char*>(ar[0] + kPrefetchRowsA * lda), _MM_HINT_T0);
      ar[0] += lda;
    }
  }
  store_tile<MR, NV>(acc, c, ldc, last);
}

using MicroFn = void (*)(int, const float*, ptrdiff_t, const float*, ptrdiff_t, __mmask16, float*, ptrdiff_t, bool,
                        float*);

template <bool kTransA, bool kMaskB, int MR>
constexpr MicroFn pick_nv(int nv) {
  return nv == 1   ? &micro<MR, 1, kTransA, kMaskB>
         : nv == 2 ? &micro<MR, 2, kTransA, kMaskB>
         : nv == 3 ? &micro<MR, 3, kTransA, kMaskB>
                   : &micro<MR, 4, kTransA, kMaskB>;
}

template <bool kTransA, bool kMaskB>
MicroFn pick_mr(int mr, int nv) {
  switch (mr) {
    case 1: return pick_nv<kTransA, kMaskB, 1>(nv);
    case 2: return pick_nv<kTransA, kMaskB, 2>(nv);
    case 3: return pick_nv<kTransA, kMaskB, 3>(nv);
    case 4: return pick_nv<kTransA, kMaskB, 4>(nv);
    case 5: return pick_nv<kTransA, kMaskB, 5>(nv);
    default: return pick_nv<kTransA, kMaskB, 6>(nv);
  }
}
template <bool kTransA>
MicroFn pick(int mr, int nv, bool mask_b) {
  return mask_b ? pick_mr<kTransA, true>(mr, nv) : pick_mr<kTransA, false>(mr, nv);
}
// A full-height tile that reads B in place and packs it (kCopyB).
template <bool kTransA>
MicroFn pick_copy(int nv) {
  return nv == 1   ? &micro<kMr, 1, kTransA, true, true>
         : nv == 2 ? &micro<kMr, 2, kTransA, true, true>
         : nv == 3 ? &micro<kMr, 3, kTransA, true, true>
                   : &micro<kMr, 4, kTransA, true, true>;
}

// dst[k][jj] (rows of 64 floats, 64-byte aligned) = B(k0 + k, j0 + jj) for a transposed B (B(k,j) =
// b[j*ldb + k]); jj < w, zero beyond up to the next multiple of 16. 16 x 16 blocks: 16 rows of b (16
// contiguous k each) transposed in registers.
TRIDENT_AVX512_FN void pack_transposed(float* dst, const float* b, ptrdiff_t ldb, int k0, int kc, int j0, int w) {
  const int wp = (w + 15) / 16 * 16;
  for (int jb = 0; jb < wp; jb += 16) {
    const int jn = w - jb < 16 ? w - jb : 16;
    for (int kb = 0; kb < kc; kb += 16) {
      const int kn = kc - kb < 16 ? kc - kb : 16;
      const __mmask16 km = static_cast<__mmask16>((1u << kn) - 1u);
      __m512 r[16];
      for (int jj = 0; jj < 16; ++jj)
        r[jj] = jj < jn ? _mm512_maskz_loadu_ps(km, b + (j0 + jb + jj) * ldb + k0 + kb) : _mm512_setzero_ps();
      transpose16(r);
      for (int kk = 0; kk < kn; ++kk) _mm512_store_ps(dst + (kb + kk) * kNr + jb, r[kk]);
    }
  }
}

// dst[k][jj] (rows of 64 floats, 64-byte aligned) = B(k0 + k, j0 + jj) for an untransposed B (B(k,j) =
// b[k*ldb + j]); jj < w, zero beyond.
TRIDENT_AVX512_FN void pack_rows(float* dst, const float* b, ptrdiff_t ldb, int k0, int kc, int j0, int w) {
  for (int k = 0; k < kc; ++k) {
    const float* src = b + static_cast<ptrdiff_t>(k0 + k) * ldb + j0;
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) {
      const int n = w - 16 * v <= 0 ? 0 : (w - 16 * v < 16 ? w - 16 * v : 16);
      _mm512_store_ps(dst + k * kNr + 16 * v,
                      _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), src + 16 * v));
    }
  }
}

// Packs the 64-column panels [p0, p1) of op(B) (K x N) in the layout of gemm_avx512_pack_b (header).
TRIDENT_AVX512_FN void pack_b_panels(bool trans_b, int N, int K, const float* B, int ldb, float* out, int p0, int p1) {
  for (int p = p0; p < p1; ++p) {
    const int j0 = p * kNr;
    const int w = N - j0 < kNr ? N - j0 : kNr;
    for (int k0 = 0; k0 < K; k0 += kKc) {
      const int kc = K - k0 < kKc ? K - k0 : kKc;
      float* dst = out + (static_cast<ptrdiff_t>(p) * K + k0) * kNr;
      if (trans_b) pack_transposed(dst, B, ldb, k0, kc, j0, w);
      else pack_rows(dst, B, ldb, k0, kc, j0, w);
    }
  }
}

// packed: op(B) already in the layout of gemm_avx512_pack_b, this call's column 0 at its column pj0 (a
// multiple of 64): panels outer, then k in at most kPackedDepth-deep blocks, row tiles inner, each tile's
// block in registers. C is read and written once per tile and block, where 128-deep blocks carried it
// through memory K / 128 times (at GPT-2 widths C is megabytes: each pass reloaded it from L3 and each
// tile's start stalled on it); the panel's block streams from L2, A's rows from their rows.
// null: each 128 x 64 block of op(B) packed here into the L1 panel (a transposed B up front; an
// untransposed one by the first row tile as it reads it, or read in place by every tile when one or two
// row tiles use the block or the product is triangular).
template <bool kTransA>
TRIDENT_AVX512_FN void run(bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                           bool accumulate, float* C, int ldc, Tri tri, const float* packed = nullptr,
                           int pj0 = 0) {
  if (packed != nullptr) {
    const int nb = (K + kPackedDepth - 1) / kPackedDepth, kcp = (K + nb - 1) / nb;
    for (int j0 = 0; j0 < N; j0 += kNr) {
      const int w = N - j0 < kNr ? N - j0 : kNr;
      const int nv = (w + 15) / 16;
      const __mmask16 last = static_cast<__mmask16>(w % 16 == 0 ? 0xffffu : (1u << (w % 16)) - 1u);
      const float* panel = packed + static_cast<ptrdiff_t>((pj0 + j0) / kNr) * K * kNr;
      for (int k0 = 0; k0 < K; k0 += kcp) {
        const int kc = K - k0 < kcp ? K - k0 : kcp;
        for (int i0 = 0; i0 < M; i0 += kMr) {
          const int mr = M - i0 < kMr ? M - i0 : kMr;
          const float* ai = kTransA ? A + static_cast<ptrdiff_t>(k0) * lda + i0 : A + static_cast<ptrdiff_t>(i0) * lda + k0;
          pick<kTransA>(mr, nv, false)(kc, ai, lda, panel + static_cast<ptrdiff_t>(k0) * kNr, kNr, last,
                                       C + static_cast<ptrdiff_t>(i0) * ldc + j0, ldc, accumulate || k0 > 0, nullptr);
        }
      }
    }
    return;
  }
  for (int k0 = 0; k0 < K; k0 += kKc) {
    const int kc = K - k0 < kKc ? K - k0 : kKc;
    for (int j0 = 0; j0 < N; j0 += kNr) {
      const int w = N - j0 < kNr ? N - j0 : kNr;
      const float* bp;
      ptrdiff_t bs;
      bool mask_b = false;  // B read in place: its last vector loads under the mask
      bool copy_b = false;  // the first row tile packs B into g_pack as it reads it
      if (trans_b) {
        pack_transposed(g_pack, B, ldb, k0, kc, j0, w);
        bp = g_pack;
        bs = kNr;
      } else if (M > 2 * kMr && tri == Tri::kNone) {
        // Three or more row tiles read all of this block: the first reads B in place and packs it into
        // the L1 panel for the others; rows of B in place would come from as few cache sets as B's
        // stride allows (two, at 2 KiB) and from L2. (The triangular products of attention read parts
        // of small blocks: packing them cost it 5-10%.)
        bp = B + static_cast<ptrdiff_t>(k0) * ldb + j0;
        bs = ldb;
        mask_b = true;
        copy_b = true;
      } else {
        bp = B + static_cast<ptrdiff_t>(k0) * ldb + j0;
        bs = ldb;
        mask_b = true;
      }
      for (int i0 = 0; i0 < M; i0 += kMr) {
        const int mr = M - i0 < kMr ? M - i0 : kMr;
        TriTile tt;
        if (!tri_tile(tri, i0, mr, j0, w, k0, kc, &tt)) continue;
        const int we = tt.we, ks = tt.ks, ke = tt.ke, kfirst = tt.kfirst;
        const int nv = (we + 15) / 16;
        const __mmask16 last = static_cast<__mmask16>(we % 16 == 0 ? 0xffffu : (1u << (we % 16)) - 1u);
        const bool load_c = accumulate || k0 > kfirst;
        const int kk = k0 + ks;
        const float* ai =
            kTransA ? A + static_cast<ptrdiff_t>(kk) * lda + i0 : A + static_cast<ptrdiff_t>(i0) * lda + kk;
        float* ci = C + static_cast<ptrdiff_t>(i0) * ldc + j0;
        if (copy_b) {  // tri is kNone: ks = 0, ke = kc, mr = kMr
          pick_copy<kTransA>(nv)(kc, ai, lda, bp, bs, last, ci, ldc, load_c, g_pack);
          bp = g_pack;
          bs = kNr;
          mask_b = copy_b = false;
          continue;
        }
        pick<kTransA>(mr, nv, mask_b)(ke - ks, ai, lda, bp + static_cast<ptrdiff_t>(ks) * bs, bs, last, ci, ldc,
                                      load_c, nullptr);
      }
    }
  }
}



// ---- bfloat16 products on AMX (tdpbf16ps: a 16 x 16 float32 tile += 16 x 32 bf16 times 32 x 16 bf16) ----
// Operands are rounded to bfloat16 (round-to-nearest-even) into padded thread-local buffers: A as
// [Mp][Kp] bf16 rows, B as [Kp/2][Np] 32-bit words each holding the pair B(2p, j), B(2p+1, j). The product
// lands in a padded float32 buffer and is added to (or copied into) C. Tiles: 0-3 C (32 x 32), 4-5 A, 6-7 B.
#define TRIDENT_BF16_FN __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx512bf16,fma")))
#define TRIDENT_AMX_FN \
  __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx512bf16,amx-tile,amx-bf16,fma")))

thread_local std::vector<uint16_t> g_a16;
thread_local std::vector<uint32_t> g_b16, g_t16;
thread_local std::vector<float> g_c32;

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// out[0..npad) = bf16(x[0..n)), zero past n (npad a multiple of 32).
TRIDENT_BF16_FN void row_to_bf16(uint16_t* out, const float* x, int n, int npad) {
  for (int k0 = 0; k0 < npad; k0 += 32) {
    const int nlo = n - k0 <= 0 ? 0 : (n - k0 < 16 ? n - k0 : 16);
    const int nhi = n - k0 - 16 <= 0 ? 0 : (n - k0 - 16 < 16 ? n - k0 - 16 : 16);
    const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << nlo) - 1u), x + k0);
    const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << nhi) - 1u), x + k0 + 16);
    _mm512_storeu_si512(out + k0, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}

// words[i] for i < npad: (bf16(r0[i]), bf16(r1[i])), zero past n; null rows read as zeros.
TRIDENT_BF16_FN void interleave_pairs(uint32_t* words, const float* r0, const float* r1, int n, int npad) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int i = 0; i < npad; i += 16) {
    const int v = n - i <= 0 ? 0 : (n - i < 16 ? n - i : 16);
    const __mmask16 m = static_cast<__mmask16>((1u << v) - 1u);
    const __m512 a = r0 ? _mm512_maskz_loadu_ps(m, r0 + i) : _mm512_setzero_ps();
    const __m512 b = r1 ? _mm512_maskz_loadu_ps(m, r1 + i) : _mm512_setzero_ps();
    const __m512i x = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // low half a, high half b
    _mm512_storeu_si512(words + i, _mm512_permutexvar_epi16(idx, x));
  }
}

// The packed operands of one bfloat16 product: A as [Mp][Kp] bf16 rows, B as [Kp/2][Np] pair words
// (dimensions padded to multiples of 32 with zeros).
struct PackedBf16 {
  int Mp, Np, Kp;
  const uint16_t* a;
  const uint32_t* b;
};

TRIDENT_BF16_FN PackedBf16 pack_bf16_operands(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                                              const float* B, int ldb) {
  const int Mp = (M + 31) / 32 * 32, Np = (N + 31) / 32 * 32, Kp = (K + 31) / 32 * 32, kp = Kp / 2;
  g_a16.resize(static_cast<size_t>(Mp) * Kp);
  g_b16.resize(static_cast<size_t>(kp) * Np);
  uint16_t* a = g_a16.data();
  uint32_t* b = g_b16.data();
  // A -> [Mp][Kp] bf16.
  if (!trans_a) {
    for (int i = 0; i < Mp; ++i) row_to_bf16(a + static_cast<ptrdiff_t>(i) * Kp, A + static_cast<ptrdiff_t>(i) * lda,
                                              i < M ? K : 0, Kp);
  } else {  // A(i,k) = A[k*lda + i]: 16 x 16 transposes, two per 32 k.
    for (int i0 = 0; i0 < Mp; i0 += 16) {
      const int iv = M - i0 <= 0 ? 0 : (M - i0 < 16 ? M - i0 : 16);
      const __mmask16 im = static_cast<__mmask16>((1u << iv) - 1u);
      for (int k0 = 0; k0 < Kp; k0 += 32) {
        __m512 lo[16], hi[16];
        for (int kk = 0; kk < 16; ++kk) {
          lo[kk] = k0 + kk < K ? _mm512_maskz_loadu_ps(im, A + static_cast<ptrdiff_t>(k0 + kk) * lda + i0)
                               : _mm512_setzero_ps();
          hi[kk] = k0 + 16 + kk < K ? _mm512_maskz_loadu_ps(im, A + static_cast<ptrdiff_t>(k0 + 16 + kk) * lda + i0)
                                    : _mm512_setzero_ps();
        }
        transpose16(lo);
        transpose16(hi);
        for (int ii = 0; ii < 16; ++ii)
          _mm512_storeu_si512(a + static_cast<ptrdiff_t>(i0 + ii) * Kp + k0,
                              reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi[ii], lo[ii])));
      }
    }
  }
  // B -> [kp][Np] pair words.
  if (!trans_b) {
    for (int p = 0; p < kp; ++p) {
      const float* r0 = 2 * p < K ? B + static_cast<ptrdiff_t>(2 * p) * ldb : nullptr;
      const float* r1 = 2 * p + 1 < K ? B + static_cast<ptrdiff_t>(2 * p + 1) * ldb : nullptr;
      interleave_pairs(b + static_cast<ptrdiff_t>(p) * Np, r0, r1, N, Np);
    }
  } else {  // B(k,j) = B[j*ldb + k]: rows j -> bf16 [Np][Kp] (= words [Np][kp]), then a 32-bit transpose.
    g_t16.resize(static_cast<size_t>(Np) * kp);
    uint32_t* t = g_t16.data();
    for (int j = 0; j < Np; ++j)
      row_to_bf16(reinterpret_cast<uint16_t*>(t + static_cast<ptrdiff_t>(j) * kp), B + static_cast<ptrdiff_t>(j) * ldb,
                  j < N ? K : 0, Kp);
    for (int j0 = 0; j0 < Np; j0 += 16)
      for (int p0 = 0; p0 < kp; p0 += 16) {
        __m512 r[16];
        for (int jj = 0; jj < 16; ++jj)
          r[jj] = _mm512_castsi512_ps(_mm512_loadu_si512(t + static_cast<ptrdiff_t>(j0 + jj) * kp + p0));
        transpose16(r);
        for (int pp = 0; pp < 16; ++pp)
          _mm512_storeu_si512(b + static_cast<ptrdiff_t>(p0 + pp) * Np + j0, _mm512_castps_si512(r[pp]));
      }
  }
  return PackedBf16{Mp, Np, Kp, a, b};
}

constexpr int kPrefetchPairsA = 64;  // 256 bytes ahead in each row of A
// acc[MR][NV] = (load_c ? C : 0) + sum over pairs p of A(i, 2p..2p+1) . B(2p..2p+1, j): one vdpbf16ps per
// pair and vector. a: bf16 rows at stride sa (elements), or with kPairRowsA pair words [p][i] at stride sa
// (words) per pair; b: pair words at stride sb; C stored under `last`.
template <int MR, int NV, bool kPairRowsA = false>
TRIDENT_BF16_FN __attribute__((noinline)) void micro_bf16(int pairs, const uint16_t* __restrict a, ptrdiff_t sa,
                                                          const uint32_t* __restrict b, ptrdiff_t sb, __mmask16 last,
                                                          float* __restrict c, ptrdiff_t ldc, bool load_c) {
  __m512 acc[MR][NV];
  load_tile<MR, NV>(acc, c, ldc, last, load_c);
  const int32_t* ar[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) ar[i] = reinterpret_cast<const int32_t*>(a) + (kPairRowsA ? i : i * sa / 2);
  ptrdiff_t off = 0;  // of pair p: p (rows) or p * sa (pair rows)
  for (int p = 0; p < pairs; ++p) {
    // A comes from L2: one line fetched ahead per pair (the rows in turn; pair rows: the row 8 pairs on).
    if (kPairRowsA) _mm_prefetch(reinterpret_cast<const char*>(ar[0] + off + 8 * sa), _MM_HINT_T0);
    else _mm_prefetch(reinterpret_cast<const char*>(ar[p % MR] + p + kPrefetchPairsA), _MM_HINT_T0);
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + 16 * v);
    b += sb;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(ar[i][off]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
    off += kPairRowsA ? sa : 1;
  }
  store_tile<MR, NV>(acc, c, ldc, last);
}

using MicroBf16Fn = void (*)(int, const uint16_t*, ptrdiff_t, const uint32_t*, ptrdiff_t, __mmask16, float*, ptrdiff_t,
                             bool);
template <int MR, bool kPairRowsA>
constexpr MicroBf16Fn pick_bf16_nv(int nv) {
  return nv == 1   ? &micro_bf16<MR, 1, kPairRowsA>
         : nv == 2 ? &micro_bf16<MR, 2, kPairRowsA>
         : nv == 3 ? &micro_bf16<MR, 3, kPairRowsA>
                   : &micro_bf16<MR, 4, kPairRowsA>;
}
template <bool kPairRowsA>
MicroBf16Fn pick_bf16_mr(int mr, int nv) {
  switch (mr) {
    case 1:
      return pick_bf16_nv<1, kPairRowsA>(nv);
    case 2:
      return pick_bf16_nv<2, kPairRowsA>(nv);
    case 3:
      return pick_bf16_nv<3, kPairRowsA>(nv);
    case 4:
      return pick_bf16_nv<4, kPairRowsA>(nv);
    case 5:
      return pick_bf16_nv<5, kPairRowsA>(nv);
    default:
      return pick_bf16_nv<6, kPairRowsA>(nv);
  }
}
MicroBf16Fn pick_bf16(int mr, int nv, bool pair_rows_a = false) {
  return pair_rows_a ? pick_bf16_mr<true>(mr, nv) : pick_bf16_mr<false>(mr, nv);
}

// Register tiles of 6 rows x 64 columns; k in blocks of 256 (a 128-pair x 64-column B panel, 32 KiB, stays
// in L1 while the rows stream past it). The padded tails of the packed operands are zeros.
constexpr int kBf16PairsPerBlock = 128;

TRIDENT_AMX_FN void amx_bf16(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                             int ldb, bool accumulate, float* C, int ldc) {
  const PackedBf16 pk = pack_bf16_operands(trans_a, trans_b, M, N, K, A, lda, B, ldb);
  const int Mp = pk.Mp, Np = pk.Np, Kp = pk.Kp;
  const uint16_t* a = pk.a;
  const uint32_t* b = pk.b;
  g_c32.resize(static_cast<size_t>(Mp) * Np);
  float* c = g_c32.data();
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  const long sa = static_cast<long>(Kp) * 2, sb = static_cast<long>(Np) * 4, sc = static_cast<long>(Np) * 4;
  for (int i0 = 0; i0 < Mp; i0 += 32)
    for (int j0 = 0; j0 < Np; j0 += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int k0 = 0; k0 < Kp; k0 += 32) {
        _tile_loadd(4, a + static_cast<ptrdiff_t>(i0) * Kp + k0, sa);
        _tile_loadd(5, a + static_cast<ptrdiff_t>(i0 + 16) * Kp + k0, sa);
        _tile_loadd(6, b + static_cast<ptrdiff_t>(k0 / 2) * Np + j0, sb);
        _tile_loadd(7, b + static_cast<ptrdiff_t>(k0 / 2) * Np + j0 + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c + static_cast<ptrdiff_t>(i0) * Np + j0, sc);
      _tile_stored(1, c + static_cast<ptrdiff_t>(i0) * Np + j0 + 16, sc);
      _tile_stored(2, c + static_cast<ptrdiff_t>(i0 + 16) * Np + j0, sc);
      _tile_stored(3, c + static_cast<ptrdiff_t>(i0 + 16) * Np + j0 + 16, sc);
    }
  _tile_release();
  for (int i = 0; i < M; ++i) {
    float* ci = C + static_cast<ptrdiff_t>(i) * ldc;
    const float* pi = c + static_cast<ptrdiff_t>(i) * Np;
    for (int j = 0; j < N; j += 16) {
      const __mmask16 m = static_cast<__mmask16>(N - j < 16 ? (1u << (N - j)) - 1u : 0xffffu);
      __m512 v = _mm512_maskz_loadu_ps(m, pi + j);
      if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, ci + j), v);
      _mm512_mask_storeu_ps(ci + j, m, v);
    }
  }
}

}  // namespace

namespace {
// The bfloat16 GEMMs' entry: nothing for an empty C; for K == 0, C = (accumulate ? C : 0).
using Bf16Impl = void (*)(bool, bool, int, int, int, const float*, int, const float*, int, bool, float*, int);
void bf16_entry(Bf16Impl impl, bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                const float* B, int ldb, bool accumulate, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    gemm_avx512(trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
    return;
  }
  impl(trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}
}  // namespace

void gemm_amx_bf16(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                   bool accumulate, float* C, int ldc) {
  bf16_entry(amx_bf16, trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}

int dpbf16_pairs(int K) { return K <= 0 ? 0 : (K + 31) / 32 * 16; }
size_t dpbf16_packed_a_halves(int M, int K) {
  return static_cast<size_t>((M + 15) / 16 * 16) * 2 * static_cast<size_t>(dpbf16_pairs(K));
}
size_t dpbf16_packed_b_words(int N, int K) {
  return static_cast<size_t>((N + kNr - 1) / kNr * kNr) * static_cast<size_t>(dpbf16_pairs(K));
}

TRIDENT_BF16_FN void dpbf16_pack_a(bool trans_a, int M, int K, const float* A, int lda, uint16_t* packed, int i0,
                                   int i1) {
  const int kp = dpbf16_pairs(K), Kp = 2 * kp;
  if (!trans_a) {
    for (int i = i0; i < i1; ++i)
      row_to_bf16(packed + static_cast<ptrdiff_t>(i) * Kp, A + static_cast<ptrdiff_t>(i) * lda, K, Kp);
    return;
  }
  // A(i, k) = A[k * lda + i]: rows 2q and 2q + 1 of the stored A interleave into pair row q, no transposes.
  const int mp = (M + 15) / 16 * 16;
  const int n = i1 - i0, npad = ((i1 < M ? i1 : mp) - i0 + 15) / 16 * 16;
  uint32_t* words = reinterpret_cast<uint32_t*>(packed);
  for (int q = 0; q < kp; ++q) {
    const int k = 2 * q;
    const float* r0 = k < K ? A + static_cast<ptrdiff_t>(k) * lda + i0 : nullptr;
    const float* r1 = k + 1 < K ? A + static_cast<ptrdiff_t>(k + 1) * lda + i0 : nullptr;
    interleave_pairs(words + static_cast<ptrdiff_t>(q) * mp + i0, r0, r1, n, npad);
  }
}

TRIDENT_BF16_FN void dpbf16_pack_b(bool trans_b, int N, int K, const float* B, int ldb, uint32_t* packed, int p0,
                                   int p1) {
  const int kp = dpbf16_pairs(K), np = (N + kNr - 1) / kNr * kNr;
  alignas(64) static thread_local uint32_t t[kNr * kBf16PairsPerBlock];  // a transposed B's panel, [64][pc]
  for (int q0 = 0; q0 < kp; q0 += kBf16PairsPerBlock) {
    const int pc = kp - q0 < kBf16PairsPerBlock ? kp - q0 : kBf16PairsPerBlock;
    const int k0 = 2 * q0, kn = K - k0 < 2 * pc ? K - k0 : 2 * pc;  // k of this block present in B
    for (int p = p0; p < p1; ++p) {
      const int j0 = p * kNr, w = N - j0 < kNr ? N - j0 : kNr;
      uint32_t* dst = packed + static_cast<ptrdiff_t>(q0) * np + static_cast<ptrdiff_t>(j0) * pc;
      if (!trans_b) {
        for (int q = 0; q < pc; ++q) {
          const int k = k0 + 2 * q;
          const float* r0 = k < K ? B + static_cast<ptrdiff_t>(k) * ldb + j0 : nullptr;
          const float* r1 = k + 1 < K ? B + static_cast<ptrdiff_t>(k + 1) * ldb + j0 : nullptr;
          interleave_pairs(dst + static_cast<ptrdiff_t>(q) * kNr, r0, r1, w, kNr);
        }
        continue;
      }
      // B(k, j) = B[j * ldb + k]: each column's pairs are consecutive words of its bf16 row; 16 x 16 word
      // transposes turn [64][pc] into [pc][64].
      for (int jj = 0; jj < kNr; ++jj)
        row_to_bf16(reinterpret_cast<uint16_t*>(t + static_cast<ptrdiff_t>(jj) * pc),
                    jj < w ? B + static_cast<ptrdiff_t>(j0 + jj) * ldb + k0 : B, jj < w ? kn : 0, 2 * pc);
      for (int jb = 0; jb < kNr; jb += 16)
        for (int qb = 0; qb < pc; qb += 16) {
          __m512 r[16];
          for (int jj = 0; jj < 16; ++jj)
            r[jj] = _mm512_castsi512_ps(_mm512_load_si512(t + static_cast<ptrdiff_t>(jb + jj) * pc + qb));
          transpose16(r);
          for (int qq = 0; qq < 16; ++qq)
            _mm512_store_si512(dst + static_cast<ptrdiff_t>(qb + qq) * kNr + jb, _mm512_castps_si512(r[qq]));
        }
    }
  }
}

TRIDENT_BF16_FN void dpbf16_packed(bool trans_a, int M, int N, int K, const uint16_t* a, int ma, const uint32_t* b,
                                   int np, int j0, bool accumulate, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    gemm_avx512(false, false, M, N, K, nullptr, 0, nullptr, 0, accumulate, C, ldc);
    return;
  }
  const int kp = dpbf16_pairs(K), Kp = 2 * kp;
  // Panels outer, pair blocks inside: the 6 x 64 tiles of C stay in L1/L2 across the blocks, A's rows in L2
  // across the panels, and B streams past once.
  for (int jj = 0; jj < N; jj += kNr) {
    const int w = N - jj < kNr ? N - jj : kNr;
    const int nv = (w + 15) / 16;
    const __mmask16 last = static_cast<__mmask16>(w % 16 == 0 ? 0xffffu : (1u << (w % 16)) - 1u);
    for (int q0 = 0; q0 < kp; q0 += kBf16PairsPerBlock) {
      const int pc = kp - q0 < kBf16PairsPerBlock ? kp - q0 : kBf16PairsPerBlock;
      const uint32_t* bp = b + static_cast<ptrdiff_t>(q0) * np + static_cast<ptrdiff_t>(j0 + jj) * pc;
      for (int i0 = 0; i0 < M; i0 += kMr) {
        const int mr = M - i0 < kMr ? M - i0 : kMr;
        if (trans_a)  // pair rows of ma words (the whole A's rows, padded): this tile's 6 words start at i0
          pick_bf16(mr, nv, true)(pc, a + 2 * (static_cast<ptrdiff_t>(q0) * ma + i0), ma, bp, kNr, last,
                                  C + static_cast<ptrdiff_t>(i0) * ldc + jj, ldc, accumulate || q0 > 0);
        else
          pick_bf16(mr, nv)(pc, a + static_cast<ptrdiff_t>(i0) * Kp + 2 * q0, Kp, bp, kNr, last,
                            C + static_cast<ptrdiff_t>(i0) * ldc + jj, ldc, accumulate || q0 > 0);
      }
    }
  }
}

namespace {
constexpr int kProbeAcc = 24;     // independent accumulators: more than latency x issue rate on any x86 core
constexpr int kProbeIters = 1500;  // per run: 36k instructions
constexpr int kProbeRuns = 7;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sums the accumulators into a volatile, so the compiler cannot drop the loop that produced them.
TRIDENT_AVX512_FN __attribute__((always_inline)) inline void keep_alive(const __m512 (&acc)[kProbeAcc]) {
  __m512 sum = acc[0];
  for (int i = 1; i < kProbeAcc; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
}

// Each run: kProbeIters rounds of one instruction on every accumulator. The empty asm keeps the compiler
// from folding the loop (the operand "changes" every round); the final sum keeps the results alive.
TRIDENT_BF16_FN double dpbf16_run() {
  __m512 acc[kProbeAcc];
  for (int i = 0; i < kProbeAcc; ++i) acc[i] = _mm512_setzero_ps();
  __m512i x = _mm512_set1_epi32(0x3f803f80);  // bf16 pairs (1, 1)
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < kProbeIters; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < kProbeAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)x, (__m512bh)x);
    __asm__ volatile("" : "+v"(x));
  }
  const double s = seconds_since(t0);
  keep_alive(acc);
  return 2.0 * 32 * kProbeAcc * kProbeIters / s * 1e-9;
}

TRIDENT_AVX512_FN double fma_run() {
  __m512 acc[kProbeAcc];
  for (int i = 0; i < kProbeAcc; ++i) acc[i] = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < kProbeIters; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < kProbeAcc; ++i) acc[i] = _mm512_fmadd_ps(x, x, acc[i]);
    __asm__ volatile("" : "+v"(x));
  }
  const double s = seconds_since(t0);
  keep_alive(acc);
  return 2.0 * 16 * kProbeAcc * kProbeIters / s * 1e-9;
}

template <class F>
double best_of_runs(F run) {
  for (int i = 0; i < 3; ++i) fma_run();  // warm-up: the core raises its AVX-512 power state first
  double best = 0;
  for (int i = 0; i < kProbeRuns; ++i) best = std::max(best, run());
  return best;
}
}  // namespace

double probe_dpbf16_gflops() {
  if (static_cast<int>(machine_isa()) < static_cast<int>(Isa::kAvx512Bf16)) return 0;
  return best_of_runs(dpbf16_run);
}
double probe_fma_gflops() {
  if (static_cast<int>(machine_isa()) < static_cast<int>(Isa::kAvx512)) return 0;
  return best_of_runs(fma_run);
}

void gemm_avx512(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                 bool accumulate, float* C, int ldc, Tri tri) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) C[static_cast<ptrdiff_t>(i) * ldc + j] = 0.0f;
    return;
  }
  if (trans_a) run<true>(trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, tri);
  else run<false>(trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, tri);
}

size_t gemm_avx512_packed_b_floats(int N, int K) {
  return static_cast<size_t>(K < 0 ? 0 : K) * static_cast<size_t>((N + kNr - 1) / kNr * kNr);
}

void gemm_avx512_pack_b(bool trans_b, int N, int K, const float* B, int ldb, float* packed, int p0, int p1) {
  if (N <= 0 || K <= 0) return;
  pack_b_panels(trans_b, N, K, B, ldb, packed, p0, p1);
}

void gemm_avx512_packed(bool trans_a, int M, int N, int K, const float* A, int lda, const float* packed, int j0,
                        bool accumulate, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    gemm_avx512(trans_a, false, M, N, K, A, lda, nullptr, 0, accumulate, C, ldc);
    return;
  }
  if (trans_a) run<true>(false, M, N, K, A, lda, nullptr, 0, accumulate, C, ldc, Tri::kNone, packed, j0);
  else run<false>(false, M, N, K, A, lda, nullptr, 0, accumulate, C, ldc, Tri::kNone, packed, j0);
}

#else

void gemm_amx_bf16(bool, bool, int, int, int, const float*, int, const float*, int, bool, float*, int) {}
void gemm_avx512(bool, bool, int, int, int, const float*, int, const float*, int, bool, float*, int, Tri) {}
size_t gemm_avx512_packed_b_floats(int, int) { return 0; }
int dpbf16_pairs(int) { return 0; }
size_t dpbf16_packed_a_halves(int, int) { return 0; }
size_t dpbf16_packed_b_words(int, int) { return 0; }
void dpbf16_pack_a(bool, int, int, const float*, int, uint16_t*, int, int) {}
void dpbf16_pack_b(bool, int, int, const float*, int, uint32_t*, int, int) {}
void dpbf16_packed(bool, int, int, int, const uint16_t*, int, const uint32_t*, int, int, bool, float*, int) {}
double probe_dpbf16_gflops() { return 0; }
double probe_fma_gflops() { return 0; }
void gemm_avx512_pack_b(bool, int, int, const float*, int, float*, int, int) {}
void gemm_avx512_packed(bool, int, int, int, const float*, int, const float*, int, bool, float*, int) {}

#endif

}  // namespace trident::kernels::cpu::detail
