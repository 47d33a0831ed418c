// What nn's language models (the GPT, the deep MLP) share: the layers of nn/layers.h composed into one
// process's model: the embedding in front, the residual layers x_0..x_L, ln_f, the LM head and the
// cross-entropy behind, and the forward/backward skeleton with its block events, activation checkpointing
// and grad-ready hooks. A model registers its parameters (setting the indices below), builds its layers_
// and initialises; everything else is here.
//
// Blocks: 0 is the embedding, 1..n_layer the layers, n_layer+1 ln_f and the head. Hooks fire in descending
// parameter index order: the untied head, ln_f, then each layer's own, then wpe and wte (the tied head's
// gradient is final only after the embedding's).
// Ownership, blocking, thread-safety: as FlatModel (one thread at a time; buffers on the model's device).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/error.h"
#include "trident/nn/flat_model.h"
#include "trident/nn/layers.h"

namespace trident::nn {

class LanguageModel : public FlatModel {
 public:
  float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                         float loss_scale) override {
    check_batch(inputs, B, T);
    TRIDENT_CHECK(targets != nullptr, InvalidArgument, "model: targets is null");
    const size_t n = static_cast<size_t>(B) * T;
    inputs = on_device(inputs_, inputs, n);
    targets = on_device(targets_, targets, n);
    forward(inputs, B, T);
    const int N = B * T;
    const double sum =
        lm_head().loss(env(), backward ? logits_.data() : nullptr, logits_.data(), targets, N, loss_scale / static_cast<float>(N));
    const float loss = static_cast<float>(sum / N);
    if (backward) backward_pass(inputs, B, T);
    return loss;
  }

  void forward_logits(const int32_t* inputs, int B, int T, float* logits) override {
    check_batch(inputs, B, T);
    forward(on_device(inputs_, inputs, static_cast<size_t>(B) * T), B, T);
    lm_head().gather_logits(env(), logits, logits_.data(), B * T);
  }

  // Block 0: the embedding (wte, wpe); blocks 1..n_layer: the layers; block n_layer+1: ln_f and the head
  // (wte when tied, so wte belongs to the first and the last block).
  std::vector<Block> blocks() const override {
    auto ids = [](std::initializer_list<int> v) {
      std::vector<size_t> out;
      for (int i : v)
        if (i >= 0) out.push_back(static_cast<size_t>(i));
      return out;
    };
    std::vector<Block> b;
    b.push_back({"embedding", ids({wte_, wpe_})});
    for (size_t l = 0; l < layers_.size(); ++l) b.push_back({layer_prefix_ + std::to_string(l), layers_[l]->params()});
    b.push_back({"head", ids({lnf_w_, lnf_b_, head()})});
    return b;
  }

 protected:
  using FlatModel::FlatModel;

  int head() const { return head_ >= 0 ? head_ : wte_; }

  LayerEnv env() {
    LayerEnv e{*ops_, *this};
    e.workspace = &workspace_;
    e.precision = cfg_.precision();
    e.gelu = cfg_.gelu_kind();
    return e;
  }
  Embedding embedding() const {
    return Embedding{wte_, wpe_, cfg_.vocab_size, 0, cfg_.vocab_size};
  }
  LmHead lm_head() const {
    // An untied head fires when its backward is done; the tied one is wte, final after the embedding's.
    return LmHead{LayerNorm{lnf_w_, lnf_b_}, head(), head_ >= 0, cfg_.vocab_size, 0, cfg_.vocab_size};
  }

  void forward(const int32_t* tokens, int B, int T) {
    ensure(B, T);
    const int N = B * T, C = cfg_.n_embd, L = cfg_.n_layer;
    const LayerEnv e = env();
    block_event(0, BlockEvent::kBeforeForward);
    embedding().forward(e, xs_[0].data(), tokens, B, T, C);
    block_event(0, BlockEvent::kAfterForward);
    for (int l = 0; l < L; ++l) {
      block_event(l + 1, BlockEvent::kBeforeForward);
      layers_[l]->forward(e, xs_[l].data(), acts(l), xs_[l + 1].data(), B, T, false);
      block_event(l + 1, BlockEvent::kAfterForward);
    }
    block_event(L + 1, BlockEvent::kBeforeForward);
    lm_head().forward(e, logits_.data(), lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), xs_[L].data(), N, C);
    block_event(L + 1, BlockEvent::kAfterForward);
  }

  // Expects logits_ to hold dloss/dlogits.
  void backward_pass(const int32_t* tokens, int B, int T) {
    const int N = B * T, C = cfg_.n_embd, L = cfg_.n_layer;
    const LayerEnv e = env();
    block_event(L + 1, BlockEvent::kBeforeBackward);
    lm_head().backward(e, dres_.data(), dlnf_.data(), logits_.data(), lnf_.data(), xs_[L].data(), lnf_mean_.data(),
                       lnf_rstd_.data(), N, C);
    block_event(L + 1, BlockEvent::kAfterBackward);
    for (int l = L - 1; l >= 0; --l) {
      // With checkpointing the shared activation set already holds the last layer's; the recomputed
      // output goes to scratch (x_{l+1} is kept).
      if (cfg_.activation_checkpointing && l != L - 1) {
        block_event(l + 1, BlockEvent::kBeforeRecompute);
        layers_[l]->forward(e, xs_[l].data(), acts(l), scratch_out_.data(), B, T, true);
        block_event(l + 1, BlockEvent::kAfterRecompute);
      }
      block_event(l + 1, BlockEvent::kBeforeBackward);
      layers_[l]->backward(e, dres_.data(), xs_[l].data(), acts(l), B, T);
      block_event(l + 1, BlockEvent::kAfterBackward);
    }
    block_event(0, BlockEvent::kBeforeBackward);
    embedding().backward(e, dres_.data(), tokens, B, T, C);
    block_event(0, BlockEvent::kAfterBackward);
  }

  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  int head_ = -1;  // an untied lm_head.weight; -1 when the head is wte
  std::vector<std::unique_ptr<Layer>> layers_;  // n_layer residual layers, built by the model
  std::string layer_prefix_;                    // block names: prefix + layer index

 private:
  LayerActs& acts(int l) { return cfg_.activation_checkpointing ? acts_[0] : acts_[l]; }

  void ensure(int B, int T) {
    const size_t N = static_cast<size_t>(B) * T, C = cfg_.n_embd;
    if (N == cap_n_) return;
    cap_n_ = N;
    const LayerEnv e = env();
    const size_t L = cfg_.n_layer;
    acts_.resize(cfg_.activation_checkpointing ? std::min<size_t>(1, L) : L);
    for (size_t l = 0; l < acts_.size(); ++l) layers_[l]->alloc(e, acts_[l], N);
    xs_.resize(L + 1);
    for (auto& x : xs_) resize_buffer(x, N * C);
    resize_buffer(scratch_out_, cfg_.activation_checkpointing ? N * C : 0);
    resize_buffer(lnf_, N * C);
    resize_buffer(lnf_mean_, N);
    resize_buffer(lnf_rstd_, N);
    resize_buffer(logits_, N * cfg_.vocab_size);
    resize_buffer(dres_, N * C);
    resize_buffer(dlnf_, N * C);
  }

  std::vector<kernels::DeviceArray<float>> xs_;  // x_0 (embedding) .. x_L (into ln_f)
  kernels::DeviceArray<float> lnf_, lnf_mean_, lnf_rstd_, logits_, dres_, dlnf_, scratch_out_;
  std::vector<LayerActs> acts_;  // per layer (one shared set under activation checkpointing)
  LayerActs workspace_;          // the layers' backward scratch
  size_t cap_n_ = 0;
};

}  // namespace trident::nn
