// Causal multi-head self-attention, forward and backward, one (batch, head) per task of the kernels' pool.
// Forward keeps only the output and the log-sum-exp of each score row; backward recomputes the
// probabilities from q, k and lse (as FlashAttention does), so saved memory is O(B*T*C), not
// O(B*NH*T*T); a T x T scratch per call is reused across heads.
// Every product is written as "row += scalar * contiguous row" (vectorized over the row, no horizontal
// reductions), with K and V transposed into scratch where a dot product over the head dim would be needed.
// With bfloat16 operands at levels with AVX512-BF16 the flash-style kernel of attention_bf16.cc runs
// instead (the table below picks).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/error.h"
#include "trident/kernels/aligned.h"
#include "trident/kernels/cpu/attention_bf16.h"
#include "trident/kernels/cpu/gemm_avx512.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/simd.h"
#include "trident/kernels/cpu/thread_pool.h"

// Vec16 helpers are inlined into per-ISA clones; the ABI note about passing them by value does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace trident::kernels::cpu {

using detail::fast_exp;

namespace {
void check_shape(int C, int NH) {
  TRIDENT_CHECK(NH > 0 && C % NH == 0, InvalidArgument, "attention: n_embd {} must be divisible by n_head {}", C,
                NH);
}

// How each ISA level runs attention, by precision: one table, read by attention_forward/backward and the
// kernel summary (isa.cc). Float32 runs on the level's own GEMM (avx2 and up) or row by row (portable);
// bfloat16 runs the flash-style vdpbf16ps kernel at avx512bf16 and amx where vdpbf16ps measures faster
// than the float32 FMAs (isa.h, bf16_dot_in_use: the GEMMs' choice) and the sequence spans more than one of
// its 64-key tiles (attention_bf16.h, flash_bf16_min_t), elsewhere the float32 kernel.
enum class AttnPath : int { kRows, kGemm, kFlashBf16 };
struct AttnEntry {
  AttnPath f32, bf16;
};
const AttnEntry kAttnTable[] = {
    {AttnPath::kRows, AttnPath::kRows},       // portable
    {AttnPath::kGemm, AttnPath::kGemm},       // avx2
    {AttnPath::kGemm, AttnPath::kGemm},       // avx512
    {AttnPath::kGemm, AttnPath::kFlashBf16},  // avx512bf16
    {AttnPath::kGemm, AttnPath::kFlashBf16},  // amx
};
static_assert(sizeof(kAttnTable) / sizeof(kAttnTable[0]) == static_cast<size_t>(Isa::kAmx) + 1);
constexpr int kFlashMinT = 65;  // attention_bf16.h: flash_bf16_min_t
std::atomic<int> g_flash_min_t{kFlashMinT};
// T: the sequence length of the call.
AttnPath attn_path(int level, Precision p, int T) {
  const AttnEntry& e = kAttnTable[level];
  if (p != Precision::kBFloat16) return e.f32;
  if (e.bf16 == AttnPath::kFlashBf16 &&
      (!bf16_dot_in_use() || T < g_flash_min_t.load(std::memory_order_relaxed)))
    return e.f32;
  return e.bf16;
}

struct Scratch {
  AlignedFloats kt, vt, s, ds;
  void ensure(int T, int hd) {
    const size_t tp = align_floats(T);
    if (kt.size() < hd * tp) kt.resize(hd * tp), vt.resize(hd * tp);
    if (s.size() < T * tp) s.resize(T * tp), ds.resize(T * tp);  // rows padded to tp (a multiple of 16)
  }
};
thread_local Scratch g_scratch;
}  // namespace

// Xt[d][j] = X[j][d] for j < T (X rows at stride ld); columns T..tp-1 are zero.
TRIDENT_KERNEL_BODY void transpose_head_body(float* xt, size_t tp, const float* x, size_t ld, int T, int hd) {
  // Rows of x are read contiguously; the hd destination rows (hd x tp floats) stay in L1.
  for (int j = 0; j < T; ++j) {
    const float* src = x + j * ld;
    for (int d = 0; d < hd; ++d) xt[d * tp + j] = src[d];
  }
  for (int d = 0; d < hd; ++d)
    for (size_t j = T; j < tp; ++j) xt[d * tp + j] = 0.0f;
}

// Vector width W of the register blocks: one register of the clone's ISA (16 floats for x86-64-v4, 8 for
// x86-64-v3, 4 for baseline SSE). A wider GCC vector than the target has is lowered through the stack,
// which made the AVX2 and baseline paths 20x slower than the AVX-512 one; each clone therefore
// instantiates the bodies at its own width.
// TRIDENT_ISA_CLONES (simd.h) for bodies templated on the vector width.
#define TRIDENT_ISA_CLONES_W(ret, name, params, args)                            \
  TRIDENT_TARGET_V4 static ret name##_v4 params { return name##_body<16> args; } \
  TRIDENT_TARGET_V3 static ret name##_v3 params { return name##_body<8> args; }  \
  static ret name##_v1 params { return name##_body<4> args; }                    \
  static ret(*const name##_clones[3]) params = {name##_v1, name##_v3, name##_v4}

template <int W>
struct VecOf {
  typedef float F __attribute__((vector_size(4 * W)));
  typedef int32_t I __attribute__((vector_size(4 * W)));
};
#define TRIDENT_VEC_TYPES   \
  using Vec16 [[maybe_unused]] = typename VecOf<W>::F; \
  using Int16 [[maybe_unused]] = typename VecOf<W>::I; \
  constexpr int kW = W;             \
  (void)kW

template <int W>
__attribute__((always_inline)) static inline typename VecOf<W>::F load16(const float* p) {
  typename VecOf<W>::F v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <int W>
__attribute__((always_inline)) static inline void store16(float* p, typename VecOf<W>::F v) {
  std::memcpy(p, &v, sizeof(v));
}

// out[0..n16) = scale * sum_d a[d] * mt[d][0..n16) (mt rows at stride tp; n16 a multiple of kW).
// Up to four accumulator blocks stay in registers across the d loop (independent FMA chains).
template <int W>
__attribute__((always_inline)) static inline void row_times_matrix(float* out, const float* a, const float* mt, size_t tp, int hd, int n16,
                                    float scale) {
  TRIDENT_VEC_TYPES;
  int jb = 0;
  for (; jb + 4 * kW <= n16; jb += 4 * kW) {
    Vec16 c0 = {}, c1 = {}, c2 = {}, c3 = {};
    for (int d = 0; d < hd; ++d) {
      const float x = a[d];
      const float* m = mt + d * tp + jb;
      c0 += x * load16<W>(m);
      c1 += x * load16<W>(m + kW);
      c2 += x * load16<W>(m + 2 * kW);
      c3 += x * load16<W>(m + 3 * kW);
    }
    store16<W>(out + jb, c0 * scale);
    store16<W>(out + jb + kW, c1 * scale);
    store16<W>(out + jb + 2 * kW, c2 * scale);
    store16<W>(out + jb + 3 * kW, c3 * scale);
  }
  for (; jb + 2 * kW <= n16; jb += 2 * kW) {
    Vec16 c0 = {}, c1 = {}, e0 = {}, e1 = {};
    int d = 0;
    for (; d + 1 < hd; d += 2) {
      const float* m = mt + d * tp + jb;
      c0 += a[d] * load16<W>(m);
      c1 += a[d] * load16<W>(m + kW);
      e0 += a[d + 1] * load16<W>(m + tp);
      e1 += a[d + 1] * load16<W>(m + tp + kW);
    }
    if (d < hd) {
      c0 += a[d] * load16<W>(mt + d * tp + jb);
      c1 += a[d] * load16<W>(mt + d * tp + jb + kW);
    }
    store16<W>(out + jb, (c0 + e0) * scale);
    store16<W>(out + jb + kW, (c1 + e1) * scale);
  }
  for (; jb < n16; jb += kW) {
    Vec16 c0 = {}, c1 = {}, c2 = {}, c3 = {};
    int d = 0;
    for (; d + 3 < hd; d += 4) {
      const float* m = mt + d * tp + jb;
      c0 += a[d] * load16<W>(m);
      c1 += a[d + 1] * load16<W>(m + tp);
      c2 += a[d + 2] * load16<W>(m + 2 * tp);
      c3 += a[d + 3] * load16<W>(m + 3 * tp);
    }
    for (; d < hd; ++d) c0 += a[d] * load16<W>(mt + d * tp + jb);
    store16<W>(out + jb, ((c0 + c1) + (c2 + c3)) * scale);
  }
}

// out[0..hd) = sum_{j in [j0, j1)} w[j * wstride] * rows[j * ld + 0..hd); blocks of kW over d (two
// independent chains per block: even and odd j), remainder scalar.
template <int W>
__attribute__((always_inline)) static inline void weighted_row_sum(float* out, const float* w, size_t wstride, const float* rows, size_t ld, int j0,
                                    int j1, int hd) {
  TRIDENT_VEC_TYPES;
  int db = 0;
  for (; db + 2 * kW <= hd; db += 2 * kW) {
    Vec16 a0 = {}, a1 = {}, b0 = {}, b1 = {};
    int j = j0;
    for (; j + 1 < j1; j += 2) {
      const float x = w[j * wstride], y = w[(j + 1) * wstride];
      const float* r = rows + j * ld + db;
      a0 += x * load16<W>(r);
      a1 += x * load16<W>(r + kW);
      b0 += y * load16<W>(r + ld);
      b1 += y * load16<W>(r + ld + kW);
    }
    if (j < j1) {
      const float x = w[j * wstride];
      a0 += x * load16<W>(rows + j * ld + db);
      a1 += x * load16<W>(rows + j * ld + db + kW);
    }
    store16<W>(out + db, a0 + b0);
    store16<W>(out + db + kW, a1 + b1);
  }
  for (; db + kW <= hd; db += kW) {
    Vec16 a0 = {}, b0 = {};
    int j = j0;
    for (; j + 1 < j1; j += 2) {
      a0 += w[j * wstride] * load16<W>(rows + j * ld + db);
      b0 += w[(j + 1) * wstride] * load16<W>(rows + (j + 1) * ld + db);
    }
    if (j < j1) a0 += w[j * wstride] * load16<W>(rows + j * ld + db);
    store16<W>(out + db, a0 + b0);
  }
  for (; db < hd; ++db) {
    float acc = 0.0f;
    for (int j = j0; j < j1; ++j) acc += w[j * wstride] * rows[j * ld + db];
    out[db] = acc;
  }
}

template <int W>
__attribute__((always_inline)) static inline typename VecOf<W>::F splat(float x) {
  return typename VecOf<W>::F{} + x;
}

// Lane indices base + 0..W-1: a constant 0..W-1 plus a broadcast (built lane by lane from base, GCC
// emitted W scalar adds and inserts for every call).
template <int W>
__attribute__((always_inline)) static inline typename VecOf<W>::I lanes(int base) {
  typename VecOf<W>::I l;
  for (int k = 0; k < W; ++k) l[k] = k;
  return l + base;
}

// detail::fast_exp on W lanes (same operations, same results).
template <int W>
__attribute__((always_inline)) static inline typename VecOf<W>::F fast_exp16(typename VecOf<W>::F x) {
  TRIDENT_VEC_TYPES;
  x = x < splat<W>(-87.3f) ? splat<W>(-87.3f) : x;
  x = x > splat<W>(88.7f) ? splat<W>(88.7f) : x;
  const float kShift = 12582912.0f;
  Vec16 t = x * 1.44269504088896341f + kShift;
  Vec16 n = t - kShift;
  Vec16 r = x - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723e-06f;
  Vec16 p = splat<W>(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  Int16 e = (__builtin_convertvector(n, Int16) + 127) << 23;
  Vec16 scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

// Lanes H.. of v moved down to 0.. (wrapping): one step of a halving tree reduction.
template <int W, int H, size_t... I>
__attribute__((always_inline)) static inline typename VecOf<W>::F rotate_down(typename VecOf<W>::F v,
                                                                          std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, static_cast<int>((I + H) % W)...);
}

// Horizontal max and sum as halving trees (log2 W dependent steps instead of W - 1): the max is exact in
// any order; the sum's order is fixed by W.
template <int W, int H = W / 2>
__attribute__((always_inline)) static inline float hmax(typename VecOf<W>::F v) {
  if constexpr (H == 0) {
    return v[0];
  } else {
    const auto r = rotate_down<W, H>(v, std::make_index_sequence<W>{});
    return hmax<W, H / 2>(v > r ? v : r);
  }
}
template <int W, int H = W / 2>
__attribute__((always_inline)) static inline float hsum(typename VecOf<W>::F v) {
  if constexpr (H == 0) {
    return v[0];
  } else {
    return hsum<W, H / 2>(v + rotate_down<W, H>(v, std::make_index_sequence<W>{}));
  }
}

template <int W>
__attribute__((always_inline)) static inline int round_up(int n) {
  return (n + W - 1) / W * W;
}

// Softmax of one causal row in place: row[j] * scale for j < n, over the row padded to round_up(n) lanes
// (lanes j >= n are masked to -inf-like before, and 0 after, the exp). Returns the log-sum-exp.
template <int W>
__attribute__((always_inline)) static inline float masked_softmax_row(float* row, int n, float scale) {
  TRIDENT_VEC_TYPES;
  const int n16 = round_up<W>(n);
  if (n16 <= 4 * kW) {
    // The same operations on a row of up to four registers, kept in them (no store and reload per pass).
    Vec16 x[4] = {};
    Vec16 vmax = splat<W>(-3.0e38f);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      if (v * kW >= n16) break;
      x[v] = load16<W>(row + v * kW) * scale;
      x[v] = lanes<W>(v * kW) < n ? x[v] : splat<W>(-3.0e38f);
      vmax = x[v] > vmax ? x[v] : vmax;
    }
    const float mx = hmax<W>(vmax);
    Vec16 vsum = {};
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      if (v * kW >= n16) break;
      x[v] = fast_exp16<W>(x[v] - mx);
      x[v] = lanes<W>(v * kW) < n ? x[v] : Vec16{};
      vsum += x[v];
    }
    const float sum = hsum<W>(vsum);
    const float inv = 1.0f / sum;
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      if (v * kW >= n16) break;
      store16<W>(row + v * kW, x[v] * inv);
    }
    return mx + std::log(sum);
  }
  Vec16 vmax = splat<W>(-3.0e38f);
  for (int jb = 0; jb < n16; jb += kW) {
    Vec16 x = load16<W>(row + jb) * scale;
    x = lanes<W>(jb) < n ? x : splat<W>(-3.0e38f);
    store16<W>(row + jb, x);
    vmax = x > vmax ? x : vmax;
  }
  const float mx = hmax<W>(vmax);
  Vec16 vsum = {};
  for (int jb = 0; jb < n16; jb += kW) {
    Vec16 e = fast_exp16<W>(load16<W>(row + jb) - mx);
    e = lanes<W>(jb) < n ? e : Vec16{};
    store16<W>(row + jb, e);
    vsum += e;
  }
  const float sum = hsum<W>(vsum);
  const float inv = 1.0f / sum;
  for (int jb = 0; jb < n16; jb += kW) store16<W>(row + jb, load16<W>(row + jb) * inv);
  return mx + std::log(sum);
}

template <int W>
TRIDENT_KERNEL_BODY void attn_fwd_head_body(float* out, float* lse, const float* qkv, int T, int C, int hd, float scale,
                                            Scratch& sc) {
  TRIDENT_VEC_TYPES;
  const size_t ld = 3 * static_cast<size_t>(C), tp = align_floats(T);
  float* kt = sc.kt.data();
  transpose_head_body(kt, tp, qkv + C, ld, T, hd);
  const float* v = qkv + 2 * C;
  float* row = sc.s.data();
  for (int i = 0; i < T; ++i) {
    const int n = i + 1;
    const int n16 = round_up<W>(n);
    row_times_matrix<W>(row, qkv + i * ld, kt, tp, hd, n16, scale);
    lse[i] = masked_softmax_row<W>(row, n, 1.0f);  // already scaled (x 1 is exact)
    weighted_row_sum<W>(out + static_cast<size_t>(i) * C, row, 1, v, ld, 0, n, hd);
  }
}
TRIDENT_ISA_CLONES_W(void, attn_fwd_head,
                   (float* out, float* lse, const float* qkv, int T, int C, int hd, float scale, Scratch& sc),
                   (out, lse, qkv, T, C, hd, scale, sc));
static void attn_fwd_head(float* out, float* lse, const float* qkv, int T, int C, int hd, float scale, Scratch& sc) {
  return TRIDENT_ISA_CALL(attn_fwd_head, (out, lse, qkv, T, C, hd, scale, sc));
}

// trident's own GEMM path (levels avx2 and up): the products of a head run through the level's
// register-blocked GEMM (gemm_avx512.cc, gemm_avx2.cc), skipping the causal triangle's zeros; softmax
// passes in between. Each score and output element is one FMA chain in index order.
using detail::Tri;

// Row i of S (stride tp) holds q_i.k_j for j <= i on entry; on return exp(scale s - lse_i) normalized (P),
// zero for j > i up to the padded row end; lse[i] set.
// masked_softmax_row's operations on every row, in three passes over the rows: the maxima, then the exps
// and their sums, then the normalization and lse. Row by row, the max tree, the sum tree and the division
// formed one dependent chain per row that the core could not overlap with the next row (a third of the
// forward head's time); across passes no row waits on another. Same operations, same bits.
template <int W>
TRIDENT_KERNEL_BODY void causal_softmax_rows_body(float* S, size_t tp, float* lse, int T, float scale) {
  TRIDENT_VEC_TYPES;
  thread_local std::vector<float> sums;
  if (sums.size() < static_cast<size_t>(T)) sums.resize(static_cast<size_t>(T));
  const int tend = round_up<W>(T);
  for (int i = 0; i < T; ++i) {  // lse[i] holds the row's max until the last pass
    const int n = i + 1, n16 = round_up<W>(n);
    const float* row = S + i * tp;
    Vec16 vmax = splat<W>(-3.0e38f);
    for (int jb = 0; jb < n16; jb += kW) {
      Vec16 x = load16<W>(row + jb) * scale;
      x = lanes<W>(jb) < n ? x : splat<W>(-3.0e38f);
      vmax = x > vmax ? x : vmax;
    }
    lse[i] = hmax<W>(vmax);
  }
  for (int i = 0; i < T; ++i) {
    const int n = i + 1, n16 = round_up<W>(n);
    float* row = S + i * tp;
    const float mx = lse[i];
    Vec16 vsum = {};
    for (int jb = 0; jb < n16; jb += kW) {
      Vec16 x = load16<W>(row + jb) * scale;
      x = lanes<W>(jb) < n ? x : splat<W>(-3.0e38f);
      Vec16 e = fast_exp16<W>(x - mx);
      e = lanes<W>(jb) < n ? e : Vec16{};
      store16<W>(row + jb, e);
      vsum += e;
    }
    sums[i] = hsum<W>(vsum);
  }
  for (int i = 0; i < T; ++i) {
    const int n16 = round_up<W>(i + 1);
    float* row = S + i * tp;
    const float sum = sums[i], inv = 1.0f / sum;
    for (int jb = 0; jb < n16; jb += kW) store16<W>(row + jb, load16<W>(row + jb) * inv);
    for (int jb = n16; jb < tend; jb += kW) store16<W>(row + jb, Vec16{});
    lse[i] += std::log(sum);
  }
}
TRIDENT_ISA_CLONES_W(void, causal_softmax_rows, (float* S, size_t tp, float* lse, int T, float scale),
                   (S, tp, lse, T, scale));
static void causal_softmax_rows(float* S, size_t tp, float* lse, int T, float scale) {
  return TRIDENT_ISA_CALL(causal_softmax_rows, (S, tp, lse, T, scale));
}

// On entry P holds q_i.k_j and dS holds dO_i.v_j (j <= i); on return P = exp(scale s - lse_i) and
// dS = P (dP - D_i) scale, both zero for j > i up to the padded row end. Dv[i] = D_i = dO_i . O_i.
template <int W>
TRIDENT_KERNEL_BODY void causal_softmax_grad_rows_body(float* P, float* dS, size_t tp, const float* Dv,
                                                       const float* lse, int T, float scale) {
  TRIDENT_VEC_TYPES;
  const int tend = round_up<W>(T);
  for (int i = 0; i < T; ++i) {
    const int n = i + 1, n16 = round_up<W>(n);
    float* p = P + i * tp;
    float* ds = dS + i * tp;
    const float l = lse[i];
    const float D = Dv[i];
    for (int jb = 0; jb < n16; jb += kW) {
      const auto valid = lanes<W>(jb) < n;
      Vec16 pj = fast_exp16<W>(load16<W>(p + jb) * scale - l);
      pj = valid ? pj : Vec16{};
      store16<W>(p + jb, pj);
      // Lanes past the diagonal are selected away, not multiplied by 0: they may hold stale scratch.
      const Vec16 g = pj * (load16<W>(ds + jb) - D) * scale;
      store16<W>(ds + jb, valid ? g : Vec16{});
    }
    for (int jb = n16; jb < tend; jb += kW) {
      store16<W>(p + jb, Vec16{});
      store16<W>(ds + jb, Vec16{});
    }
  }
}
TRIDENT_ISA_CLONES_W(void, causal_softmax_grad_rows,
                   (float* P, float* dS, size_t tp, const float* Dv, const float* lse, int T, float scale),
                   (P, dS, tp, Dv, lse, T, scale));
static void causal_softmax_grad_rows(float* P, float* dS, size_t tp, const float* Dv, const float* lse, int T,
                                     float scale) {
  return TRIDENT_ISA_CALL(causal_softmax_grad_rows, (P, dS, tp, Dv, lse, T, scale));
}

// D[(b NH + h) T + t] = dO . O over head h's hd columns of row (b, t). One pass over the rows in memory
// order (the hardware prefetcher streams them): read per head inside the backward, O's rows (cold since the
// forward) cost a cache miss each on the critical path. Order: lane l of a W-wide accumulator sums the d
// with d mod W = l in order (the tail d past the last whole vector in lanes 0..), then the lanes' halving
// tree; fixed by hd and W alone, so the same on every thread count. (A scalar chain of hd dependent adds
// per row and head was most of this pass.)
template <int W>
TRIDENT_KERNEL_BODY void attn_row_dots_body(float* D, const float* dout, const float* out, int64_t r0, int64_t rows,
                                            int T, int C, int NH, int hd) {
  TRIDENT_VEC_TYPES;
  const int hv = hd / kW * kW;
  for (int64_t r = r0; r < r0 + rows; ++r) {
    const int64_t b = r / T, t = r % T;
    const float* go = dout + r * C;
    const float* o = out + r * C;
    for (int h = 0; h < NH; ++h) {
      const float* g = go + h * hd;
      const float* x = o + h * hd;
      Vec16 acc = {};
      for (int d = 0; d < hv; d += kW) acc += load16<W>(g + d) * load16<W>(x + d);
      for (int d = hv; d < hd; ++d) acc[d - hv] += g[d] * x[d];
      D[(b * NH + h) * T + t] = hsum<W>(acc);
    }
  }
}
TRIDENT_ISA_CLONES_W(void, attn_row_dots,
                   (float* D, const float* dout, const float* out, int64_t r0, int64_t rows, int T, int C, int NH,
                    int hd),
                   (D, dout, out, r0, rows, T, C, NH, hd));

static void attn_fwd_head_native(float* out, float* lse, const float* qkv, int T, int C, int hd, float scale,
                                 Scratch& sc) {
  const int ld = 3 * C, tp = static_cast<int>(align_floats(T));
  const detail::TriGemm product = detail::native_tri_gemm();
  float* S = sc.s.data();
  product(false, true, T, T, hd, qkv, ld, qkv + C, ld, false, S, tp, Tri::kLowerC);
  causal_softmax_rows(S, tp, lse, T, scale);
  product(false, false, T, hd, T, S, tp, qkv + 2 * C, ld, false, out, C, Tri::kLowerA);
}

static void attn_bwd_head_native(float* dqkv, const float* dout, const float* qkv, const float* Dv, const float* lse,
                                 int T, int C, int hd, float scale, Scratch& sc) {
  const int ld = 3 * C, tp = static_cast<int>(align_floats(T));
  const detail::TriGemm product = detail::native_tri_gemm();
  float* P = sc.s.data();
  float* dS = sc.ds.data();
  const float* q = qkv;
  const float* k = qkv + C;
  const float* v = qkv + 2 * C;
  product(false, true, T, T, hd, q, ld, k, ld, false, P, tp, Tri::kLowerC);
  product(false, true, T, T, hd, dout, C, v, ld, false, dS, tp, Tri::kLowerC);
  causal_softmax_grad_rows(P, dS, tp, Dv, lse, T, scale);
  // dQ = dS K; dK = dS^T Q; dV = P^T dO.
  product(false, false, T, hd, T, dS, tp, k, ld, false, dqkv, ld, Tri::kLowerA);
  product(true, false, T, hd, T, dS, tp, q, ld, false, dqkv + C, ld, Tri::kUpperA);
  product(true, false, T, hd, T, P, tp, dout, C, false, dqkv + 2 * C, ld, Tri::kUpperA);
}

namespace detail {
int flash_bf16_min_t() { return g_flash_min_t.load(std::memory_order_relaxed); }
void set_flash_bf16_min_t(int t) { g_flash_min_t.store(std::max(1, t), std::memory_order_relaxed); }

std::string attention_kernel(Isa isa, Precision p) {
  switch (attn_path(static_cast<int>(isa), p, std::numeric_limits<int>::max())) {
    case AttnPath::kFlashBf16:
      return "avx512bf16-flash (vdpbf16ps tiles, online softmax; float32 kernel below T " +
             std::to_string(flash_bf16_min_t()) + ")";
    case AttnPath::kGemm:
      return isa >= Isa::kAvx512 ? "avx512 (gemm-blocked)" : "avx2 (gemm-blocked)";
    case AttnPath::kRows:
      break;
  }
  return "row-blocked x86-64";
}
}  // namespace detail

// Heads are independent: one task per (batch, head), each on its thread's scratch.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, Precision p) {
  check_shape(C, NH);
  if (attn_path(detail::isa_level(), p, T) == AttnPath::kFlashBf16) {
    detail::flash_bf16_forward(out, lse, qkv, B, T, C, NH);
    return;
  }
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool native = detail::native_kernels_enabled();
  parallel_for(static_cast<int64_t>(B) * NH, [&](int64_t t) {
    const int b = static_cast<int>(t / NH), h = static_cast<int>(t % NH);
    g_scratch.ensure(T, hd);
    float* o = out + static_cast<size_t>(b) * T * C + h * hd;
    float* l = lse + (static_cast<size_t>(b) * NH + h) * T;
    const float* x = qkv + static_cast<size_t>(b) * T * 3 * C + h * hd;
    if (native) attn_fwd_head_native(o, l, x, T, C, hd, scale, g_scratch);
    else attn_fwd_head(o, l, x, T, C, hd, scale, g_scratch);
  });
}

template <int W>
TRIDENT_KERNEL_BODY void attn_bwd_head_body(float* dqkv, const float* dout, const float* qkv, const float* out,
                                            const float* lse, int T, int C, int hd, float scale, Scratch& sc) {
  TRIDENT_VEC_TYPES;
  const size_t ld = 3 * static_cast<size_t>(C), tp = align_floats(T);
  const float* q = qkv;
  const float* k = qkv + C;
  const float* v = qkv + 2 * C;
  float* P = sc.s.data();
  float* dS = sc.ds.data();
  float* kt = sc.kt.data();
  float* vt = sc.vt.data();
  transpose_head_body(kt, tp, k, ld, T, hd);
  transpose_head_body(vt, tp, v, ld, T, hd);
  for (int i = 0; i < T; ++i) {
    const int n = i + 1, n16 = round_up<W>(n);
    float* p = P + i * tp;
    float* ds = dS + i * tp;
    const float* go = dout + static_cast<size_t>(i) * C;
    const float* o = out + static_cast<size_t>(i) * C;
    const float l = lse[i];
    // Recompute P_i = exp(scale q_i.k_j - lse_i); dP_i = dO_i . v_j; D_i = dO_i . O_i.
    row_times_matrix<W>(p, q + i * ld, kt, tp, hd, n16, scale);
    row_times_matrix<W>(ds, go, vt, tp, hd, n16, 1.0f);
    float D = 0.0f;
    for (int d = 0; d < hd; ++d) D += go[d] * o[d];
    for (int jb = 0; jb < n16; jb += kW) {
      const auto valid = lanes<W>(jb) < n;
      Vec16 pj = fast_exp16<W>(load16<W>(p + jb) - l);
      pj = valid ? pj : Vec16{};
      store16<W>(p + jb, pj);
      store16<W>(ds + jb, pj * (load16<W>(ds + jb) - D) * scale);
    }
    // dQ_i = sum_j dS_ij k_j.
    weighted_row_sum<W>(dqkv + i * ld, ds, 1, k, ld, 0, n, hd);
  }
  // dK_j = sum_{i>=j} dS_ij q_i;  dV_j = sum_{i>=j} P_ij dO_i.
  for (int j = 0; j < T; ++j) {
    weighted_row_sum<W>(dqkv + C + j * ld, dS + j, tp, q, ld, j, T, hd);
    weighted_row_sum<W>(dqkv + 2 * C + j * ld, P + j, tp, dout, C, j, T, hd);
  }
}
TRIDENT_ISA_CLONES_W(void, attn_bwd_head,
                   (float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int T, int C,
                    int hd, float scale, Scratch& sc),
                   (dqkv, dout, qkv, out, lse, T, C, hd, scale, sc));
static void attn_bwd_head(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int T,
                          int C, int hd, float scale, Scratch& sc) {
  return TRIDENT_ISA_CALL(attn_bwd_head, (dqkv, dout, qkv, out, lse, T, C, hd, scale, sc));
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH, Precision p) {
  check_shape(C, NH);
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool flash = attn_path(detail::isa_level(), p, T) == AttnPath::kFlashBf16;
  const bool native = flash || detail::native_kernels_enabled();
  // D_i = dO_i . O_i for every row and head, laid out as lse (the tasks below run on other threads: the
  // caller's thread-local buffer is passed by pointer).
  thread_local AlignedFloats dots;
  float* D = nullptr;
  if (native) {
    const int64_t rows = static_cast<int64_t>(B) * T;
    if (dots.size() < static_cast<size_t>(rows) * NH) dots.resize(static_cast<size_t>(rows) * NH);
    D = dots.data();
    parallel_chunks(rows, std::max<int64_t>(1, 16384 / C), [&](int64_t r0, int64_t n) {
      TRIDENT_ISA_CALL(attn_row_dots, (D, dout, out, r0, n, T, C, NH, hd));
    });
  }
  if (flash) {
    detail::flash_bf16_backward(dqkv, dout, qkv, lse, D, B, T, C, NH);
    return;
  }
  parallel_for(static_cast<int64_t>(B) * NH, [&](int64_t t) {
    const int b = static_cast<int>(t / NH), h = static_cast<int>(t % NH);
    g_scratch.ensure(T, hd);
    const size_t base3 = static_cast<size_t>(b) * T * 3 * C + h * hd;
    const size_t base = static_cast<size_t>(b) * T * C + h * hd;
    const float* l = lse + (static_cast<size_t>(b) * NH + h) * T;
    if (native) attn_bwd_head_native(dqkv + base3, dout + base, qkv + base3, D + (l - lse), l, T, C, hd, scale,
                                     g_scratch);
    else attn_bwd_head(dqkv + base3, dout + base, qkv + base3, out + base, l, T, C, hd, scale, g_scratch);
  });
}

}  // namespace trident::kernels::cpu
