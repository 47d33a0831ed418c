// The Llama family's row kernels: RMSNorm, rotary position embeddings, SwiGLU, and grouped-query attention's
// key/value expansion and its adjoint. Rows are split over the pool in chunks fixed by the sizes (about kGrain
// elements each), and RMSNorm's weight gradient by columns, each column summing its rows in order, so every
// thread count computes the same bits (as elementwise.cc). Loops are compiled per ISA level (simd.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "trident/core/error.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/simd.h"
#include "trident/kernels/cpu/thread_pool.h"

namespace trident::kernels::cpu {

using detail::fast_exp;

namespace {
constexpr int64_t kGrain = 16384;  // elements per task, as elementwise.cc
int64_t row_grain(int64_t width) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(width, 1)); }
}  // namespace

// ---- RMSNorm ----

TRIDENT_KERNEL_BODY void rmsnorm_forward_body(float* out, float* rstd, const float* inp, const float* weight, int N,
                                              int C, float eps) {
  for (int r = 0; r < N; ++r) {
    const float* x = inp + static_cast<size_t>(r) * C;
    float* o = out + static_cast<size_t>(r) * C;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < C; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / C + static_cast<double>(eps)));
    for (int i = 0; i < C; ++i) o[i] = x[i] * rs * weight[i];
    if (rstd) rstd[r] = rs;
  }
}
TRIDENT_ISA_CLONES(void, rmsnorm_forward,
                   (float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps),
                   (out, rstd, inp, weight, N, C, eps));
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  parallel_chunks(N, row_grain(C), [&](int64_t r, int64_t rows) {
    TRIDENT_ISA_CALL(rmsnorm_forward, (out + r * C, rstd ? rstd + r : nullptr, inp + r * C, weight,
                                       static_cast<int>(rows), C, eps));
  });
}

// y = x rs w with rs = (mean x^2 + eps)^-1/2: dx = rs (w g - x rs mean_c(w g x rs)).
TRIDENT_KERNEL_BODY void rmsnorm_backward_rows_body(float* dinp, const float* dout, const float* inp,
                                                    const float* weight, const float* rstd, int N, int C) {
  for (int r = 0; r < N; ++r) {
    const float* x = inp + static_cast<size_t>(r) * C;
    const float* g = dout + static_cast<size_t>(r) * C;
    float* dx = dinp + static_cast<size_t>(r) * C;
    const float rs = rstd[r];
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; ++i) s += static_cast<double>(weight[i] * g[i]) * (x[i] * rs);
    const float m = static_cast<float>(s / C);
    for (int i = 0; i < C; ++i) dx[i] += (weight[i] * g[i] - x[i] * rs * m) * rs;
  }
}
TRIDENT_ISA_CLONES(void, rmsnorm_backward_rows,
                   (float* dinp, const float* dout, const float* inp, const float* weight, const float* rstd, int N,
                    int C),
                   (dinp, dout, inp, weight, rstd, N, C));

// dweight[0..w) summed over rows 0..N-1 in order; x and dout rows at stride ld.
TRIDENT_KERNEL_BODY void rmsnorm_backward_cols_body(float* dweight, const float* dout, const float* inp,
                                                    const float* rstd, int N, int w, int ld) {
  for (int r = 0; r < N; ++r) {
    const float* x = inp + static_cast<size_t>(r) * ld;
    const float* g = dout + static_cast<size_t>(r) * ld;
    const float rs = rstd[r];
    for (int i = 0; i < w; ++i) dweight[i] += x[i] * rs * g[i];
  }
}
TRIDENT_ISA_CLONES(void, rmsnorm_backward_cols,
                   (float* dweight, const float* dout, const float* inp, const float* rstd, int N, int w, int ld),
                   (dweight, dout, inp, rstd, N, w, ld));

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  parallel_chunks(N, row_grain(C), [&](int64_t r, int64_t rows) {
    TRIDENT_ISA_CALL(rmsnorm_backward_rows,
                     (dinp + r * C, dout + r * C, inp + r * C, weight, rstd + r, static_cast<int>(rows), C));
  });
  parallel_chunks(C, 64, [&](int64_t c0, int64_t w) {
    TRIDENT_ISA_CALL(rmsnorm_backward_cols, (dweight + c0, dout + c0, inp + c0, rstd, N, static_cast<int>(w), C));
  });
}

// ---- rotary position embedding ----

// Rows r0 .. r0 + rows - 1 (positions (r0 + k) % T).
TRIDENT_KERNEL_BODY void rope_rows_body(float* x, const float* cos, const float* sin, int64_t r0, int rows, int T,
                                        int stride, int n_heads, int hd, bool inverse) {
  const int half = hd / 2;
  const float sign = inverse ? -1.0f : 1.0f;  // sin(-angle) = -sin(angle)
  for (int k = 0; k < rows; ++k) {
    const int64_t r = r0 + k;
    const int p = static_cast<int>(r % T);
    const float* c = cos + static_cast<size_t>(p) * half;
    const float* s = sin + static_cast<size_t>(p) * half;
    float* row = x + static_cast<size_t>(r) * stride;
    for (int h = 0; h < n_heads; ++h) {
      float* lo = row + static_cast<size_t>(h) * hd;
      float* hi = lo + half;
      for (int i = 0; i < half; ++i) {
        const float a = lo[i], b = hi[i], si = sign * s[i];
        lo[i] = a * c[i] - b * si;
        hi[i] = b * c[i] + a * si;
      }
    }
  }
}
TRIDENT_ISA_CLONES(void, rope_rows,
                   (float* x, const float* cos, const float* sin, int64_t r0, int rows, int T, int stride,
                    int n_heads, int hd, bool inverse),
                   (x, cos, sin, r0, rows, T, stride, n_heads, hd, inverse));

void rope(float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd, bool inverse) {
  if (N <= 0 || n_heads <= 0 || hd <= 0) return;
  TRIDENT_CHECK(hd % 2 == 0 && T > 0 && stride >= n_heads * hd, InvalidArgument,
                "rope: needs an even head dim, T > 0 and stride >= n_heads * hd (hd {}, T {}, stride {}, n_heads {})",
                hd, T, stride, n_heads);
  parallel_chunks(N, row_grain(static_cast<int64_t>(n_heads) * hd), [&](int64_t r, int64_t rows) {
    TRIDENT_ISA_CALL(rope_rows, (x, cos, sin, r, static_cast<int>(rows), T, stride, n_heads, hd, inverse));
  });
}

// ---- SwiGLU ----

TRIDENT_KERNEL_BODY void swiglu_forward_body(float* out, const float* h, int N, int I) {
  for (int r = 0; r < N; ++r) {
    const float* g = h + static_cast<size_t>(r) * 2 * I;
    const float* u = g + I;
    float* o = out + static_cast<size_t>(r) * I;
    for (int i = 0; i < I; ++i) {
      const float sig = 1.0f / (1.0f + fast_exp(-g[i]));
      o[i] = g[i] * sig * u[i];
    }
  }
}
TRIDENT_ISA_CLONES(void, swiglu_forward, (float* out, const float* h, int N, int I), (out, h, N, I));
void swiglu_forward(float* out, const float* h, int N, int I) {
  parallel_chunks(N, row_grain(2 * static_cast<int64_t>(I)), [&](int64_t r, int64_t rows) {
    TRIDENT_ISA_CALL(swiglu_forward, (out + r * I, h + r * 2 * I, static_cast<int>(rows), I));
  });
}

TRIDENT_KERNEL_BODY void swiglu_backward_body(float* dh, const float* dout, const float* h, int N, int I) {
  for (int r = 0; r < N; ++r) {
    const float* g = h + static_cast<size_t>(r) * 2 * I;
    const float* u = g + I;
    const float* d = dout + static_cast<size_t>(r) * I;
    float* dg = dh + static_cast<size_t>(r) * 2 * I;
    float* du = dg + I;
    for (int i = 0; i < I; ++i) {
      const float gi = g[i], ui = u[i], sig = 1.0f / (1.0f + fast_exp(-gi));
      dg[i] = d[i] * ui * sig * (1.0f + gi * (1.0f - sig));
      du[i] = d[i] * (gi * sig);
    }
  }
}
TRIDENT_ISA_CLONES(void, swiglu_backward, (float* dh, const float* dout, const float* h, int N, int I),
                   (dh, dout, h, N, I));
void swiglu_backward(float* dh, const float* dout, const float* h, int N, int I) {
  parallel_chunks(N, row_grain(2 * static_cast<int64_t>(I)), [&](int64_t r, int64_t rows) {
    TRIDENT_ISA_CALL(swiglu_backward, (dh + r * 2 * I, dout + r * I, h + r * 2 * I, static_cast<int>(rows), I));
  });
}

// ---- grouped-query attention: key/value heads shared by groups of query heads ----

namespace {
void check_kv_heads(const char* op, int nh, int nkv, int hd, int h0, int group, int kv0) {
  TRIDENT_CHECK(nh >= 0 && nkv >= 0 && hd >= 0 && group > 0, InvalidArgument,
                "{}: bad shape (nh {}, nkv {}, hd {}, group {})", op, nh, nkv, hd, group);
  if (nh == 0) return;
  // The kv index (h0 + j) / group - kv0 rises with j: its ends bound it.
  const int first = h0 / group - kv0, last = (h0 + nh - 1) / group - kv0;
  TRIDENT_CHECK(h0 >= 0 && first >= 0 && last < nkv, InvalidArgument,
                "{}: query heads [{}, {}) with group {} read kv heads [{}, {}] of the local [0, {}) (kv0 {})", op, h0,
                h0 + nh, group, first, last, nkv, kv0);
}
}  // namespace

void kv_expand(float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group, int kv0) {
  check_kv_heads("kv_expand", nh, nkv, hd, h0, group, kv0);
  const size_t q = static_cast<size_t>(nh) * hd, kv = static_cast<size_t>(nkv) * hd;
  const size_t ls = q + 2 * kv, ld = 3 * q;
  if (N <= 0 || q == 0) return;
  parallel_chunks(N, row_grain(static_cast<int64_t>(ld)), [&](int64_t r0, int64_t rows) {
    for (int64_t r = r0; r < r0 + rows; ++r) {
      const float* s = src + r * ls;
      float* d = dst + r * ld;
      std::memcpy(d, s, q * sizeof(float));
      for (int j = 0; j < nh; ++j) {
        const size_t m = static_cast<size_t>((h0 + j) / group - kv0);
        std::memcpy(d + q + j * hd, s + q + m * hd, hd * sizeof(float));
        std::memcpy(d + 2 * q + j * hd, s + q + kv + m * hd, hd * sizeof(float));
      }
    }
  });
}

TRIDENT_KERNEL_BODY void accumulate_body(float* acc, const float* x, int n) {
  for (int i = 0; i < n; ++i) acc[i] += x[i];
}
TRIDENT_ISA_CLONES(void, accumulate, (float* acc, const float* x, int n), (acc, x, n));

void kv_reduce(float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group, int kv0) {
  check_kv_heads("kv_reduce", nh, nkv, hd, h0, group, kv0);
  const size_t q = static_cast<size_t>(nh) * hd, kv = static_cast<size_t>(nkv) * hd;
  const size_t ls = q + 2 * kv, ld = 3 * q;
  if (N <= 0 || ls == 0) return;
  parallel_chunks(N, row_grain(static_cast<int64_t>(ld + ls)), [&](int64_t r0, int64_t rows) {
    for (int64_t r = r0; r < r0 + rows; ++r) {
      const float* d = ddst + r * ld;
      float* s = dsrc + r * ls;
      if (q) std::memcpy(s, d, q * sizeof(float));
      std::memset(s + q, 0, 2 * kv * sizeof(float));
      for (int j = 0; j < nh; ++j) {  // ascending j: each kv head's sum in a fixed order
        const size_t m = static_cast<size_t>((h0 + j) / group - kv0);
        TRIDENT_ISA_CALL(accumulate, (s + q + m * hd, d + q + j * hd, hd));
        TRIDENT_ISA_CALL(accumulate, (s + q + kv + m * hd, d + 2 * q + j * hd, hd));
      }
    }
  });
}

}  // namespace trident::kernels::cpu
