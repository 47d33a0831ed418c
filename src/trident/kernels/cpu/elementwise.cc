// Elementwise and row-wise kernels: GELU, adds, LayerNorm, softmax, embeddings, cross-entropy, AdamW.
// Parallel over chunks fixed by the sizes (kGrain elements, or rows of about that many): every thread
// count runs the same chunks. Sums across rows (LayerNorm's weight gradients, embedding gradients, bias
// sums) are split by columns instead, each sum running over the rows in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "trident/core/error.h"
#include "trident/kernels/aligned.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/simd.h"
#include "trident/kernels/cpu/thread_pool.h"

namespace trident::kernels::cpu {

using detail::fast_erf;
using detail::fast_exp;
using detail::fast_tanh;

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr int64_t kGrain = 16384;  // elements per task (64 KiB of float32), a multiple of any vector width
int64_t row_grain(int C) { return std::max<int64_t>(1, kGrain / std::max(C, 1)); }
}  // namespace

TRIDENT_KERNEL_BODY void gelu_exact_fwd_body(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + fast_erf(x * kInvSqrt2));
  }
}
TRIDENT_ISA_CLONES(void, gelu_exact_fwd, (float* out, const float* inp, size_t n), (out, inp, n));
static void gelu_exact_fwd(float* out, const float* inp, size_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t c) { TRIDENT_ISA_CALL(gelu_exact_fwd, (out + b, inp + b, c)); });
}
TRIDENT_KERNEL_BODY void gelu_tanh_fwd_body(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + fast_tanh(u));
  }
}
TRIDENT_ISA_CLONES(void, gelu_tanh_fwd, (float* out, const float* inp, size_t n), (out, inp, n));
static void gelu_tanh_fwd(float* out, const float* inp, size_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t c) { TRIDENT_ISA_CALL(gelu_tanh_fwd, (out + b, inp + b, c)); });
}
TRIDENT_KERNEL_BODY void gelu_exact_bwd_body(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    // One exp serves both: erf(x/sqrt2) needs exp(-x^2/2), as does the pdf.
    const float e = fast_exp(-0.5f * x * x);
    float cdf = 0.5f * (1.0f + detail::erf_with_exp(x * kInvSqrt2, e));
    float pdf = kInvSqrt2Pi * e;
    dinp[i] = dout[i] * (cdf + x * pdf);
  }
}
TRIDENT_ISA_CLONES(void, gelu_exact_bwd, (float* dinp, const float* inp, const float* dout, size_t n),
                   (dinp, inp, dout, n));
static void gelu_exact_bwd(float* dinp, const float* inp, const float* dout, size_t n) {
  parallel_chunks(n, kGrain,
                  [&](int64_t b, int64_t c) { TRIDENT_ISA_CALL(gelu_exact_bwd, (dinp + b, inp + b, dout + b, c)); });
}
TRIDENT_KERNEL_BODY void gelu_tanh_bwd_body(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    float th = fast_tanh(u);
    float sech2 = 1.0f - th * th;
    float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
  }
}
TRIDENT_ISA_CLONES(void, gelu_tanh_bwd, (float* dinp, const float* inp, const float* dout, size_t n),
                   (dinp, inp, dout, n));
static void gelu_tanh_bwd(float* dinp, const float* inp, const float* dout, size_t n) {
  parallel_chunks(n, kGrain,
                  [&](int64_t b, int64_t c) { TRIDENT_ISA_CALL(gelu_tanh_bwd, (dinp + b, inp + b, dout + b, c)); });
}

TRIDENT_KERNEL_BODY void gelu_exact_fwd_grad_body(float* out, float* grad, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float e = fast_exp(-0.5f * x * x);
    const float cdf = 0.5f * (1.0f + detail::erf_with_exp(x * kInvSqrt2, e));
    out[i] = x * cdf;
    grad[i] = cdf + x * (kInvSqrt2Pi * e);
  }
}
TRIDENT_ISA_CLONES(void, gelu_exact_fwd_grad, (float* out, float* grad, const float* inp, size_t n),
                   (out, grad, inp, n));
static void gelu_exact_fwd_grad(float* out, float* grad, const float* inp, size_t n) {
  parallel_chunks(n, kGrain,
                  [&](int64_t b, int64_t c) { TRIDENT_ISA_CALL(gelu_exact_fwd_grad, (out + b, grad + b, inp + b, c)); });
}
TRIDENT_KERNEL_BODY void gelu_tanh_fwd_grad_body(float* out, float* grad, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    const float th = fast_tanh(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
    out[i] = 0.5f * x * (1.0f + th);
    grad[i] = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
  }
}
TRIDENT_ISA_CLONES(void, gelu_tanh_fwd_grad, (float* out, float* grad, const float* inp, size_t n),
                   (out, grad, inp, n));
static void gelu_tanh_fwd_grad(float* out, float* grad, const float* inp, size_t n) {
  parallel_chunks(n, kGrain,
                  [&](int64_t b, int64_t c) { TRIDENT_ISA_CALL(gelu_tanh_fwd_grad, (out + b, grad + b, inp + b, c)); });
}

void gelu_forward_and_grad(float* out, float* grad, const float* inp, size_t n, GeluKind kind) {
  if (kind == GeluKind::kExact) gelu_exact_fwd_grad(out, grad, inp, n);
  else gelu_tanh_fwd_grad(out, grad, inp, n);
}

TRIDENT_KERNEL_BODY void mul_body(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}
TRIDENT_ISA_CLONES(void, mul, (float* out, const float* a, const float* b, size_t n), (out, a, b, n));
void mul(float* out, const float* a, const float* b, size_t n) {
  parallel_chunks(n, kGrain, [&](int64_t o, int64_t c) { TRIDENT_ISA_CALL(mul, (out + o, a + o, b + o, c)); });
}

void gelu_forward(float* out, const float* inp, size_t n, GeluKind kind) {
  if (kind == GeluKind::kExact) gelu_exact_fwd(out, inp, n);
  else gelu_tanh_fwd(out, inp, n);
}
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, GeluKind kind) {
  if (kind == GeluKind::kExact) gelu_exact_bwd(dinp, inp, dout, n);
  else gelu_tanh_bwd(dinp, inp, dout, n);
}

TRIDENT_KERNEL_BODY void add_body(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
TRIDENT_ISA_CLONES(void, add, (float* out, const float* a, const float* b, size_t n), (out, a, b, n));
void add(float* out, const float* a, const float* b, size_t n) {
  parallel_chunks(n, kGrain, [&](int64_t o, int64_t c) { TRIDENT_ISA_CALL(add, (out + o, a + o, b + o, c)); });
}
TRIDENT_KERNEL_BODY void add_inplace_body(float* acc, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += x[i];
}
TRIDENT_ISA_CLONES(void, add_inplace, (float* acc, const float* x, size_t n), (acc, x, n));
void add_inplace(float* acc, const float* x, size_t n) {
  parallel_chunks(n, kGrain, [&](int64_t o, int64_t c) { TRIDENT_ISA_CALL(add_inplace, (acc + o, x + o, c)); });
}

TRIDENT_KERNEL_BODY void layernorm_forward_body(float* out, float* mean, float* rstd, const float* inp,
                                                const float* weight, const float* bias, int N, int C, float eps) {
  for (int r = 0; r < N; ++r) {
    const float* x = inp + static_cast<size_t>(r) * C;
    float* o = out + static_cast<size_t>(r) * C;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; ++i) s += x[i];
    float m = s / C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int i = 0; i < C; ++i) {
      float d = x[i] - m;
      v += d * d;
    }
    float rs = 1.0f / std::sqrt(v / C + eps);
    if (bias) {
      for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * rs * weight[i] + bias[i];
    } else {
      for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * rs * weight[i];
    }
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
  }
}
TRIDENT_ISA_CLONES(void, layernorm_forward,
                   (float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                    int N, int C, float eps),
                   (out, mean, rstd, inp, weight, bias, N, C, eps));
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps) {
  parallel_chunks(N, row_grain(C), [&](int64_t r, int64_t rows) {
    TRIDENT_ISA_CALL(layernorm_forward, (out + r * C, mean ? mean + r : nullptr, rstd ? rstd + r : nullptr,
                                         inp + r * C, weight, bias, static_cast<int>(rows), C, eps));
  });
}

// One chunk of rows [0, N) (rows of x, dout and dinp at stride C): dinp += d inp, and this chunk's partial
// sums of the parameter gradients, pw[c] = sum over its rows in order of norm * dout, pb[c] = of dout (pw
// and pb overwritten). One pass over x and dout: the parameter sums used to be a second pass over both.
TRIDENT_KERNEL_BODY void layernorm_backward_rows_body(float* dinp, float* __restrict pw, float* __restrict pb,
                                                      const float* dout, const float* inp, const float* weight,
                                                      const float* mean, const float* rstd, int N, int C) {
  for (int i = 0; i < C; ++i) pw[i] = 0.0f, pb[i] = 0.0f;
  for (int r = 0; r < N; ++r) {
    const float* x = inp + static_cast<size_t>(r) * C;
    const float* g = dout + static_cast<size_t>(r) * C;
    float* dx = dinp + static_cast<size_t>(r) * C;
    const float m = mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
    for (int i = 0; i < C; ++i) {
      float norm = (x[i] - m) * rs;
      float dn = weight[i] * g[i];
      s1 += dn;
      s2 += dn * norm;
    }
    s1 /= C;
    s2 /= C;
#pragma omp simd
    for (int i = 0; i < C; ++i) {
      float norm = (x[i] - m) * rs;
      float dn = weight[i] * g[i];
      dx[i] += (dn - s1 - norm * s2) * rs;
      pw[i] += norm * g[i];
      pb[i] += g[i];
    }
  }
}
TRIDENT_ISA_CLONES(void, layernorm_backward_rows,
                   (float* dinp, float* pw, float* pb, const float* dout, const float* inp, const float* weight,
                    const float* mean, const float* rstd, int N, int C),
                   (dinp, pw, pb, dout, inp, weight, mean, rstd, N, C));

// sums[0..w) += parts[k * ld + 0..w) for k = 0..n-1 in order.
TRIDENT_KERNEL_BODY void add_partial_sums_body(float* sums, const float* parts, int n, int w, int ld) {
  for (int k = 0; k < n; ++k) {
    const float* p = parts + static_cast<size_t>(k) * ld;
    for (int i = 0; i < w; ++i) sums[i] += p[i];
  }
}
TRIDENT_ISA_CLONES(void, add_partial_sums, (float* sums, const float* parts, int n, int w, int ld),
                   (sums, parts, n, w, ld));

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  // Chunks of rows that depend on N alone (at most 64; never on the threads or the task-size test knob):
  // the parameter gradients are the chunks' partial sums added in chunk order, the same bits on any
  // thread count.
  const int rows = std::max(32, (N + 63) / 64), chunks = (N + rows - 1) / rows;
  thread_local AlignedFloats parts;
  const size_t need = 2 * static_cast<size_t>(chunks) * C;
  if (parts.size() < need) parts.resize(need);
  float* pw = parts.data();
  float* pb = pw + static_cast<size_t>(chunks) * C;
  parallel_for(chunks, [&](int64_t k) {
    const int64_t r = k * rows;
    TRIDENT_ISA_CALL(layernorm_backward_rows,
                     (dinp + r * C, pw + k * C, pb + k * C, dout + r * C, inp + r * C, weight, mean + r, rstd + r,
                      static_cast<int>(std::min<int64_t>(rows, N - r)), C));
  });
  parallel_chunks(C, 256, [&](int64_t c0, int64_t w) {
    TRIDENT_ISA_CALL(add_partial_sums, (dweight + c0, pw + c0, chunks, static_cast<int>(w), C));
    if (dbias) TRIDENT_ISA_CALL(add_partial_sums, (dbias + c0, pb + c0, chunks, static_cast<int>(w), C));
  });
}

TRIDENT_KERNEL_BODY void softmax_forward_body(float* out, const float* inp, int N, int C) {
  for (int r = 0; r < N; ++r) {
    const float* x = inp + static_cast<size_t>(r) * C;
    float* o = out + static_cast<size_t>(r) * C;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < C; ++i) mx = x[i] > mx ? x[i] : mx;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; ++i) {
      o[i] = fast_exp(x[i] - mx);
      s += o[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < C; ++i) o[i] *= inv;
  }
}
TRIDENT_ISA_CLONES(void, softmax_forward, (float* out, const float* inp, int N, int C), (out, inp, N, C));
void softmax_forward(float* out, const float* inp, int N, int C) {
  parallel_chunks(N, row_grain(C), [&](int64_t r, int64_t rows) {
    TRIDENT_ISA_CALL(softmax_forward, (out + r * C, inp + r * C, static_cast<int>(rows), C));
  });
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int32_t tok = tokens[b * T + t];
      TRIDENT_CHECK(tok >= 0 && tok < V, InvalidArgument,
                    "embedding: token {} at (batch {}, position {}) is outside the vocabulary [0, {}); check the "
                    "tokenizer and vocab_size",
                    tok, b, t, V);
    }
  parallel_chunks(static_cast<int64_t>(B) * T, row_grain(C), [&](int64_t r0, int64_t rows) {
    for (int64_t r = r0; r < r0 + rows; ++r) {
      const int t = static_cast<int>(r % T);
      float* o = out + r * C;
      const float* e = wte + static_cast<size_t>(tokens[r]) * C;
      if (wpe) {
        TRIDENT_ISA_CALL(add, (o, e, wpe + static_cast<size_t>(t) * C, C));
      } else {
        for (int i = 0; i < C; ++i) o[i] = e[i];
      }
    }
  });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  // Columns split: each gradient element still sums its rows in (batch, position) order.
  parallel_chunks(C, 64, [&](int64_t c0, int64_t w) {
    const int n = static_cast<int>(w);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        const float* g = dout + (static_cast<size_t>(b) * T + t) * C + c0;
        if (dwte) TRIDENT_ISA_CALL(add_inplace, (dwte + static_cast<size_t>(tokens[b * T + t]) * C + c0, g, n));
        if (dwpe) TRIDENT_ISA_CALL(add_inplace, (dwpe + static_cast<size_t>(t) * C + c0, g, n));
      }
  });
}

// loss[r] = lse_r - x[r][y_r] for rows [0, N); dlogits as documented in ops.h (nullable).
TRIDENT_KERNEL_BODY void ce_rows_body(float* loss, float* dlogits, const float* logits, const int32_t* targets, int N,
                                      int V, float dscale) {
  for (int r = 0; r < N; ++r) {
    const float* x = logits + static_cast<size_t>(r) * V;
    // Vectorized max (a scalar max chain ran at about 3 cycles per element), then one exponential per
    // element: written into the gradient's row as it is summed, and scaled in place afterwards while the
    // row is still in L2 (the same products as computing each exponential twice).
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < V; ++i) mx = x[i] > mx ? x[i] : mx;
    float s = 0.0f;
    const int y = targets[r];
    const float xy = x[y];  // before the gradient's row is written: it may be the logits' row (in place)
    float* d = dlogits ? dlogits + static_cast<size_t>(r) * V : nullptr;
    if (d) {
#pragma omp simd reduction(+ : s)
      for (int i = 0; i < V; ++i) {
        const float e = fast_exp(x[i] - mx);
        d[i] = e;
        s += e;
      }
    } else {
#pragma omp simd reduction(+ : s)
      for (int i = 0; i < V; ++i) s += fast_exp(x[i] - mx);
    }
    const float lse = mx + std::log(s);
    loss[r] = lse - xy;
    if (d) {
      const float inv = dscale / s;
#pragma omp simd
      for (int i = 0; i < V; ++i) d[i] *= inv;
      d[y] -= dscale;
    }
  }
}
TRIDENT_ISA_CLONES(void, ce_rows,
                   (float* loss, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                    float dscale),
                   (loss, dlogits, logits, targets, N, V, dscale));

double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                                      float dscale) {
  for (int r = 0; r < N; ++r)
    TRIDENT_CHECK(targets[r] >= 0 && targets[r] < V, InvalidArgument,
                  "cross_entropy: target {} at row {} is outside the vocabulary [0, {})", targets[r], r, V);
  thread_local std::vector<float> loss;
  loss.resize(static_cast<size_t>(N));
  float* l = loss.data();
  parallel_chunks(N, row_grain(V), [&](int64_t r, int64_t rows) {
    TRIDENT_ISA_CALL(ce_rows, (l + r, dlogits ? dlogits + r * V : nullptr, logits + r * V, targets + r,
                               static_cast<int>(rows), V, dscale));
  });
  // The sum over rows in row order, whatever the threads.
  double total = 0.0;
  for (int r = 0; r < N; ++r) total += static_cast<double>(l[r]);
  return total;
}

TRIDENT_KERNEL_BODY void adamw_loop_body(float* __restrict param, const float* __restrict grad, float* __restrict m,
                                         float* __restrict v, size_t n, float lr, float beta1, float beta2, float eps,
                                         float decay, float bc1, float bc2_sqrt_inv) {
  const float step_size = lr / bc1;
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = param[i] * decay;
    float denom = std::sqrt(vi) * bc2_sqrt_inv + eps;
    param[i] = p - step_size * mi / denom;
  }
}
TRIDENT_ISA_CLONES(void, adamw_loop,
                   (float* __restrict param, const float* __restrict grad, float* __restrict m, float* __restrict v,
                    size_t n, float lr, float beta1, float beta2, float eps, float decay, float bc1,
                    float bc2_sqrt_inv),
                   (param, grad, m, v, n, lr, beta1, beta2, eps, decay, bc1, bc2_sqrt_inv));
static void adamw_loop(float* __restrict param, const float* __restrict grad, float* __restrict m, float* __restrict v,
                       size_t n, float lr, float beta1, float beta2, float eps, float decay, float bc1,
                       float bc2_sqrt_inv) {
  return TRIDENT_ISA_CALL(adamw_loop, (param, grad, m, v, n, lr, beta1, beta2, eps, decay, bc1, bc2_sqrt_inv));
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t) {
  // PyTorch's single-tensor AdamW: p *= 1 - lr*wd; denom = sqrt(v)/sqrt(1-b2^t) + eps; p -= lr/(1-b1^t) * m/denom.
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), static_cast<double>(t)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), static_cast<double>(t)));
  const float decay = 1.0f - lr * weight_decay, bc2_sqrt_inv = 1.0f / std::sqrt(bc2);
  parallel_chunks(n, kGrain, [&](int64_t o, int64_t c) {
    adamw_loop(param + o, grad + o, m + o, v + o, c, lr, beta1, beta2, eps, decay, bc1, bc2_sqrt_inv);
  });
}

TRIDENT_KERNEL_BODY double sum_squares_body(const float* x, size_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}
TRIDENT_ISA_CLONES(double, sum_squares, (const float* x, size_t n), (x, n));
double sum_squares(const float* x, size_t n) { return TRIDENT_ISA_CALL(sum_squares, (x, n)); }

TRIDENT_KERNEL_BODY void scale_inplace_body(float* x, float a, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= a;
}
TRIDENT_ISA_CLONES(void, scale_inplace, (float* x, float a, size_t n), (x, a, n));
void scale_inplace(float* x, float a, size_t n) {
  parallel_chunks(n, kGrain, [&](int64_t o, int64_t c) { TRIDENT_ISA_CALL(scale_inplace, (x + o, a, c)); });
}

}  // namespace trident::kernels::cpu
