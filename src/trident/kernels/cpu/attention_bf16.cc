// Causal attention with bfloat16 operands and float32 accumulation, FlashAttention-2's scheme on
// AVX512-BF16 (vdpbf16ps: each instruction adds two bf16 products per float32 lane).
//
// Tiles of 64 query rows x 64 keys; no T x T matrix exists, and tiles above the diagonal are skipped (on
// the diagonal, each 6-row register group computes only the keys up to its last row).
// Forward, one task per (batch, head, query tile): S = Q K^T (bf16 q, k), online softmax over the key tiles
// (running max m and sum l per row; a new tile rescales the output accumulator by exp(m_old - m_new)),
// O += P V with P rounded to bf16; out = O / l, lse = m + log l saved for the backward.
// Backward, one task per (batch, head): key tiles outer, query tiles inner; P = exp(scale S - lse) is
// recomputed per tile, dP = dO V^T, dS = P (dP - D) scale; dV and dK of the key tile accumulate in float32
// across the query tiles, dQ in a float32 buffer of the head across the key tiles (key tiles ascending).
// Every output element is one float32 chain in an order fixed by the shape, so the result is bitwise the
// same on any thread count; it differs from the float32 kernel by the bf16 rounding of the operands (q, k,
// v, dO, P, dS), as a bf16 GEMM does.
//
// Operand layouts (32-bit words, each two bf16 values):
//   rows:      [rows][hw]: row r's values along the head dim, in pairs (hw = pairs rounded up to 16);
//   transposed [Tp/64][hp][64]: word (p, j) = (X[j][2p], X[j][2p + 1]) in key tile j / 64, keys along the
//                          lanes (the B operand of products that reduce over the head dim);
//   row pairs  [Tp/2][hdv]: word (s, d) = (X[2s][d], X[2s + 1][d]), head dim along the lanes (the B operand
//                          of products that reduce over rows or keys).
// Padding (rows past T, head dims past hd) is zeros, so products run on whole vectors.
#include "trident/kernels/cpu/attention_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "trident/kernels/aligned.h"
#include "trident/kernels/cpu/simd.h"
#include "trident/kernels/cpu/thread_pool.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TRIDENT_HAVE_FLASH_BF16 1
#include "trident/kernels/cpu/avx512_transpose.h"
// GCC 12's AVX-512 headers trip -Wuninitialized on their own "undefined vector" idiom (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Vector arguments of the target-attributed helpers; they are inlined or internal, so the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace trident::kernels::cpu::detail {

#ifdef TRIDENT_HAVE_FLASH_BF16

namespace flash_bf16 {

#define TRIDENT_FLASH_FN __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx512bf16,fma")))

constexpr int kTile = 64;          // query rows and keys per tile
constexpr int kTileWords = kTile / 2;
constexpr int kMr = 6;             // rows of a register tile
constexpr float kNegBig = -3.0e38f;

using Words = std::vector<uint32_t, AlignedAllocator<uint32_t>>;

template <class V>
void grow(V& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// The head's dimensions, padded.
struct Dims {
  int T, hd, hp, hw, hdv, Tp, nt;
  Dims(int T_, int hd_)
      : T(T_), hd(hd_), hp((hd_ + 1) / 2), hw((hp + 15) / 16 * 16), hdv((hd_ + 15) / 16 * 16),
        Tp((T_ + kTile - 1) / kTile * kTile), nt((T_ + kTile - 1) / kTile) {}
};

enum class Init : int { kZero, kLoad, kScale };

// c[i][0..16 NV) = (0 | c | c * scale[i]) + sum over p < np of a_i(p) . b[p][0..16 NV), for rows i < MR.
// a_i(p) is the word a[i rs + p ps] (two bf16 values, broadcast to every lane); b's rows are 16 NV words at
// stride bs. Each lane is one float32 chain over p in order.
template <int MR, int NV>
TRIDENT_FLASH_FN __attribute__((noinline)) void micro(int np, const uint32_t* __restrict a, ptrdiff_t rs, ptrdiff_t ps,
                                                      const uint32_t* __restrict b, ptrdiff_t bs, float* __restrict c,
                                                      ptrdiff_t ldc, Init init, const float* scale) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (init == Init::kZero) {
        acc[i][v] = _mm512_setzero_ps();
      } else {
        acc[i][v] = _mm512_loadu_ps(c + i * ldc + 16 * v);
        if (init == Init::kScale) acc[i][v] = _mm512_mul_ps(acc[i][v], _mm512_set1_ps(scale[i]));
      }
    }
  }
  const uint32_t* ar[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) ar[i] = a + i * rs;
  ptrdiff_t off = 0;
  for (int p = 0; p < np; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + 16 * v);
    b += bs;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(ar[i][off]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
    off += ps;
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + i * ldc + 16 * v, acc[i][v]);
}

using MicroFn = void (*)(int, const uint32_t*, ptrdiff_t, ptrdiff_t, const uint32_t*, ptrdiff_t, float*, ptrdiff_t,
                         Init, const float*);
#define TRIDENT_FLASH_ROW(MR) {&micro<MR, 1>, &micro<MR, 2>, &micro<MR, 3>, &micro<MR, 4>}
const MicroFn kMicro[kMr][4] = {TRIDENT_FLASH_ROW(1), TRIDENT_FLASH_ROW(2), TRIDENT_FLASH_ROW(3),
                                TRIDENT_FLASH_ROW(4), TRIDENT_FLASH_ROW(5), TRIDENT_FLASH_ROW(6)};
#undef TRIDENT_FLASH_ROW

// One register group of mr rows over nv vectors of C (chunks of 4 vectors).
inline void group(int mr, int nv, int np, const uint32_t* a, ptrdiff_t rs, ptrdiff_t ps, const uint32_t* b,
                  ptrdiff_t bs, float* c, ptrdiff_t ldc, Init init, const float* scale) {
  for (int v0 = 0; v0 < nv; v0 += 4)
    kMicro[mr - 1][std::min(4, nv - v0) - 1](np, a, rs, ps, b + 16 * v0, bs, c + 16 * v0, ldc, init, scale);
}

// fast_exp (simd.h) on 16 lanes: the same range reduction and polynomial.
TRIDENT_FLASH_FN inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 shift = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift), shift);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

TRIDENT_FLASH_FN inline __mmask16 first_lanes(int n) {
  return static_cast<__mmask16>(n <= 0 ? 0u : n >= 16 ? 0xffffu : (1u << n) - 1u);
}

// 16 words, pairs (a[l], b[l]) in lane l, a in the low half (rounded to nearest even).
TRIDENT_FLASH_FN inline __m512i pair_words(__m512 a, __m512 b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
}

TRIDENT_FLASH_FN inline void store_bf16(uint16_t* dst, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
}

// Rows [0, rows) of x (stride ld; rows >= n read as zeros) in the rows layout (rw[r][0..hw)) and/or the
// row-pairs layout (pr[s][0..hdv)), whichever is non-null; rows even. Each row is read once; rows are a
// stride apart (3C floats), where the hardware prefetcher does not follow, so rows ahead are prefetched.
TRIDENT_FLASH_FN void pack(uint32_t* rw, uint32_t* pr, const Dims& dm, const float* x, size_t ld, int n, int rows) {
  constexpr int kAhead = 24;
  for (int s = 0; s < rows / 2; ++s) {
    const int r = 2 * s;
    for (int k = r + kAhead; k < r + kAhead + 2 && k < n; ++k)
      for (int d = 0; d < dm.hd; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(x + static_cast<ptrdiff_t>(k) * static_cast<ptrdiff_t>(ld) + d),
                     _MM_HINT_T0);
    const float* r0 = r < n ? x + static_cast<ptrdiff_t>(r) * static_cast<ptrdiff_t>(ld) : nullptr;
    const float* r1 = r + 1 < n ? x + static_cast<ptrdiff_t>(r + 1) * static_cast<ptrdiff_t>(ld) : nullptr;
    uint16_t* o0 = rw ? reinterpret_cast<uint16_t*>(rw + static_cast<ptrdiff_t>(r) * dm.hw) : nullptr;
    uint16_t* o1 = rw ? reinterpret_cast<uint16_t*>(rw + static_cast<ptrdiff_t>(r + 1) * dm.hw) : nullptr;
    for (int d = 0; d < 2 * dm.hw; d += 16) {
      const __mmask16 m = first_lanes(dm.hd - d);
      const __m512 a = r0 ? _mm512_maskz_loadu_ps(m, r0 + d) : _mm512_setzero_ps();
      const __m512 b = r1 ? _mm512_maskz_loadu_ps(m, r1 + d) : _mm512_setzero_ps();
      if (rw) store_bf16(o0 + d, a), store_bf16(o1 + d, b);
      if (pr && d < dm.hdv) _mm512_storeu_si512(pr + static_cast<ptrdiff_t>(s) * dm.hdv + d, pair_words(a, b));
    }
  }
}

// Transposed layout, tile by tile: tile t of dst (hp x 64 words, from word t hp 64) holds src[j][p] at
// [p][j - 64 t] for p < hp and the 64 keys j of the tile (src in the rows layout, rows a multiple of 64).
// Each tile's rows are then 256 bytes apart: a key tile's hp rows stay in distinct L1 sets, where rows T
// words apart (4 KiB at T 1024) all fell into the same ones.
TRIDENT_FLASH_FN void transpose_words(uint32_t* dst, const uint32_t* src, const Dims& dm, int rows) {
  for (int j0 = 0; j0 < rows; j0 += 16) {
    uint32_t* tile = dst + static_cast<ptrdiff_t>(j0 / kTile) * dm.hp * kTile + j0 % kTile;
    for (int p0 = 0; p0 < dm.hp; p0 += 16) {
      __m512 r[16];
      for (int jj = 0; jj < 16; ++jj)
        r[jj] = _mm512_castsi512_ps(_mm512_loadu_si512(src + static_cast<ptrdiff_t>(j0 + jj) * dm.hw + p0));
      transpose16(r);
      const int n = std::min(16, dm.hp - p0);
      for (int pp = 0; pp < n; ++pp)
        _mm512_storeu_si512(tile + static_cast<ptrdiff_t>(p0 + pp) * kTile, _mm512_castps_si512(r[pp]));
    }
  }
}

// out[r][0..hd) = acc[r][0..hd) * mul for r < n (out rows at stride ld).
TRIDENT_FLASH_FN void store_rows(float* out, size_t ld, const float* acc, const Dims& dm, int n, const float* mul) {
  for (int r = 0; r < n; ++r) {
    if (r + 16 < n)
      for (int d = 0; d < dm.hd; d += 16)
        __builtin_prefetch(out + static_cast<ptrdiff_t>(r + 16) * static_cast<ptrdiff_t>(ld) + d, 1, 3);
    const __m512 s = _mm512_set1_ps(mul ? mul[r] : 1.0f);
    float* o = out + static_cast<ptrdiff_t>(r) * static_cast<ptrdiff_t>(ld);
    for (int d = 0; d < dm.hdv; d += 16)
      _mm512_mask_storeu_ps(o + d, first_lanes(dm.hd - d),
                            _mm512_mul_ps(_mm512_loadu_ps(acc + static_cast<ptrdiff_t>(r) * dm.hdv + d), s));
  }
}

// ---- forward ----

// Per key tile, the online-softmax step of the mr rows of a register group: S holds their scores (rows of
// 64, nv vectors each), keys c < lim[r] count in row r. Updates m and l, writes alpha = exp(m_old - m_new)
// (0 on the first tile) and P = exp(scale S - m_new) as bf16 rows of 64 (zeros past lim). Pass by pass
// over the rows, not row by row: each row's horizontal max, exp and sum form a chain of dependent steps,
// and rows side by side let the core overlap them.
TRIDENT_FLASH_FN void softmax_group(const float* S, uint16_t* pb, int mr, int nv, const int* lim, float scale,
                                    bool first, float* m, float* l, float* alpha) {
  const __m512 sc = _mm512_set1_ps(scale);
  float mn[kMr], sum[kMr];
  for (int r = 0; r < mr; ++r) {
    __m512 vmax = _mm512_set1_ps(kNegBig);
    for (int v = 0; v < nv; ++v)
      vmax = _mm512_mask_max_ps(vmax, first_lanes(lim[r] - 16 * v), vmax,
                                _mm512_mul_ps(_mm512_loadu_ps(S + r * kTile + 16 * v), sc));
    mn[r] = std::max(m[r], _mm512_reduce_max_ps(vmax));
  }
  for (int r = 0; r < mr; ++r) {
    const __m512 mv = _mm512_set1_ps(mn[r]);
    __m512 vsum = _mm512_setzero_ps();
    for (int v = 0; v < nv; ++v) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(S + r * kTile + 16 * v), sc);
      const __m512 p = _mm512_maskz_mov_ps(first_lanes(lim[r] - 16 * v), exp16(_mm512_sub_ps(x, mv)));
      vsum = _mm512_add_ps(vsum, p);
      store_bf16(pb + r * kTile + 16 * v, p);
    }
    sum[r] = _mm512_reduce_add_ps(vsum);
  }
  for (int r = 0; r < mr; ++r) {
    const float a = first ? 0.0f : fast_exp(m[r] - mn[r]);
    l[r] = l[r] * a + sum[r];
    m[r] = mn[r];
    alpha[r] = a;
  }
}

struct FwdScratch {
  Words qb, pb;
  AlignedFloats s, o;
  float m[kTile], l[kTile], alpha[kTile];
};
thread_local FwdScratch g_fwd;

// One (batch, head, query tile): kt holds the head's keys transposed, vp its values as row pairs.
TRIDENT_FLASH_FN void forward_tile(float* out, float* lse, const float* q, size_t ld, size_t ldo, const uint32_t* kt,
                                   const uint32_t* vp, const Dims& dm, int qt, float scale) {
  FwdScratch& w = g_fwd;
  grow(w.qb, static_cast<size_t>(kTile) * dm.hw);
  grow(w.pb, static_cast<size_t>(kTile) * kTileWords);
  grow(w.s, static_cast<size_t>(kTile) * kTile);
  grow(w.o, static_cast<size_t>(kTile) * dm.hdv);
  const int i0 = qt * kTile, nq = std::min(kTile, dm.T - i0);
  pack(w.qb.data(), nullptr, dm, q + static_cast<ptrdiff_t>(i0) * static_cast<ptrdiff_t>(ld), ld, nq, (nq + 1) / 2 * 2);
  for (int r = 0; r < nq; ++r) w.m[r] = kNegBig, w.l[r] = 0.0f;
  float* S = w.s.data();
  float* O = w.o.data();
  uint16_t* pb = reinterpret_cast<uint16_t*>(w.pb.data());
  for (int kti = 0; kti <= qt; ++kti) {
    const int j0 = kti * kTile, ncols = std::min(kTile, dm.T - j0);
    const bool diag = kti == qt;
    for (int r0 = 0; r0 < nq; r0 += kMr) {
      const int mr = std::min(kMr, nq - r0);
      const int ce = diag ? std::min(ncols, r0 + mr) : ncols;  // keys this group sees
      const int nv = (ce + 15) / 16;
      kMicro[mr - 1][nv - 1](dm.hp, w.qb.data() + static_cast<ptrdiff_t>(r0) * dm.hw, dm.hw, 1,
                             kt + static_cast<ptrdiff_t>(kti) * dm.hp * kTile, kTile, S + r0 * kTile, kTile,
                             Init::kZero, nullptr);
      int lim[kMr];
      for (int r = 0; r < mr; ++r) lim[r] = diag ? std::min(ncols, r0 + r + 1) : ncols;
      softmax_group(S + r0 * kTile, pb + r0 * kTile, mr, nv, lim, scale, kti == 0, w.m + r0, w.l + r0, w.alpha + r0);
      group(mr, dm.hdv / 16, (ce + 1) / 2, w.pb.data() + r0 * kTileWords, kTileWords, 1,
            vp + static_cast<ptrdiff_t>(j0 / 2) * dm.hdv, dm.hdv, O + static_cast<ptrdiff_t>(r0) * dm.hdv, dm.hdv,
            kti == 0 ? Init::kZero : Init::kScale, w.alpha + r0);
    }
  }
  float inv[kTile];
  for (int r = 0; r < nq; ++r) {
    inv[r] = 1.0f / w.l[r];
    lse[i0 + r] = w.m[r] + std::log(w.l[r]);
  }
  store_rows(out + static_cast<ptrdiff_t>(i0) * static_cast<ptrdiff_t>(ldo), ldo, O, dm, nq, inv);
}

// Words of one head's keys transposed and values as row pairs, shared by the head's query tiles.
size_t head_kv_words(const Dims& dm) {
  return static_cast<size_t>(dm.hp) * dm.Tp + static_cast<size_t>(dm.Tp / 2) * dm.hdv;
}
thread_local Words g_rows;  // a head's rows layout, before transposing

TRIDENT_FLASH_FN void pack_head_kv(uint32_t* dst, const float* k, const float* v, size_t ld, const Dims& dm) {
  grow(g_rows, static_cast<size_t>(dm.Tp) * dm.hw);
  pack(g_rows.data(), nullptr, dm, k, ld, dm.T, dm.Tp);
  transpose_words(dst, g_rows.data(), dm, dm.Tp);
  pack(nullptr, dst + static_cast<ptrdiff_t>(dm.hp) * dm.Tp, dm, v, ld, dm.T, dm.Tp);
}

// ---- backward ----

struct BwdScratch {
  Words qb, dob, kt, vt, kp, qp, dop;  // the head's operands
  Words pt, dst, dsb;                  // one tile's P^T, dS^T (row pairs over queries) and dS rows, bf16
  AlignedFloats s, dp, dq, dk, dv;
};
thread_local BwdScratch g_bwd;

// Rows r, r + 1 of one tile: P = exp(scale S - lse), dS = P (dP - D) scale for keys below each row's limit
// (zero elsewhere and for rows past nq), written as P^T and dS^T row pairs (word row r / 2) and dS rows.
TRIDENT_FLASH_FN void grad_pair(BwdScratch& w, int r, int nq, const int lim[2], const float* lse, const float* D,
                                float scale) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 pv[2][4], dsv[2][4];
  for (int k = 0; k < 2; ++k) {
    const int row = r + k;
    const bool valid = row < nq;
    const __m512 l = _mm512_set1_ps(valid ? lse[row] : 0.0f), dd = _mm512_set1_ps(valid ? D[row] : 0.0f);
    const float* s = w.s.data() + row * kTile;
    const float* dp = w.dp.data() + row * kTile;
    for (int v = 0; v < 4; ++v) {
      const __mmask16 m = valid ? first_lanes(lim[k] - 16 * v) : 0;
      if (m == 0) {
        pv[k][v] = dsv[k][v] = _mm512_setzero_ps();
        continue;
      }
      const __m512 p = _mm512_maskz_mov_ps(m, exp16(_mm512_fmsub_ps(_mm512_loadu_ps(s + 16 * v), sc, l)));
      pv[k][v] = p;
      const __m512 g = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + 16 * v), dd));
      dsv[k][v] = _mm512_maskz_mov_ps(m, _mm512_mul_ps(g, sc));
    }
  }
  uint32_t* pt = w.pt.data() + (r / 2) * kTile;
  uint32_t* dst = w.dst.data() + (r / 2) * kTile;
  uint16_t* dsb = reinterpret_cast<uint16_t*>(w.dsb.data());
  for (int v = 0; v < 4; ++v) {
    _mm512_storeu_si512(pt + 16 * v, pair_words(pv[0][v], pv[1][v]));
    _mm512_storeu_si512(dst + 16 * v, pair_words(dsv[0][v], dsv[1][v]));
    store_bf16(dsb + r * kTile + 16 * v, dsv[0][v]);
    store_bf16(dsb + (r + 1) * kTile + 16 * v, dsv[1][v]);
  }
}

TRIDENT_FLASH_FN void backward_head(float* dq, float* dk, float* dv, size_t ld, const float* q, const float* k,
                                    const float* v, const float* dout, size_t ldo, const float* lse, const float* D,
                                    const Dims& dm, float scale) {
  BwdScratch& w = g_bwd;
  const size_t rows = static_cast<size_t>(dm.Tp) * dm.hw, tr = static_cast<size_t>(dm.hp) * dm.Tp,
               pairs = static_cast<size_t>(dm.Tp / 2) * dm.hdv;
  grow(w.qb, rows), grow(w.dob, rows), grow(w.kt, tr), grow(w.vt, tr);
  grow(w.kp, pairs), grow(w.qp, pairs), grow(w.dop, pairs);
  grow(w.pt, static_cast<size_t>(kTileWords) * kTile), grow(w.dst, static_cast<size_t>(kTileWords) * kTile);
  grow(w.dsb, static_cast<size_t>(kTile) * kTileWords);
  grow(w.s, static_cast<size_t>(kTile) * kTile), grow(w.dp, static_cast<size_t>(kTile) * kTile);
  grow(w.dq, static_cast<size_t>(dm.Tp) * dm.hdv);
  grow(w.dk, static_cast<size_t>(kTile) * dm.hdv), grow(w.dv, static_cast<size_t>(kTile) * dm.hdv);
  grow(g_rows, rows);
  pack(w.qb.data(), w.qp.data(), dm, q, ld, dm.T, dm.Tp);
  pack(w.dob.data(), w.dop.data(), dm, dout, ldo, dm.T, dm.Tp);
  pack(g_rows.data(), w.kp.data(), dm, k, ld, dm.T, dm.Tp);
  transpose_words(w.kt.data(), g_rows.data(), dm, dm.Tp);
  pack(g_rows.data(), nullptr, dm, v, ld, dm.T, dm.Tp);
  transpose_words(w.vt.data(), g_rows.data(), dm, dm.Tp);
  const int nvd = dm.hdv / 16;
  for (int kti = 0; kti < dm.nt; ++kti) {
    const int j0 = kti * kTile, ncols = std::min(kTile, dm.T - j0);
    const uint32_t* ktile = w.kt.data() + static_cast<ptrdiff_t>(kti) * dm.hp * kTile;
    const uint32_t* vtile = w.vt.data() + static_cast<ptrdiff_t>(kti) * dm.hp * kTile;
    for (int qt = kti; qt < dm.nt; ++qt) {
      const int i0 = qt * kTile, nq = std::min(kTile, dm.T - i0), nqe = (nq + 1) / 2 * 2;
      const bool diag = qt == kti;
      // Scores and dP = dO V^T, then P, dS in bf16, by groups of rows.
      for (int r0 = 0; r0 < nqe; r0 += kMr) {
        const int mr = std::min(kMr, nqe - r0);  // even: nqe and kMr are
        const int ce = diag ? std::min(ncols, r0 + mr) : ncols;
        const int nv = (ce + 15) / 16;
        kMicro[mr - 1][nv - 1](dm.hp, w.qb.data() + static_cast<ptrdiff_t>(i0 + r0) * dm.hw, dm.hw, 1, ktile,
                               kTile, w.s.data() + r0 * kTile, kTile, Init::kZero, nullptr);
        kMicro[mr - 1][nv - 1](dm.hp, w.dob.data() + static_cast<ptrdiff_t>(i0 + r0) * dm.hw, dm.hw, 1, vtile,
                               kTile, w.dp.data() + r0 * kTile, kTile, Init::kZero, nullptr);
        for (int r = r0; r < r0 + mr; r += 2) {
          const int lim[2] = {diag ? std::min(ce, r + 1) : ce, diag ? std::min(ce, r + 2) : ce};
          grad_pair(w, r, nq, lim, lse + i0, D + i0, scale);
        }
      }
      // dV += P^T dO and dK += dS^T Q over this tile's query rows; on the diagonal, the row pairs below a
      // group's first key are zeros and skipped.
      const Init first = diag ? Init::kZero : Init::kLoad;
      for (int c0 = 0; c0 < ncols; c0 += kMr) {
        const int mr = std::min(kMr, ncols - c0);
        const int sp = diag ? c0 / 2 : 0, np = nqe / 2 - sp;
        const ptrdiff_t bo = static_cast<ptrdiff_t>(i0 / 2 + sp) * dm.hdv;
        group(mr, nvd, np, w.pt.data() + sp * kTile + c0, 1, kTile, w.dop.data() + bo, dm.hdv,
              w.dv.data() + static_cast<ptrdiff_t>(c0) * dm.hdv, dm.hdv, first, nullptr);
        group(mr, nvd, np, w.dst.data() + sp * kTile + c0, 1, kTile, w.qp.data() + bo, dm.hdv,
              w.dk.data() + static_cast<ptrdiff_t>(c0) * dm.hdv, dm.hdv, first, nullptr);
      }
      // dQ += dS K (this key tile after the ones before it).
      for (int r0 = 0; r0 < nq; r0 += kMr) {
        const int mr = std::min(kMr, nq - r0);
        const int ce = diag ? std::min(ncols, r0 + mr) : ncols;
        group(mr, nvd, (ce + 1) / 2, w.dsb.data() + r0 * kTileWords, kTileWords, 1,
              w.kp.data() + static_cast<ptrdiff_t>(j0 / 2) * dm.hdv, dm.hdv,
              w.dq.data() + static_cast<ptrdiff_t>(i0 + r0) * dm.hdv, dm.hdv, kti == 0 ? Init::kZero : Init::kLoad,
              nullptr);
      }
    }
    store_rows(dk + static_cast<ptrdiff_t>(j0) * static_cast<ptrdiff_t>(ld), ld, w.dk.data(), dm, ncols, nullptr);
    store_rows(dv + static_cast<ptrdiff_t>(j0) * static_cast<ptrdiff_t>(ld), ld, w.dv.data(), dm, ncols, nullptr);
  }
  store_rows(dq, ld, w.dq.data(), dm, dm.T, nullptr);
}

}  // namespace flash_bf16

void flash_bf16_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  using namespace flash_bf16;
  if (B <= 0 || T <= 0) return;
  const int hd = C / NH;
  const Dims dm(T, hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t ld = 3 * static_cast<size_t>(C), kvw = head_kv_words(dm);
  const int64_t heads = static_cast<int64_t>(B) * NH;
  // Every head's keys and values packed once, shared by its query tiles (the tasks below run on other
  // threads: this caller's buffer is passed by pointer).
  thread_local Words kv;
  grow(kv, kvw * static_cast<size_t>(heads));
  uint32_t* kvp = kv.data();
  parallel_for(heads, [&](int64_t t) {
    const int b = static_cast<int>(t / NH), h = static_cast<int>(t % NH);
    const float* x = qkv + static_cast<size_t>(b) * T * ld + static_cast<size_t>(h) * hd;
    pack_head_kv(kvp + kvw * static_cast<size_t>(t), x + C, x + 2 * C, ld, dm);
  });
  // Query tiles, the longest (last) first: they start while the short ones fill in.
  parallel_for(heads * dm.nt, [&](int64_t t) {
    const int qt = dm.nt - 1 - static_cast<int>(t / heads);
    const int64_t bh = t % heads;
    const int b = static_cast<int>(bh / NH), h = static_cast<int>(bh % NH);
    const uint32_t* kt = kvp + kvw * static_cast<size_t>(bh);
    forward_tile(out + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hd, lse + static_cast<size_t>(bh) * T,
                 qkv + static_cast<size_t>(b) * T * ld + static_cast<size_t>(h) * hd, ld, static_cast<size_t>(C), kt,
                 kt + static_cast<ptrdiff_t>(dm.hp) * dm.Tp, dm, qt, scale);
  });
}

void flash_bf16_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, int B,
                         int T, int C, int NH) {
  using namespace flash_bf16;
  if (B <= 0 || T <= 0) return;
  const int hd = C / NH;
  const Dims dm(T, hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t ld = 3 * static_cast<size_t>(C);
  parallel_for(static_cast<int64_t>(B) * NH, [&](int64_t t) {
    const int b = static_cast<int>(t / NH), h = static_cast<int>(t % NH);
    const size_t base3 = static_cast<size_t>(b) * T * ld + static_cast<size_t>(h) * hd;
    const size_t base = static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hd;
    const size_t row = static_cast<size_t>(t) * T;
    backward_head(dqkv + base3, dqkv + base3 + C, dqkv + base3 + 2 * C, ld, qkv + base3, qkv + base3 + C,
                  qkv + base3 + 2 * C, dout + base, static_cast<size_t>(C), lse + row, D + row, dm, scale);
  });
}

#else

void flash_bf16_forward(float*, float*, const float*, int, int, int, int) {}
void flash_bf16_backward(float*, const float*, const float*, const float*, const float*, int, int, int, int) {}

#endif

}  // namespace trident::kernels::cpu::detail
