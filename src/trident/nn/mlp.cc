// Deep MLP language model (kind "mlp"): the workload of the lecture on parallelism strategies, made to
// train on the same token data with the same interface as the GPT. Each position is processed alone:
//   x_0 = wte[token] + wpe[position]
//   x_{l+1} = x_l + gelu(x_l W_l^T + b_l)        for l < n_layer, W_l [n_embd, n_embd]
//   logits = ln_f(x_L) head^T, head = wte (tie_embeddings, default) or lm_head.weight [vocab, n_embd]
// Parameter names: wte.weight, wpe.weight, layers.{l}.weight, layers.{l}.bias, ln_f.weight, ln_f.bias,
// lm_head.weight. Init: N(0, 0.02) for embeddings and the head, N(0, 0.02/sqrt(2*n_layer)) for layers
// (residual branches, as GPT's c_proj), biases 0, LayerNorm weight 1.
// activation_checkpointing keeps only x_l and recomputes the pre-activation in backward.
#include <cmath>
#include <cstring>
#include <memory>

#include "trident/core/error.h"
#include "trident/nn/language_model.h"

namespace trident::nn {

class DeepMlp final : public LanguageModel {
 public:
  explicit DeepMlp(ModelConfig c) : LanguageModel(std::move(c)) {
    const int64_t C = cfg_.n_embd, V = cfg_.vocab_size;
    wte_ = add_param("wte.weight", {V, C});
    wpe_ = add_param("wpe.weight", {cfg_.block_size, C});
    for (int l = 0; l < cfg_.n_layer; ++l) {
      w_.push_back(add_param("layers." + std::to_string(l) + ".weight", {C, C}));
      b_.push_back(cfg_.bias ? add_param("layers." + std::to_string(l) + ".bias", {C}) : -1);
    }
    lnf_w_ = add_param("ln_f.weight", {C});
    if (cfg_.bias) lnf_b_ = add_param("ln_f.bias", {C});
    if (!cfg_.tie_embeddings) head_ = add_param("lm_head.weight", {V, C});
    finalize_params();
    const double layer_std = 0.02 / std::sqrt(2.0 * std::max(1, cfg_.n_layer));
    for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
      if (i == lnf_w_) init_constant(i, 1.0f);
      else if (params_[i].shape.size() == 1) init_constant(i, 0.0f);
      else if (params_[i].name.rfind("layers.", 0) == 0) init_normal(i, layer_std);
      else init_normal(i, 0.02);
    }
    finish_init();
  }

  // Block 0: wte, wpe; blocks 1..n_layer: layers.{l}; block n_layer+1: ln_f and the head (wte when tied).
  std::vector<Block> blocks() const override {
    std::vector<Block> b;
    b.push_back({"embedding", {static_cast<size_t>(wte_), static_cast<size_t>(wpe_)}});
    for (size_t l = 0; l < w_.size(); ++l) {
      Block k{"layers." + std::to_string(l), {static_cast<size_t>(w_[l])}};
      if (b_[l] >= 0) k.params.push_back(static_cast<size_t>(b_[l]));
      b.push_back(std::move(k));
    }
    Block h{"head", {static_cast<size_t>(lnf_w_)}};
    if (lnf_b_ >= 0) h.params.push_back(static_cast<size_t>(lnf_b_));
    h.params.push_back(static_cast<size_t>(head()));
    b.push_back(std::move(h));
    return b;
  }

 private:
  void resize_layers(size_t N) override {
    const size_t C = cfg_.n_embd, L = cfg_.n_layer;
    hs_.resize(cfg_.activation_checkpointing ? std::min<size_t>(L, 1) : L);
    for (auto& h : hs_) resize_buffer(h, N * C);
  }

  float* h(int l) { return cfg_.activation_checkpointing ? hs_[0].data() : hs_[l].data(); }

  // The recompute refreshes only the pre-activation h_l (what the backward reads).
  void layer_forward(int l, int B, int T, bool recompute) override {
    const int N = B * T, C = cfg_.n_embd;
    ops_->linear_forward(h(l), xs_[l].data(), P(w_[l]), P(b_[l]), N, C, C, cfg_.precision());
    if (recompute) return;
    ops_->gelu_forward(xs_[l + 1].data(), h(l), static_cast<size_t>(N) * C, cfg_.gelu_kind());
    ops_->add_inplace(xs_[l + 1].data(), xs_[l].data(), static_cast<size_t>(N) * C);
  }

  void layer_backward(int l, int B, int T) override {
    const int N = B * T, C = cfg_.n_embd;
    float* dh = dscratch();
    ops_->gelu_backward(dh, h(l), dres_.data(), static_cast<size_t>(N) * C, cfg_.gelu_kind());
    // d x_l = d x_{l+1} (residual) + dh W: accumulate into dres.
    ops_->linear_backward(dres_.data(), G(w_[l]), G(b_[l]), dh, xs_[l].data(), P(w_[l]), N, C, C, 1.0f,
                          cfg_.precision());
    fire(b_[l]);
    fire(w_[l]);
  }

  std::vector<int> w_, b_;
  std::vector<kernels::DeviceArray<float>> hs_;
};

std::unique_ptr<Model> make_mlp(const ModelConfig& c) { return std::make_unique<DeepMlp>(c); }

}  // namespace trident::nn
