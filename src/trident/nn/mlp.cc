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
#include "trident/nn/flat_model.h"

namespace trident::nn {

class DeepMlp final : public FlatModel {
 public:
  explicit DeepMlp(ModelConfig c) : FlatModel(std::move(c)) {
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

  float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                         float loss_scale) override {
    check_batch(inputs, B, T);
    TRIDENT_CHECK(targets != nullptr, InvalidArgument, "model: targets is null");
    const size_t n = static_cast<size_t>(B) * T;
    inputs = on_device(inputs_, inputs, n);
    targets = on_device(targets_, targets, n);
    forward(inputs, B, T);
    const int N = B * T;
    const double sum = ops_->cross_entropy_forward_backward(backward ? logits_.data() : nullptr, logits_.data(),
                                                            targets, N, cfg_.vocab_size,
                                                            loss_scale / static_cast<float>(N));
    if (backward) backward_pass(inputs, B, T);
    return static_cast<float>(sum / N);
  }

  void forward_logits(const int32_t* inputs, int B, int T, float* logits) override {
    check_batch(inputs, B, T);
    forward(on_device(inputs_, inputs, static_cast<size_t>(B) * T), B, T);
    ops_->to_host(logits, logits_.data(), sizeof(float) * static_cast<size_t>(B) * T * cfg_.vocab_size);
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
  int head() const { return cfg_.tie_embeddings ? wte_ : head_; }

  void ensure(int B, int T) {
    const size_t N = static_cast<size_t>(B) * T, C = cfg_.n_embd, L = cfg_.n_layer;
    if (N == cap_n_) return;
    cap_n_ = N;
    xs_.resize(L + 1);
    for (auto& x : xs_) resize_buffer(x, N * C);
    hs_.resize(cfg_.activation_checkpointing ? std::min<size_t>(L, 1) : L);
    for (auto& h : hs_) resize_buffer(h, N * C);
    resize_buffer(lnf_, N * C);
    resize_buffer(lnf_mean_, N);
    resize_buffer(lnf_rstd_, N);
    resize_buffer(logits_, N * cfg_.vocab_size);
    resize_buffer(dres_, N * C);
    resize_buffer(dh_, N * C);
  }

  float* h(int l) { return cfg_.activation_checkpointing ? hs_[0].data() : hs_[l].data(); }

  void layer_forward(int l, int N, bool write_output) {
    const int C = cfg_.n_embd;
    ops_->linear_forward(h(l), xs_[l].data(), P(w_[l]), P(b_[l]), N, C, C, cfg_.precision());
    if (!write_output) return;
    ops_->gelu_forward(xs_[l + 1].data(), h(l), static_cast<size_t>(N) * C, cfg_.gelu_kind());
    ops_->add_inplace(xs_[l + 1].data(), xs_[l].data(), static_cast<size_t>(N) * C);
  }

  void forward(const int32_t* inputs, int B, int T) {
    ensure(B, T);
    const int N = B * T, C = cfg_.n_embd, L = cfg_.n_layer;
    block_event(0, BlockEvent::kBeforeForward);
    ops_->embedding_forward(xs_[0].data(), inputs, P(wte_), P(wpe_), B, T, C, cfg_.vocab_size);
    block_event(0, BlockEvent::kAfterForward);
    for (int l = 0; l < L; ++l) {
      block_event(l + 1, BlockEvent::kBeforeForward);
      layer_forward(l, N, true);
      block_event(l + 1, BlockEvent::kAfterForward);
    }
    block_event(L + 1, BlockEvent::kBeforeForward);
    ops_->layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), xs_[L].data(), P(lnf_w_), P(lnf_b_), N,
                            C, 1e-5f);
    ops_->linear_forward(logits_.data(), lnf_.data(), P(head()), nullptr, N, C, cfg_.vocab_size, cfg_.precision());
    block_event(L + 1, BlockEvent::kAfterForward);
  }

  void backward_pass(const int32_t* inputs, int B, int T) {
    const int N = B * T, C = cfg_.n_embd, L = cfg_.n_layer;
    const auto prec = cfg_.precision();
    block_event(L + 1, BlockEvent::kBeforeBackward);
    ops_->linear_backward(dh_.data(), G(head()), nullptr, logits_.data(), lnf_.data(), P(head()), N, C, cfg_.vocab_size,
                          0.0f, prec);
    fire(head_);  // untied head: final now (-1 when tied: no-op)
    ops_->memset_zero(dres_.data(), sizeof(float) * static_cast<size_t>(N) * C);
    ops_->layernorm_backward(dres_.data(), G(lnf_w_), G(lnf_b_), dh_.data(), xs_[L].data(), P(lnf_w_), lnf_mean_.data(),
                             lnf_rstd_.data(), N, C);
    fire(lnf_b_);
    fire(lnf_w_);
    block_event(L + 1, BlockEvent::kAfterBackward);
    for (int l = L - 1; l >= 0; --l) {
      if (cfg_.activation_checkpointing && l != L - 1) {
        block_event(l + 1, BlockEvent::kBeforeRecompute);
        layer_forward(l, N, false);
        block_event(l + 1, BlockEvent::kAfterRecompute);
      }
      block_event(l + 1, BlockEvent::kBeforeBackward);
      ops_->gelu_backward(dh_.data(), h(l), dres_.data(), static_cast<size_t>(N) * C, cfg_.gelu_kind());
      // d x_l = d x_{l+1} (residual) + dh W: accumulate into dres.
      ops_->linear_backward(dres_.data(), G(w_[l]), G(b_[l]), dh_.data(), xs_[l].data(), P(w_[l]), N, C, C, 1.0f, prec);
      fire(b_[l]);
      fire(w_[l]);
      block_event(l + 1, BlockEvent::kAfterBackward);
    }
    block_event(0, BlockEvent::kBeforeBackward);
    ops_->embedding_backward(G(wte_), G(wpe_), dres_.data(), inputs, B, T, C);
    fire(wpe_);
    fire(wte_);
    block_event(0, BlockEvent::kAfterBackward);
  }

  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;
  std::vector<int> w_, b_;
  size_t cap_n_ = 0;
  std::vector<kernels::DeviceArray<float>> xs_, hs_;
  kernels::DeviceArray<float> lnf_, lnf_mean_, lnf_rstd_, logits_, dres_, dh_;
};

std::unique_ptr<Model> make_mlp(const ModelConfig& c) { return std::make_unique<DeepMlp>(c); }

}  // namespace trident::nn
