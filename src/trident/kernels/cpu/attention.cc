// Causal multi-head self-attention, forward and backward, one (batch, head) at a time.
// Forward keeps only the output and the log-sum-exp of each score row; backward recomputes the
// probabilities from q, k and lse (as FlashAttention does), so saved memory is O(B*T*C), not
// O(B*NH*T*T); a T x T scratch per call is reused across heads.
// Every product is written as "row += scalar * contiguous row" (vectorized over the row, no horizontal
// reductions), with K and V transposed into scratch where a dot product over the head dim would be needed.
#include <cmath>
#include <cstring>
#include <vector>

#include "trident/core/error.h"
#include "trident/kernels/aligned.h"
#include "trident/kernels/cpu/gemm_avx512.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/simd.h"

// Vec16 helpers are inlined into per-ISA clones; the ABI note about passing them by value does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace trident::kernels::cpu {

using detail::fast_exp;

namespace {
void check_shape(int C, int NH) {
  TRIDENT_CHECK(NH > 0 && C % NH == 0, InvalidArgument, "attention: n_embd {} must be divisible by n_head {}", C,
                NH);
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

// Vector width of the register blocks: one AVX-512 register (two AVX2 ones, four SSE ones; GCC's
// vector extension lowers it for each clone).
constexpr int kW = 16;
typedef float Vec16 __attribute__((vector_size(64)));

__attribute__((always_inline)) static inline Vec16 load16(const float* p) {
  Vec16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) static inline void store16(float* p, Vec16 v) { std::memcpy(p, &v, sizeof(v)); }

// out[0..n16) = scale * sum_d a[d] * mt[d][0..n16) (mt rows at stride tp; n16 a multiple of kW).
// Up to four accumulator blocks stay in registers across the d loop (independent FMA chains).
__attribute__((always_inline)) static inline void row_times_matrix(float* out, const float* a, const float* mt, size_t tp, int hd, int n16,
                                    float scale) {
  int jb = 0;
  for (; jb + 4 * kW <= n16; jb += 4 * kW) {
    Vec16 c0 = {}, c1 = {}, c2 = {}, c3 = {};
    for (int d = 0; d < hd; ++d) {
      const float x = a[d];
      const float* m = mt + d * tp + jb;
      c0 += x * load16(m);
      c1 += x * load16(m + kW);
      c2 += x * load16(m + 2 * kW);
      c3 += x * load16(m + 3 * kW);
    }
    store16(out + jb, c0 * scale);
    store16(out + jb + kW, c1 * scale);
    store16(out + jb + 2 * kW, c2 * scale);
    store16(out + jb + 3 * kW, c3 * scale);
  }
  for (; jb + 2 * kW <= n16; jb += 2 * kW) {
    Vec16 c0 = {}, c1 = {}, e0 = {}, e1 = {};
    int d = 0;
    for (; d + 1 < hd; d += 2) {
      const float* m = mt + d * tp + jb;
      c0 += a[d] * load16(m);
      c1 += a[d] * load16(m + kW);
      e0 += a[d + 1] * load16(m + tp);
      e1 += a[d + 1] * load16(m + tp + kW);
    }
    if (d < hd) {
      c0 += a[d] * load16(mt + d * tp + jb);
      c1 += a[d] * load16(mt + d * tp + jb + kW);
    }
    store16(out + jb, (c0 + e0) * scale);
    store16(out + jb + kW, (c1 + e1) * scale);
  }
  for (; jb < n16; jb += kW) {
    Vec16 c0 = {}, c1 = {}, c2 = {}, c3 = {};
    int d = 0;
    for (; d + 3 < hd; d += 4) {
      const float* m = mt + d * tp + jb;
      c0 += a[d] * load16(m);
      c1 += a[d + 1] * load16(m + tp);
      c2 += a[d + 2] * load16(m + 2 * tp);
      c3 += a[d + 3] * load16(m + 3 * tp);
    }
    for (; d < hd; ++d) c0 += a[d] * load16(mt + d * tp + jb);
    store16(out + jb, ((c0 + c1) + (c2 + c3)) * scale);
  }
}

// out[0..hd) = sum_{j in [j0, j1)} w[j * wstride] * rows[j * ld + 0..hd); blocks of kW over d (two
// independent chains per block: even and odd j), remainder scalar.
__attribute__((always_inline)) static inline void weighted_row_sum(float* out, const float* w, size_t wstride, const float* rows, size_t ld, int j0,
                                    int j1, int hd) {
  int db = 0;
  for (; db + 2 * kW <= hd; db += 2 * kW) {
    Vec16 a0 = {}, a1 = {}, b0 = {}, b1 = {};
    int j = j0;
    for (; j + 1 < j1; j += 2) {
      const float x = w[j * wstride], y = w[(j + 1) * wstride];
      const float* r = rows + j * ld + db;
      a0 += x * load16(r);
      a1 += x * load16(r + kW);
      b0 += y * load16(r + ld);
      b1 += y * load16(r + ld + kW);
    }
    if (j < j1) {
      const float x = w[j * wstride];
      a0 += x * load16(rows + j * ld + db);
      a1 += x * load16(rows + j * ld + db + kW);
    }
    store16(out + db, a0 + b0);
    store16(out + db + kW, a1 + b1);
  }
  for (; db + kW <= hd; db += kW) {
    Vec16 a0 = {}, b0 = {};
    int j = j0;
    for (; j + 1 < j1; j += 2) {
      a0 += w[j * wstride] * load16(rows + j * ld + db);
      b0 += w[(j + 1) * wstride] * load16(rows + (j + 1) * ld + db);
    }
    if (j < j1) a0 += w[j * wstride] * load16(rows + j * ld + db);
    store16(out + db, a0 + b0);
  }
  for (; db < hd; ++db) {
    float acc = 0.0f;
    for (int j = j0; j < j1; ++j) acc += w[j * wstride] * rows[j * ld + db];
    out[db] = acc;
  }
}

typedef int32_t Int16 __attribute__((vector_size(64)));

__attribute__((always_inline)) static inline Vec16 splat(float x) { return Vec16{} + x; }

// Lane indices base + 0..15.
__attribute__((always_inline)) static inline Int16 lanes(int base) {
  return Int16{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} + base;
}

// detail::fast_exp on 16 lanes (same operations, same results).
__attribute__((always_inline)) static inline Vec16 fast_exp16(Vec16 x) {
  x = x < splat(-87.3f) ? splat(-87.3f) : x;
  x = x > splat(88.7f) ? splat(88.7f) : x;
  const float kShift = 12582912.0f;
  Vec16 t = x * 1.44269504088896341f + kShift;
  Vec16 n = t - kShift;
  Vec16 r = x - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723e-06f;
  Vec16 p = splat(1.0f / 720.0f);
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

__attribute__((always_inline)) static inline float hmax(Vec16 v) {
  float m = v[0];
  for (int k = 1; k < kW; ++k) m = v[k] > m ? v[k] : m;
  return m;
}
__attribute__((always_inline)) static inline float hsum(Vec16 v) {
  float s = 0.0f;
  for (int k = 0; k < kW; ++k) s += v[k];
  return s;
}

__attribute__((always_inline)) static inline int round_up(int n) { return (n + kW - 1) / kW * kW; }

// Softmax of one causal row in place: row[j] * scale for j < n, over the row padded to round_up(n) lanes
// (lanes j >= n are masked to -inf-like before, and 0 after, the exp). Returns the log-sum-exp.
__attribute__((always_inline)) static inline float masked_softmax_row(float* row, int n, float scale) {
  const int n16 = round_up(n);
  Vec16 vmax = splat(-3.0e38f);
  for (int jb = 0; jb < n16; jb += kW) {
    Vec16 x = load16(row + jb) * scale;
    x = lanes(jb) < n ? x : splat(-3.0e38f);
    store16(row + jb, x);
    vmax = x > vmax ? x : vmax;
  }
  const float mx = hmax(vmax);
  Vec16 vsum = {};
  for (int jb = 0; jb < n16; jb += kW) {
    Vec16 e = fast_exp16(load16(row + jb) - mx);
    e = lanes(jb) < n ? e : Vec16{};
    store16(row + jb, e);
    vsum += e;
  }
  const float sum = hsum(vsum);
  const float inv = 1.0f / sum;
  for (int jb = 0; jb < n16; jb += kW) store16(row + jb, load16(row + jb) * inv);
  return mx + std::log(sum);
}

TRIDENT_KERNEL_BODY void attn_fwd_head_body(float* out, float* lse, const float* qkv, int T, int C, int hd, float scale,
                                            Scratch& sc) {
  const size_t ld = 3 * static_cast<size_t>(C), tp = align_floats(T);
  float* kt = sc.kt.data();
  transpose_head_body(kt, tp, qkv + C, ld, T, hd);
  const float* v = qkv + 2 * C;
  float* row = sc.s.data();
  for (int i = 0; i < T; ++i) {
    const int n = i + 1;
    const int n16 = round_up(n);
    row_times_matrix(row, qkv + i * ld, kt, tp, hd, n16, scale);
    lse[i] = masked_softmax_row(row, n, 1.0f);  // already scaled (x 1 is exact)
    weighted_row_sum(out + static_cast<size_t>(i) * C, row, 1, v, ld, 0, n, hd);
  }
}
TRIDENT_ISA_CLONES(void, attn_fwd_head,
                   (float* out, float* lse, const float* qkv, int T, int C, int hd, float scale, Scratch& sc),
                   (out, lse, qkv, T, C, hd, scale, sc));
static void attn_fwd_head(float* out, float* lse, const float* qkv, int T, int C, int hd, float scale, Scratch& sc) {
  return TRIDENT_ISA_CALL(attn_fwd_head, (out, lse, qkv, T, C, hd, scale, sc));
}

// AVX-512 path: the three products of a head run through the register-blocked GEMM (gemm_avx512.cc),
// skipping the causal triangle's zeros; softmax passes in between. Each score and output element is one
// FMA chain in index order.
using detail::Tri;

// Row i of S (stride tp) holds q_i.k_j for j <= i on entry; on return exp(scale s - lse_i) normalized (P),
// zero for j > i up to the padded row end; lse[i] set.
TRIDENT_KERNEL_BODY void causal_softmax_rows_body(float* S, size_t tp, float* lse, int T, float scale) {
  const int tend = round_up(T);
  for (int i = 0; i < T; ++i) {
    const int n = i + 1, n16 = round_up(n);
    float* row = S + i * tp;
    lse[i] = masked_softmax_row(row, n, scale);
    for (int jb = n16; jb < tend; jb += kW) store16(row + jb, Vec16{});
  }
}
TRIDENT_ISA_CLONES(void, causal_softmax_rows, (float* S, size_t tp, float* lse, int T, float scale),
                   (S, tp, lse, T, scale));
static void causal_softmax_rows(float* S, size_t tp, float* lse, int T, float scale) {
  return TRIDENT_ISA_CALL(causal_softmax_rows, (S, tp, lse, T, scale));
}

// On entry P holds q_i.k_j and dS holds dO_i.v_j (j <= i); on return P = exp(scale s - lse_i) and
// dS = P (dP - D_i) scale, both zero for j > i up to the padded row end.
TRIDENT_KERNEL_BODY void causal_softmax_grad_rows_body(float* P, float* dS, size_t tp, const float* dout,
                                                       const float* out, const float* lse, int T, int C, int hd,
                                                       float scale) {
  const int tend = round_up(T);
  for (int i = 0; i < T; ++i) {
    const int n = i + 1, n16 = round_up(n);
    float* p = P + i * tp;
    float* ds = dS + i * tp;
    const float* go = dout + static_cast<size_t>(i) * C;
    const float* o = out + static_cast<size_t>(i) * C;
    const float l = lse[i];
    float D = 0.0f;
    for (int d = 0; d < hd; ++d) D += go[d] * o[d];
    for (int jb = 0; jb < n16; jb += kW) {
      const auto valid = lanes(jb) < n;
      Vec16 pj = fast_exp16(load16(p + jb) * scale - l);
      pj = valid ? pj : Vec16{};
      store16(p + jb, pj);
      // Lanes past the diagonal are selected away, not multiplied by 0: they may hold stale scratch.
      const Vec16 g = pj * (load16(ds + jb) - D) * scale;
      store16(ds + jb, valid ? g : Vec16{});
    }
    for (int jb = n16; jb < tend; jb += kW) {
      store16(p + jb, Vec16{});
      store16(ds + jb, Vec16{});
    }
  }
}
TRIDENT_ISA_CLONES(void, causal_softmax_grad_rows,
                   (float* P, float* dS, size_t tp, const float* dout, const float* out, const float* lse, int T, int C,
                    int hd, float scale),
                   (P, dS, tp, dout, out, lse, T, C, hd, scale));
static void causal_softmax_grad_rows(float* P, float* dS, size_t tp, const float* dout, const float* out,
                                     const float* lse, int T, int C, int hd, float scale) {
  return TRIDENT_ISA_CALL(causal_softmax_grad_rows, (P, dS, tp, dout, out, lse, T, C, hd, scale));
}

static void attn_fwd_head_native(float* out, float* lse, const float* qkv, int T, int C, int hd, float scale,
                                 Scratch& sc) {
  const int ld = 3 * C, tp = static_cast<int>(align_floats(T));
  float* S = sc.s.data();
  detail::gemm_avx512(false, true, T, T, hd, qkv, ld, qkv + C, ld, false, S, tp, Tri::kLowerC);
  causal_softmax_rows(S, tp, lse, T, scale);
  detail::gemm_avx512(false, false, T, hd, T, S, tp, qkv + 2 * C, ld, false, out, C, Tri::kLowerA);
}

static void attn_bwd_head_native(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                                 int T, int C, int hd, float scale, Scratch& sc) {
  const int ld = 3 * C, tp = static_cast<int>(align_floats(T));
  float* P = sc.s.data();
  float* dS = sc.ds.data();
  const float* q = qkv;
  const float* k = qkv + C;
  const float* v = qkv + 2 * C;
  detail::gemm_avx512(false, true, T, T, hd, q, ld, k, ld, false, P, tp, Tri::kLowerC);
  detail::gemm_avx512(false, true, T, T, hd, dout, C, v, ld, false, dS, tp, Tri::kLowerC);
  causal_softmax_grad_rows(P, dS, tp, dout, out, lse, T, C, hd, scale);
  // dQ = dS K; dK = dS^T Q; dV = P^T dO.
  detail::gemm_avx512(false, false, T, hd, T, dS, tp, k, ld, false, dqkv, ld, Tri::kLowerA);
  detail::gemm_avx512(true, false, T, hd, T, dS, tp, q, ld, false, dqkv + C, ld, Tri::kUpperA);
  detail::gemm_avx512(true, false, T, hd, T, P, tp, dout, C, false, dqkv + 2 * C, ld, Tri::kUpperA);
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  check_shape(C, NH);
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  g_scratch.ensure(T, hd);
  if (detail::native_kernels_enabled()) {
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        attn_fwd_head_native(out + static_cast<size_t>(b) * T * C + h * hd, lse + (static_cast<size_t>(b) * NH + h) * T,
                             qkv + static_cast<size_t>(b) * T * 3 * C + h * hd, T, C, hd, scale, g_scratch);
    return;
  }
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      attn_fwd_head(out + static_cast<size_t>(b) * T * C + h * hd, lse + (static_cast<size_t>(b) * NH + h) * T,
                    qkv + static_cast<size_t>(b) * T * 3 * C + h * hd, T, C, hd, scale, g_scratch);
}

TRIDENT_KERNEL_BODY void attn_bwd_head_body(float* dqkv, const float* dout, const float* qkv, const float* out,
                                            const float* lse, int T, int C, int hd, float scale, Scratch& sc) {
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
    const int n = i + 1, n16 = round_up(n);
    float* p = P + i * tp;
    float* ds = dS + i * tp;
    const float* go = dout + static_cast<size_t>(i) * C;
    const float* o = out + static_cast<size_t>(i) * C;
    const float l = lse[i];
    // Recompute P_i = exp(scale q_i.k_j - lse_i); dP_i = dO_i . v_j; D_i = dO_i . O_i.
    row_times_matrix(p, q + i * ld, kt, tp, hd, n16, scale);
    row_times_matrix(ds, go, vt, tp, hd, n16, 1.0f);
    float D = 0.0f;
    for (int d = 0; d < hd; ++d) D += go[d] * o[d];
    for (int jb = 0; jb < n16; jb += kW) {
      const auto valid = lanes(jb) < n;
      Vec16 pj = fast_exp16(load16(p + jb) - l);
      pj = valid ? pj : Vec16{};
      store16(p + jb, pj);
      store16(ds + jb, pj * (load16(ds + jb) - D) * scale);
    }
    // dQ_i = sum_j dS_ij k_j.
    weighted_row_sum(dqkv + i * ld, ds, 1, k, ld, 0, n, hd);
  }
  // dK_j = sum_{i>=j} dS_ij q_i;  dV_j = sum_{i>=j} P_ij dO_i.
  for (int j = 0; j < T; ++j) {
    weighted_row_sum(dqkv + C + j * ld, dS + j, tp, q, ld, j, T, hd);
    weighted_row_sum(dqkv + 2 * C + j * ld, P + j, tp, dout, C, j, T, hd);
  }
}
TRIDENT_ISA_CLONES(void, attn_bwd_head,
                   (float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int T, int C,
                    int hd, float scale, Scratch& sc),
                   (dqkv, dout, qkv, out, lse, T, C, hd, scale, sc));
static void attn_bwd_head(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int T,
                          int C, int hd, float scale, Scratch& sc) {
  return TRIDENT_ISA_CALL(attn_bwd_head, (dqkv, dout, qkv, out, lse, T, C, hd, scale, sc));
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH) {
  check_shape(C, NH);
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  g_scratch.ensure(T, hd);
  const bool native = detail::native_kernels_enabled();
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      if (native) {
        const size_t base3 = static_cast<size_t>(b) * T * 3 * C + h * hd;
        const size_t base = static_cast<size_t>(b) * T * C + h * hd;
        attn_bwd_head_native(dqkv + base3, dout + base, qkv + base3, out + base,
                             lse + (static_cast<size_t>(b) * NH + h) * T, T, C, hd, scale, g_scratch);
        continue;
      }
      const size_t base3 = static_cast<size_t>(b) * T * 3 * C + h * hd;
      const size_t base = static_cast<size_t>(b) * T * C + h * hd;
      attn_bwd_head(dqkv + base3, dout + base, qkv + base3, out + base, lse + (static_cast<size_t>(b) * NH + h) * T, T,
                    C, hd, scale, g_scratch);
    }
}

}  // namespace trident::kernels::cpu
