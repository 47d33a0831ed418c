// A toy model for the pipeline engine's tests, independent of nn/: an embedding, L layers of
// y = tanh(x W + b) of width W, and a linear head with mean cross-entropy; any contiguous layer range can be
// one Stage, and the stage holding all layers is the unsplit reference. Forward rounds every layer output
// to float32 (so activations are identical however the model is split); everything else (sums, gradients)
// is double. Backward is written by hand. Parameter gradients accumulate in double.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "trident/parallel/stage.h"

namespace trident::testing {

struct ToyConfig {
  int vocab = 11;
  int width = 8;
  int layers = 8;
  uint64_t seed = 1234;
};

inline uint64_t toy_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// Deterministic value in [-a, a) for parameter `id`, element i.
inline float toy_init(uint64_t seed, uint64_t id, uint64_t i, float a) {
  uint64_t h = toy_mix(seed ^ toy_mix(id * 1000003ULL + i));
  return static_cast<float>((static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a);
}

class ToyStage : public parallel::Stage {
 public:
  // Layers [l0, l1) of cfg.layers; `first` adds the embedding, `last` the head and loss.
  ToyStage(ToyConfig cfg, int l0, int l1, bool first, bool last)
      : cfg_(cfg), l0_(l0), l1_(l1), first_(first), last_(last) {
    const int W = cfg.width, V = cfg.vocab;
    if (first) add("emb", 0, static_cast<size_t>(V) * W, 1.0f);
    for (int l = l0; l < l1; ++l) {
      add(fmt::format("h{}.w", l), 10 + 2 * l, static_cast<size_t>(W) * W, 1.6f / std::sqrt(float(W)));
      add(fmt::format("h{}.b", l), 11 + 2 * l, W, 0.2f);
    }
    if (last) add("head", 1, static_cast<size_t>(W) * V, 1.5f / std::sqrt(float(W)));
  }

  // Fault injection: throw, _exit or stall (seconds) at the forward of this microbatch.
  int throw_at_mb = -1;
  int exit_at_mb = -1;
  int stall_at_mb = -1;
  double stall_s = 0;

  bool is_first() const override { return first_; }
  bool is_last() const override { return last_; }
  size_t activation_numel(int B, int T) const override { return static_cast<size_t>(B) * T * cfg_.width; }

  double forward(int mb, const int32_t* tokens, const int32_t* targets, const float* input, float* output, int B,
                 int T, float loss_scale, bool keep) override {
    if (mb == throw_at_mb) throw std::runtime_error(fmt::format("toy stage: injected failure at microbatch {}", mb));
    if (mb == exit_at_mb) _exit(3);
    if (mb == stall_at_mb) usleep(static_cast<useconds_t>(stall_s * 1e6));
    if (keep && saved_.count(mb)) throw std::runtime_error(fmt::format("toy stage: microbatch {} saved twice", mb));
    const int W = cfg_.width, V = cfg_.vocab;
    const size_t N = static_cast<size_t>(B) * T;
    Saved s;
    s.N = N;
    s.scale = loss_scale;
    std::vector<float> x(N * W);
    if (first_) {
      s.tokens.assign(tokens, tokens + N);
      const float* e = param("emb");
      for (size_t n = 0; n < N; ++n)
        for (int j = 0; j < W; ++j) x[n * W + j] = e[static_cast<size_t>(tokens[n]) * W + j];
    } else {
      x.assign(input, input + N * W);
    }
    s.acts.push_back(x);
    for (int l = l0_; l < l1_; ++l) {
      const float* w = param(fmt::format("h{}.w", l));
      const float* b = param(fmt::format("h{}.b", l));
      std::vector<float> y(N * W);
      for (size_t n = 0; n < N; ++n)
        for (int k = 0; k < W; ++k) {
          double z = b[k];
          for (int j = 0; j < W; ++j) z += static_cast<double>(x[n * W + j]) * w[j * W + k];
          y[n * W + k] = static_cast<float>(std::tanh(z));
        }
      x = y;
      s.acts.push_back(std::move(y));
    }
    double loss = 0;
    if (last_) {
      const float* h = param("head");
      s.targets.assign(targets, targets + N);
      s.probs.resize(N * V);
      for (size_t n = 0; n < N; ++n) {
        double mx = -1e300;
        std::vector<double> z(V);
        for (int v = 0; v < V; ++v) {
          double a = 0;
          for (int j = 0; j < W; ++j) a += static_cast<double>(x[n * W + j]) * h[j * V + v];
          z[v] = a;
          mx = std::max(mx, a);
        }
        double sum = 0;
        for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
        for (int v = 0; v < V; ++v) s.probs[n * V + v] = std::exp(z[v] - mx) / sum;
        loss -= std::log(s.probs[n * V + targets[n]]);
      }
      loss /= static_cast<double>(N);
    } else {
      for (size_t i = 0; i < N * W; ++i) output[i] = x[i];
    }
    if (keep) {
      held_ += s.bytes();
      peak_ = std::max(peak_, held_);
      saved_[mb] = std::move(s);
    }
    return loss;
  }

  void backward(int mb, const float* doutput, float* dinput) override {
    auto it = saved_.find(mb);
    if (it == saved_.end()) throw std::runtime_error(fmt::format("toy stage: backward of unsaved microbatch {}", mb));
    Saved& s = it->second;
    const int W = cfg_.width, V = cfg_.vocab;
    const size_t N = s.N;
    std::vector<double> da(N * W, 0.0);
    const std::vector<float>& top = s.acts.back();
    if (last_) {
      const float* h = param("head");
      double* dh = grad("head");
      for (size_t n = 0; n < N; ++n)
        for (int v = 0; v < V; ++v) {
          double g = (s.probs[n * V + v] - (v == s.targets[n] ? 1.0 : 0.0)) / static_cast<double>(N) * s.scale;
          for (int j = 0; j < W; ++j) {
            dh[j * V + v] += static_cast<double>(top[n * W + j]) * g;
            da[n * W + j] += g * h[j * V + v];
          }
        }
    } else {
      for (size_t i = 0; i < N * W; ++i) da[i] = doutput[i];
    }
    for (int l = l1_ - 1; l >= l0_; --l) {
      const std::vector<float>& y = s.acts[l - l0_ + 1];
      const std::vector<float>& x = s.acts[l - l0_];
      const float* w = param(fmt::format("h{}.w", l));
      double* dw = grad(fmt::format("h{}.w", l));
      double* db = grad(fmt::format("h{}.b", l));
      std::vector<double> dx(N * W, 0.0);
      for (size_t n = 0; n < N; ++n)
        for (int k = 0; k < W; ++k) {
          double yk = y[n * W + k];
          double dz = da[n * W + k] * (1.0 - yk * yk);
          db[k] += dz;
          for (int j = 0; j < W; ++j) {
            dw[j * W + k] += static_cast<double>(x[n * W + j]) * dz;
            dx[n * W + j] += dz * w[j * W + k];
          }
        }
      da.swap(dx);
    }
    if (first_) {
      double* de = grad("emb");
      for (size_t n = 0; n < N; ++n)
        for (int j = 0; j < W; ++j) de[static_cast<size_t>(s.tokens[n]) * W + j] += da[n * W + j];
    } else {
      for (size_t i = 0; i < N * W; ++i) dinput[i] = static_cast<float>(da[i]);
    }
    held_ -= s.bytes();
    saved_.erase(it);
  }

  size_t activation_bytes() const override { return held_; }
  size_t peak_activation_bytes() const override { return peak_; }
  void reset_peak() override { peak_ = held_; }

  // Bytes saved for one microbatch of B x T.
  size_t saved_bytes_per_microbatch(int B, int T) const {
    const size_t N = static_cast<size_t>(B) * T;
    size_t b = (l1_ - l0_ + 1) * N * cfg_.width * sizeof(float);
    if (first_) b += N * sizeof(int32_t);
    if (last_) b += N * cfg_.vocab * sizeof(double) + N * sizeof(int32_t);
    return b;
  }

  void zero_grad() {
    for (auto& [n, g] : grads_) std::fill(g.begin(), g.end(), 0.0);
  }
  const std::map<std::string, std::vector<double>>& grads() const { return grads_; }
  size_t saved_microbatches() const { return saved_.size(); }

 private:
  struct Saved {
    size_t N = 0;
    float scale = 1;
    std::vector<int32_t> tokens, targets;
    std::vector<std::vector<float>> acts;
    std::vector<double> probs;
    size_t bytes() const {
      size_t b = tokens.size() * sizeof(int32_t) + targets.size() * sizeof(int32_t) + probs.size() * sizeof(double);
      for (const auto& a : acts) b += a.size() * sizeof(float);
      return b;
    }
  };
  void add(const std::string& name, uint64_t id, size_t n, float a) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = toy_init(cfg_.seed, id, i, a);
    params_[name] = std::move(v);
    grads_[name].assign(n, 0.0);
  }
  const float* param(const std::string& n) const { return params_.at(n).data(); }
  double* grad(const std::string& n) { return grads_.at(n).data(); }

  ToyConfig cfg_;
  int l0_, l1_;
  bool first_, last_;
  std::map<std::string, std::vector<float>> params_;
  std::map<std::string, std::vector<double>> grads_;
  std::map<int, Saved> saved_;
  size_t held_ = 0, peak_ = 0;
};

}  // namespace trident::testing
