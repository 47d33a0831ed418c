// What nn's language models (the GPT, the deep MLP) share around their layers (internal to nn/): the
// token + position embedding in front, ln_f, the LM head and the fused cross-entropy behind, the residual
// stream x_0..x_L between them, and the forward/backward skeleton with its block events, activation
// checkpointing and grad-ready hooks. A model registers its parameters (setting the indices below) and
// implements only its layers: layer_forward(l) reads x_l and writes x_{l+1}, layer_backward(l) turns
// dres = d x_{l+1} into d x_l.
//
// Blocks: 0 is the embedding, 1..n_layer the layers, n_layer+1 ln_f and the head. Hooks fire in descending
// parameter index order: the untied head, ln_f, then each layer's own, then wpe and wte (the tied head's
// gradient is final only after the embedding's).
// Ownership, blocking, thread-safety: as FlatModel (one thread at a time; buffers on the model's device).
#pragma once

#include <cstdint>
#include <vector>

#include "trident/core/error.h"
#include "trident/nn/flat_model.h"

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
    const double sum = ops_->cross_entropy_forward_backward(backward ? logits_.data() : nullptr, logits_.data(),
                                                            targets, N, cfg_.vocab_size,
                                                            loss_scale / static_cast<float>(N));
    const float loss = static_cast<float>(sum / N);
    if (backward) backward_pass(inputs, B, T);
    return loss;
  }

  void forward_logits(const int32_t* inputs, int B, int T, float* logits) override {
    check_batch(inputs, B, T);
    forward(on_device(inputs_, inputs, static_cast<size_t>(B) * T), B, T);
    ops_->to_host(logits, logits_.data(), sizeof(float) * static_cast<size_t>(B) * T * cfg_.vocab_size);
  }

 protected:
  using FlatModel::FlatModel;

  // x_l -> x_{l+1} (recompute: the forward again inside backward under activation checkpointing; the
  // layer refreshes what its backward needs and may leave x_{l+1} alone).
  virtual void layer_forward(int l, int B, int T, bool recompute) = 0;
  // dres: d x_{l+1} on entry, d x_l on return; fires the layer's hooks.
  virtual void layer_backward(int l, int B, int T) = 0;
  // (Re)sizes the layers' own activations for B*T positions; called when B*T changes.
  virtual void resize_layers(size_t N) = 0;

  int head() const { return head_ >= 0 ? head_ : wte_; }
  // d ln_f output [N, C]: the head backward's scratch, free for the layers' backward afterwards.
  float* dscratch() { return dlnf_.data(); }

  void forward(const int32_t* tokens, int B, int T) {
    ensure(B, T);
    const int N = B * T, C = cfg_.n_embd, L = cfg_.n_layer;
    block_event(0, BlockEvent::kBeforeForward);
    ops_->embedding_forward(xs_[0].data(), tokens, P(wte_), P(wpe_), B, T, C, cfg_.vocab_size);
    block_event(0, BlockEvent::kAfterForward);
    for (int l = 0; l < L; ++l) {
      block_event(l + 1, BlockEvent::kBeforeForward);
      layer_forward(l, B, T, false);
      block_event(l + 1, BlockEvent::kAfterForward);
    }
    block_event(L + 1, BlockEvent::kBeforeForward);
    ops_->layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), xs_[L].data(), P(lnf_w_), P(lnf_b_), N,
                            C, 1e-5f);
    ops_->linear_forward(logits_.data(), lnf_.data(), P(head()), nullptr, N, C, cfg_.vocab_size, cfg_.precision());
    block_event(L + 1, BlockEvent::kAfterForward);
  }

  // Expects logits_ to hold dloss/dlogits.
  void backward_pass(const int32_t* tokens, int B, int T) {
    const int N = B * T, C = cfg_.n_embd, L = cfg_.n_layer;
    block_event(L + 1, BlockEvent::kBeforeBackward);
    // lm_head: d lnf = dlogits head; d head += dlogits^T lnf.
    ops_->linear_backward(dlnf_.data(), G(head()), nullptr, logits_.data(), lnf_.data(), P(head()), N, C,
                          cfg_.vocab_size, 0.0f, cfg_.precision());
    fire(head_);  // an untied head is final now (-1 when tied: wte fires after the embedding)
    ops_->memset_zero(dres_.data(), sizeof(float) * static_cast<size_t>(N) * C);
    ops_->layernorm_backward(dres_.data(), G(lnf_w_), G(lnf_b_), dlnf_.data(), xs_[L].data(), P(lnf_w_),
                             lnf_mean_.data(), lnf_rstd_.data(), N, C);
    fire(lnf_b_);
    fire(lnf_w_);
    block_event(L + 1, BlockEvent::kAfterBackward);
    for (int l = L - 1; l >= 0; --l) {
      // With checkpointing the layers' scratch set already holds the last layer's activations.
      if (cfg_.activation_checkpointing && l != L - 1) {
        block_event(l + 1, BlockEvent::kBeforeRecompute);
        layer_forward(l, B, T, true);
        block_event(l + 1, BlockEvent::kAfterRecompute);
      }
      block_event(l + 1, BlockEvent::kBeforeBackward);
      layer_backward(l, B, T);
      block_event(l + 1, BlockEvent::kAfterBackward);
    }
    block_event(0, BlockEvent::kBeforeBackward);
    ops_->embedding_backward(G(wte_), G(wpe_), dres_.data(), tokens, B, T, C);
    fire(wpe_);
    fire(wte_);
    block_event(0, BlockEvent::kAfterBackward);
  }

  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  int head_ = -1;  // an untied lm_head.weight; -1 when the head is wte
  std::vector<kernels::DeviceArray<float>> xs_;  // x_0 (embedding) .. x_L (into ln_f)
  kernels::DeviceArray<float> lnf_, lnf_mean_, lnf_rstd_, logits_, dres_, dlnf_;

 private:
  void ensure(int B, int T) {
    const size_t N = static_cast<size_t>(B) * T, C = cfg_.n_embd;
    if (N == cap_n_) return;
    cap_n_ = N;
    resize_layers(N);
    xs_.resize(cfg_.n_layer + 1);
    for (auto& x : xs_) resize_buffer(x, N * C);
    resize_buffer(lnf_, N * C);
    resize_buffer(lnf_mean_, N);
    resize_buffer(lnf_rstd_, N);
    resize_buffer(logits_, N * cfg_.vocab_size);
    resize_buffer(dres_, N * C);
    resize_buffer(dlnf_, N * C);
  }

  size_t cap_n_ = 0;
};

}  // namespace trident::nn
