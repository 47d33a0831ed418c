// Causal multi-head self-attention, forward and backward, one (batch, head) at a time.
// Forward keeps only the output and the log-sum-exp of each score row; backward recomputes the
// probabilities from q, k and lse (as FlashAttention does), so memory is O(B*T*C), not O(B*NH*T*T).
#include <cmath>
#include <cstring>
#include <vector>

#include "trident/core/error.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/simd.h"

namespace trident::kernels::cpu {

using detail::fast_exp;

namespace {
void check_shape(int C, int NH) {
  TRIDENT_CHECK(NH > 0 && C % NH == 0, InvalidArgument,
                "attention: n_embd {} must be divisible by n_head {}", C, NH);
}
}  // namespace

TRIDENT_CLONES
static void attn_fwd_head(float* out, float* lse, const float* qkv, int T, int C, int hd, float scale,
                          float* scores) {
  const size_t C3 = 3 * static_cast<size_t>(C);
  for (int i = 0; i < T; ++i) {
    const float* q = qkv + i * C3;
    float mx = -INFINITY;
    for (int j = 0; j <= i; ++j) {
      const float* k = qkv + j * C3 + C;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int d = 0; d < hd; ++d) s += q[d] * k[d];
      s *= scale;
      scores[j] = s;
      mx = s > mx ? s : mx;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= i; ++j) {
      float e = fast_exp(scores[j] - mx);
      scores[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
    float* o = out + static_cast<size_t>(i) * C;
    for (int d = 0; d < hd; ++d) o[d] = 0.0f;
    for (int j = 0; j <= i; ++j) {
      const float* v = qkv + j * C3 + 2 * C;
      const float p = scores[j] * inv;
#pragma omp simd
      for (int d = 0; d < hd; ++d) o[d] += p * v[d];
    }
    lse[i] = mx + std::log(sum);
  }
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  check_shape(C, NH);
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> scores(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      attn_fwd_head(out + static_cast<size_t>(b) * T * C + h * hd, lse + (static_cast<size_t>(b) * NH + h) * T,
                    qkv + static_cast<size_t>(b) * T * 3 * C + h * hd, T, C, hd, scale, scores.data());
}

TRIDENT_CLONES
static void attn_bwd_head(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                          int T, int C, int hd, float scale) {
  const size_t C3 = 3 * static_cast<size_t>(C);
  for (int i = 0; i < T; ++i) {
    const float* q = qkv + i * C3;
    const float* go = dout + static_cast<size_t>(i) * C;
    const float* o = out + static_cast<size_t>(i) * C;
    float* dq = dqkv + i * C3;
    float D = 0.0f;
#pragma omp simd reduction(+ : D)
    for (int d = 0; d < hd; ++d) D += go[d] * o[d];
    const float l = lse[i];
    for (int j = 0; j <= i; ++j) {
      const float* k = qkv + j * C3 + C;
      const float* v = qkv + j * C3 + 2 * C;
      float* dk = dqkv + j * C3 + C;
      float* dv = dqkv + j * C3 + 2 * C;
      float s = 0.0f, dp = 0.0f;
#pragma omp simd reduction(+ : s, dp)
      for (int d = 0; d < hd; ++d) {
        s += q[d] * k[d];
        dp += go[d] * v[d];
      }
      const float p = fast_exp(s * scale - l);
      const float ds = p * (dp - D) * scale;
#pragma omp simd
      for (int d = 0; d < hd; ++d) {
        dv[d] += p * go[d];
        dq[d] += ds * k[d];
        dk[d] += ds * q[d];
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH) {
  check_shape(C, NH);
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::memset(dqkv, 0, sizeof(float) * static_cast<size_t>(B) * T * 3 * C);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const size_t base3 = static_cast<size_t>(b) * T * 3 * C + h * hd;
      const size_t base = static_cast<size_t>(b) * T * C + h * hd;
      attn_bwd_head(dqkv + base3, dout + base, qkv + base3, out + base, lse + (static_cast<size_t>(b) * NH + h) * T,
                    T, C, hd, scale);
    }
}

}  // namespace trident::kernels::cpu
