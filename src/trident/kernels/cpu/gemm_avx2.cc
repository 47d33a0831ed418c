// Single-thread float32 GEMM for AVX2+FMA CPUs (Haswell and later Intel, AMD Zen 1-3, Intel client parts
// without AVX-512): C[M,N] (+)= op(A) op(B), row-major, the ISA level avx2's kernel.
//
// Why not OpenBLAS at this level: at training's small, skinny shapes OpenBLAS spends much of its time
// outside its FMA kernel (66% of the AVX2 peak at nanoGPT's shapes with its Haswell kernels), and Debian's
// OpenBLAS 0.3.21 falls back to its SSE3 (Prescott) kernels on any CPU model newer than it knows, at a
// third of that again. This kernel's speed depends on the CPU's features alone.
//
// Layout: op(B) is packed per 256-deep block into 16-column panels (rows of 16 floats, zero past N), one
// panel at a time, which every 6-row register tile of the block then reads from L1; A is broadcast straight
// from its rows (or, transposed, from consecutive floats of one stored row). Register tile: 6 rows x 16
// columns, twelve ymm accumulators.
//
// Numerics as the AVX-512 kernel's: every C element is one fused multiply-add chain over k = 0..K-1 in
// order, starting from 0 (or from C's old value when accumulating), carried through C between k blocks
// (a float stored and reloaded is exact). Results do not depend on the tiling or on M: run-to-run and
// batch-split deterministic.
//
// Compiled with AVX2/FMA target attributes (no global -march): callers check the ISA level (isa.h).
// Thread-safe for disjoint C; the only state is the thread-local packing buffer.
#include "trident/kernels/cpu/gemm_avx2.h"

#include <cstddef>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TRIDENT_HAVE_AVX2_GEMM 1
#endif

namespace trident::kernels::cpu::detail {

#ifdef TRIDENT_HAVE_AVX2_GEMM

#define TRIDENT_AVX2_FN __attribute__((target("avx2,fma")))

namespace {

constexpr int kMr = 6;    // rows of a register tile
constexpr int kNr = 16;   // columns of a register tile: two ymm
constexpr int kKc = 256;  // k per block: a packed 256 x 16 panel is 16 KiB, resident in L1
constexpr int kPrefetchK = 8;

alignas(64) thread_local float g_panel[kKc * kNr];

// Lane mask for the first n (0..8) lanes of a ymm.
TRIDENT_AVX2_FN inline __m256i lanes_below(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

// acc[MR][2] = (load_c ? C : 0) + sum_k A(i,k) B(k,j) over a packed panel (rows of 16 floats); C's columns
// [0, w) are read and written (w <= 16), the rest of the tile never touched.
template <int MR, bool kTransA>
TRIDENT_AVX2_FN __attribute__((noinline)) void micro(int K, const float* __restrict a, ptrdiff_t lda,
                                                     const float* __restrict pb, float* __restrict c, ptrdiff_t ldc,
                                                     int w, bool load_c) {
  __m256 acc[MR][2];
  const bool full = w == kNr;
  const __m256i m0 = lanes_below(w), m1 = lanes_below(w - 8);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    if (!load_c) {
      acc[i][0] = _mm256_setzero_ps();
      acc[i][1] = _mm256_setzero_ps();
    } else if (full) {
      acc[i][0] = _mm256_loadu_ps(c + i * ldc);
      acc[i][1] = _mm256_loadu_ps(c + i * ldc + 8);
    } else {
      acc[i][0] = _mm256_maskload_ps(c + i * ldc, m0);
      acc[i][1] = _mm256_maskload_ps(c + i * ldc + 8, m1);
    }
  }
  for (int k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_load_ps(pb), b1 = _mm256_load_ps(pb + 8);
    pb += kNr;
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_broadcast_ss(kTransA ? a + static_cast<ptrdiff_t>(k) * lda + i
                                                    : a + static_cast<ptrdiff_t>(i) * lda + k);
      acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
    }
    // A transposed: the next k's floats sit one stored row further, typically a new page, where the
    // hardware streamer stops; fetched this many k ahead.
    if (kTransA)
      _mm_prefetch(reinterpret_cast<const char*>(a + static_cast<ptrdiff_t>(k + kPrefetchK) * lda), _MM_HINT_T0);
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    if (full) {
      _mm256_storeu_ps(c + i * ldc, acc[i][0]);
      _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
    } else {
      _mm256_maskstore_ps(c + i * ldc, m0, acc[i][0]);
      _mm256_maskstore_ps(c + i * ldc + 8, m1, acc[i][1]);
    }
  }
}

using MicroFn = void (*)(int, const float*, ptrdiff_t, const float*, float*, ptrdiff_t, int, bool);
template <bool kTransA>
MicroFn pick(int mr) {
  switch (mr) {
    case 1: return &micro<1, kTransA>;
    case 2: return &micro<2, kTransA>;
    case 3: return &micro<3, kTransA>;
    case 4: return &micro<4, kTransA>;
    case 5: return &micro<5, kTransA>;
    default: return &micro<6, kTransA>;
  }
}

// In-register 8 x 8 transpose: rows r[0..7] in, r[c] = column c out.
TRIDENT_AVX2_FN inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);      // per 128-bit lane: a0 b0 a1 b1
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);  // a2 b2 a3 b3
  }
  for (int g = 0; g < 2; ++g) {  // rows 4g..4g+3
    u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);      // column 0 (lane 0) / 4 (lane 1)
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);      // column 1 / 5
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);  // column 2 / 6
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);  // column 3 / 7
  }
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
    r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
  }
}

// g_panel[k][jj] = op(B)(k0 + k, j0 + jj) for k < kc, jj < w; zero for jj in [w, 16).
TRIDENT_AVX2_FN void pack_panel(bool trans_b, const float* B, int ldb, int k0, int kc, int j0, int w) {
  float* dst = g_panel;
  if (!trans_b) {
    const __m256i m0 = lanes_below(w), m1 = lanes_below(w - 8);
    for (int k = 0; k < kc; ++k) {
      const float* src = B + static_cast<ptrdiff_t>(k0 + k) * ldb + j0;
      _mm256_store_ps(dst + k * kNr, _mm256_maskload_ps(src, m0));
      _mm256_store_ps(dst + k * kNr + 8, _mm256_maskload_ps(src + 8, m1));
    }
    return;
  }
  // op(B)(k, j) = B[j * ldb + k]: each stored row j is a column of the panel. 8 x 8 blocks (8 stored rows,
  // 8 consecutive k each) transposed in registers; rows past w load as zeros, k past kc are not stored.
  for (int jb = 0; jb < kNr; jb += 8) {
    for (int kb = 0; kb < kc; kb += 8) {
      const int kn = kc - kb < 8 ? kc - kb : 8;
      const __m256i km = lanes_below(kn);
      __m256 r[8];
      for (int q = 0; q < 8; ++q)
        r[q] = jb + q < w ? _mm256_maskload_ps(B + static_cast<ptrdiff_t>(j0 + jb + q) * ldb + k0 + kb, km)
                          : _mm256_setzero_ps();
      transpose8(r);
      for (int q = 0; q < kn; ++q) _mm256_store_ps(dst + (kb + q) * kNr + jb, r[q]);
    }
  }
}

// The triangular products of causal attention (gemm_avx512.h's Tri, tri_tile) skip the triangle's zeros
// as the AVX-512 kernel does: kLowerC computes C(i, j) for j <= i only; kLowerA reads A(i, k) for k <= i
// only, kUpperA for k >= i only (the rest of A is zero).
template <bool kTransA>
TRIDENT_AVX2_FN void run(bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                         bool accumulate, float* C, int ldc, Tri tri) {
  for (int k0 = 0; k0 < K; k0 += kKc) {
    const int kc = K - k0 < kKc ? K - k0 : kKc;
    for (int j0 = 0; j0 < N; j0 += kNr) {
      if (tri == Tri::kLowerC && j0 >= M) break;  // no row reaches these columns
      const int w = N - j0 < kNr ? N - j0 : kNr;
      pack_panel(trans_b, B, ldb, k0, kc, j0, w);
      for (int i0 = 0; i0 < M; i0 += kMr) {
        const int mr = M - i0 < kMr ? M - i0 : kMr;
        TriTile tt;
        if (!tri_tile(tri, i0, mr, j0, w, k0, kc, &tt)) continue;
        const int we = tt.we, ks = tt.ks, ke = tt.ke, kk = k0 + ks;
        const float* ai =
            kTransA ? A + static_cast<ptrdiff_t>(kk) * lda + i0 : A + static_cast<ptrdiff_t>(i0) * lda + kk;
        pick<kTransA>(mr)(ke - ks, ai, lda, g_panel + ks * kNr, C + static_cast<ptrdiff_t>(i0) * ldc + j0, ldc, we,
                          accumulate || k0 > tt.kfirst);
      }
    }
  }
}

}  // namespace

void gemm_avx2(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
               bool accumulate, float* C, int ldc, Tri tri) {
  if (M <= 0 || N <= 0 || K <= 0) return;  // gemm.cc answers K == 0 (C = 0 or C) before any kernel
  if (trans_a) run<true>(trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, tri);
  else run<false>(trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, tri);
}

#else

void gemm_avx2(bool, bool, int, int, int, const float*, int, const float*, int, bool, float*, int, Tri) {}

#endif

}  // namespace trident::kernels::cpu::detail
