// Independent float64 reference implementations of trident's layers and models, written plainly from
// the PyTorch definitions (no code shared with src/), plus central finite differences.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace ref {

using Vec = std::vector<double>;

inline Vec random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<float> to_float(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

// x[rows, cols] (row-major) as a GEMM operand is stored: transposed ([cols, rows]) when trans.
inline std::vector<float> stored(const std::vector<float>& x, int rows, int cols, bool trans) {
  std::vector<float> out(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[trans ? c * rows + r : r * cols + c] = x[r * cols + c];
  return out;
}

// Central differences of a scalar function of x, step h.
inline Vec fd_grad(Vec x, const std::function<double(const Vec&)>& f, double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// y[N,OC] = x[N,C] W[OC,C]^T + b
inline Vec linear(const Vec& x, const Vec& w, const Vec* b, int N, int C, int OC) {
  Vec y(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      y[n * OC + o] = s;
    }
  return y;
}

inline Vec gelu(const Vec& x, bool tanh_approx) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    if (tanh_approx)
      y[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    else
      y[i] = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  }
  return y;
}

inline Vec layernorm(const Vec& x, const Vec& w, const Vec* b, int N, int C, double eps = 1e-5) {
  Vec y(x.size());
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    for (int c = 0; c < C; ++c) y[n * C + c] = (x[n * C + c] - m) / std::sqrt(v + eps) * w[c] + (b ? (*b)[c] : 0.0);
  }
  return y;
}

inline Vec softmax(const Vec& x, int N, int C) {
  Vec y(x.size());
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int c = 0; c < C; ++c) mx = std::max(mx, x[n * C + c]);
    for (int c = 0; c < C; ++c) s += std::exp(x[n * C + c] - mx);
    for (int c = 0; c < C; ++c) y[n * C + c] = std::exp(x[n * C + c] - mx) / s;
  }
  return y;
}

// Causal self-attention on qkv[B,T,3C] -> y[B,T,C] (PyTorch: q,k,v = split; heads; softmax(q k^T/sqrt(hd)) v).
inline Vec attention(const Vec& qkv, int B, int T, int C, int NH) {
  const int hd = C / NH;
  Vec y(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        Vec s(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int k = 0; k < hd; ++k)
            d += qkv[(b * T + i) * 3 * C + h * hd + k] * qkv[(b * T + j) * 3 * C + C + h * hd + k];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j) z += std::exp(s[j] - mx);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - mx) / z;
          for (int k = 0; k < hd; ++k) y[(b * T + i) * C + h * hd + k] += p * qkv[(b * T + j) * 3 * C + 2 * C + h * hd + k];
        }
      }
  return y;
}

// The gradient of attention(qkv) with respect to qkv for an output gradient dout[B,T,C], written out
// (softmax's Jacobian per row): O(T^2 hd) where finite differences of attention() cost O(T^3 hd C).
// lse, when given, receives each score row's log-sum-exp [B,NH,T].
inline Vec attention_grad(const Vec& qkv, const Vec& dout, int B, int T, int C, int NH, Vec* lse = nullptr) {
  const int hd = C / NH;
  const double sc = 1.0 / std::sqrt(static_cast<double>(hd));
  Vec g(qkv.size(), 0.0);
  if (lse) lse->assign(static_cast<size_t>(B) * NH * T, 0.0);
  auto at = [&](int b, int t, int part, int h) { return static_cast<size_t>(b * T + t) * 3 * C + part * C + h * hd; };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        Vec p(i + 1), dp(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int k = 0; k < hd; ++k) d += qkv[at(b, i, 0, h) + k] * qkv[at(b, j, 1, h) + k];
          p[j] = d * sc;
          mx = std::max(mx, p[j]);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j) z += std::exp(p[j] - mx);
        if (lse) (*lse)[(static_cast<size_t>(b) * NH + h) * T + i] = mx + std::log(z);
        double D = 0;
        const double* go = dout.data() + static_cast<size_t>(b * T + i) * C + h * hd;
        for (int j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - mx) / z;
          double d = 0;
          for (int k = 0; k < hd; ++k) d += go[k] * qkv[at(b, j, 2, h) + k];
          dp[j] = d;
          D += p[j] * d;
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - D) * sc;
          for (int k = 0; k < hd; ++k) {
            g[at(b, i, 0, h) + k] += ds * qkv[at(b, j, 1, h) + k];
            g[at(b, j, 1, h) + k] += ds * qkv[at(b, i, 0, h) + k];
            g[at(b, j, 2, h) + k] += p[j] * go[k];
          }
        }
      }
  return g;
}

// Mean cross-entropy of logits[N,V] against targets.
inline double cross_entropy(const Vec& logits, const std::vector<int32_t>& targets, int N, int V) {
  double total = 0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[n * V + v]);
    for (int v = 0; v < V; ++v) s += std::exp(logits[n * V + v] - mx);
    total += mx + std::log(s) - logits[n * V + targets[n]];
  }
  return total / N;
}

inline Vec add(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

using Params = std::map<std::string, Vec>;

inline Vec embed(const Params& p, const std::string& wte, const std::string& wpe, const std::vector<int32_t>& idx,
                 int B, int T, int C) {
  Vec x(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        x[(b * T + t) * C + c] = p.at(wte)[idx[b * T + t] * C + c] + p.at(wpe)[t * C + c];
  return x;
}

inline const Vec* opt(const Params& p, const std::string& name) {
  auto it = p.find(name);
  return it == p.end() ? nullptr : &it->second;
}

// nanoGPT's GPT forward: returns logits [B*T, V].
inline Vec gpt_logits(const Params& p, const std::vector<int32_t>& idx, int B, int T, int C, int NH, int L, int V,
                      bool tanh_gelu) {
  const int N = B * T;
  Vec x = embed(p, "transformer.wte.weight", "transformer.wpe.weight", idx, B, T, C);
  for (int l = 0; l < L; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    Vec a = layernorm(x, p.at(h + "ln_1.weight"), opt(p, h + "ln_1.bias"), N, C);
    a = linear(a, p.at(h + "attn.c_attn.weight"), opt(p, h + "attn.c_attn.bias"), N, C, 3 * C);
    a = attention(a, B, T, C, NH);
    a = linear(a, p.at(h + "attn.c_proj.weight"), opt(p, h + "attn.c_proj.bias"), N, C, C);
    x = add(x, a);
    Vec m = layernorm(x, p.at(h + "ln_2.weight"), opt(p, h + "ln_2.bias"), N, C);
    m = linear(m, p.at(h + "mlp.c_fc.weight"), opt(p, h + "mlp.c_fc.bias"), N, C, 4 * C);
    m = gelu(m, tanh_gelu);
    m = linear(m, p.at(h + "mlp.c_proj.weight"), opt(p, h + "mlp.c_proj.bias"), N, 4 * C, C);
    x = add(x, m);
  }
  x = layernorm(x, p.at("transformer.ln_f.weight"), opt(p, "transformer.ln_f.bias"), N, C);
  return linear(x, p.at("transformer.wte.weight"), nullptr, N, C, V);
}

// The deep MLP (its parameters: src/trident/nn/model_spec.h; its layers: nn/layers.h).
inline Vec mlp_logits(const Params& p, const std::vector<int32_t>& idx, int B, int T, int C, int L, int V,
                      bool tied) {
  const int N = B * T;
  Vec x = embed(p, "wte.weight", "wpe.weight", idx, B, T, C);
  for (int l = 0; l < L; ++l) {
    const std::string n = "layers." + std::to_string(l) + ".";
    x = add(x, gelu(linear(x, p.at(n + "weight"), opt(p, n + "bias"), N, C, C), false));
  }
  x = layernorm(x, p.at("ln_f.weight"), opt(p, "ln_f.bias"), N, C);
  return linear(x, p.at(tied ? "wte.weight" : "lm_head.weight"), nullptr, N, C, V);
}

}  // namespace ref
