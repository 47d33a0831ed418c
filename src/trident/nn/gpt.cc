// nanoGPT's GPT (model.py) with hand-written backward. See models.h for the config and model.h for the
// interface. Activations are kept per layer (or, with activation_checkpointing, only each block's input,
// the block being recomputed in backward into one shared scratch set).
#include <cmath>
#include <cstring>
#include <memory>

#include "trident/core/error.h"
#include "trident/nn/language_model.h"

namespace trident::nn {

class Gpt final : public LanguageModel {
 public:
  explicit Gpt(ModelConfig c) : LanguageModel(std::move(c)) {
    const int64_t C = cfg_.n_embd, V = cfg_.vocab_size, L = cfg_.n_layer;
    wte_ = add_param("transformer.wte.weight", {V, C});
    wpe_ = add_param("transformer.wpe.weight", {cfg_.block_size, C});
    layers_.resize(L);
    for (int l = 0; l < L; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      auto& lp = layers_[l];
      lp.ln1_w = add_param(p + "ln_1.weight", {C});
      if (cfg_.bias) lp.ln1_b = add_param(p + "ln_1.bias", {C});
      lp.attn_w = add_param(p + "attn.c_attn.weight", {3 * C, C});
      if (cfg_.bias) lp.attn_b = add_param(p + "attn.c_attn.bias", {3 * C});
      lp.proj_w = add_param(p + "attn.c_proj.weight", {C, C});
      if (cfg_.bias) lp.proj_b = add_param(p + "attn.c_proj.bias", {C});
      lp.ln2_w = add_param(p + "ln_2.weight", {C});
      if (cfg_.bias) lp.ln2_b = add_param(p + "ln_2.bias", {C});
      lp.fc_w = add_param(p + "mlp.c_fc.weight", {4 * C, C});
      if (cfg_.bias) lp.fc_b = add_param(p + "mlp.c_fc.bias", {4 * C});
      lp.mproj_w = add_param(p + "mlp.c_proj.weight", {C, 4 * C});
      if (cfg_.bias) lp.mproj_b = add_param(p + "mlp.c_proj.bias", {C});
    }
    lnf_w_ = add_param("transformer.ln_f.weight", {C});
    if (cfg_.bias) lnf_b_ = add_param("transformer.ln_f.bias", {C});
    finalize_params();
    // nanoGPT _init_weights: Linear/Embedding N(0, 0.02), biases 0, LayerNorm weight 1 / bias 0, and every
    // c_proj.weight N(0, 0.02/sqrt(2*n_layer)). Drawn in registration order.
    const double proj_std = 0.02 / std::sqrt(2.0 * std::max(1, cfg_.n_layer));
    for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
      const std::string& n = params_[i].name;
      auto ends = [&](const char* s) {
        const size_t k = std::strlen(s);
        return n.size() >= k && n.compare(n.size() - k, k, s) == 0;
      };
      if (ends("ln_1.weight") || ends("ln_2.weight") || ends("ln_f.weight")) init_constant(i, 1.0f);
      else if (ends(".bias")) init_constant(i, 0.0f);
      else if (ends("c_proj.weight")) init_normal(i, proj_std);
      else init_normal(i, 0.02);
    }
    finish_init();
  }

  // Block 0: embeddings (wte, wpe); blocks 1..n_layer: transformer.h.{l}; block n_layer+1: ln_f and the
  // tied lm_head, which reads wte (so wte belongs to the first and the last block).
  std::vector<Block> blocks() const override {
    auto idx = [](std::initializer_list<int> ids) {
      std::vector<size_t> v;
      for (int i : ids)
        if (i >= 0) v.push_back(static_cast<size_t>(i));
      return v;
    };
    std::vector<Block> b;
    b.push_back({"embedding", idx({wte_, wpe_})});
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& p = layers_[l];
      b.push_back({"transformer.h." + std::to_string(l),
                   idx({p.ln1_w, p.ln1_b, p.attn_w, p.attn_b, p.proj_w, p.proj_b, p.ln2_w, p.ln2_b, p.fc_w, p.fc_b,
                        p.mproj_w, p.mproj_b})});
    }
    b.push_back({"head", idx({lnf_w_, lnf_b_, wte_})});
    return b;
  }

 private:
  struct LayerParams {
    int ln1_w = -1, ln1_b = -1, attn_w = -1, attn_b = -1, proj_w = -1, proj_b = -1;
    int ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, mproj_w = -1, mproj_b = -1;
  };
  struct Acts {
    // fch holds gelu'(c_fc output) after the forward (the pre-activation itself is not needed).
    kernels::DeviceArray<float> ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };

  void resize_layers(size_t N) override {
    const size_t C = cfg_.n_embd, L = cfg_.n_layer;
    const size_t nacts = cfg_.activation_checkpointing ? std::min<size_t>(1, L) : L;
    acts_.resize(nacts);
    for (auto& a : acts_) {
      resize_buffer(a.ln1, N * C);
      resize_buffer(a.ln1_mean, N);
      resize_buffer(a.ln1_rstd, N);
      resize_buffer(a.qkv, N * 3 * C);
      resize_buffer(a.atty, N * C);
      resize_buffer(a.lse, N * cfg_.n_head);
      resize_buffer(a.res2, N * C);
      resize_buffer(a.ln2, N * C);
      resize_buffer(a.ln2_mean, N);
      resize_buffer(a.ln2_rstd, N);
      resize_buffer(a.fch, N * 4 * C);
      resize_buffer(a.fch_gelu, N * 4 * C);
    }
    resize_buffer(dqkv_, N * 3 * C);
    resize_buffer(dfch_, N * 4 * C);
    resize_buffer(scratch_out_, N * C);
  }

  // With checkpointing the recomputed output goes to scratch (x_{l+1} is kept).
  void layer_forward(int l, int B, int T, bool recompute) override {
    block_forward(l, xs_[l].data(), acts(l), recompute ? scratch_out_.data() : xs_[l + 1].data(), B, T);
  }
  void layer_backward(int l, int B, int T) override { block_backward(l, dres_.data(), xs_[l].data(), acts(l), B, T); }

  Acts& acts(int l) { return cfg_.activation_checkpointing ? acts_[0] : acts_[l]; }

  void block_forward(int l, const float* x, Acts& a, float* out, int B, int T) {
    const int N = B * T, C = cfg_.n_embd;
    const auto& lp = layers_[l];
    const auto prec = cfg_.precision();
    ops_->layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, P(lp.ln1_w), P(lp.ln1_b), N, C,
                            1e-5f);
    ops_->linear_forward(a.qkv.data(), a.ln1.data(), P(lp.attn_w), P(lp.attn_b), N, C, 3 * C, prec);
    ops_->attention_forward(a.atty.data(), a.lse.data(), a.qkv.data(), B, T, C, cfg_.n_head);
    ops_->linear_forward(a.res2.data(), a.atty.data(), P(lp.proj_w), P(lp.proj_b), N, C, C, prec);
    ops_->add_inplace(a.res2.data(), x, static_cast<size_t>(N) * C);
    ops_->layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), P(lp.ln2_w),
                            P(lp.ln2_b), N, C, 1e-5f);
    ops_->linear_forward(a.fch.data(), a.ln2.data(), P(lp.fc_w), P(lp.fc_b), N, C, 4 * C, prec);
    // fch becomes gelu'(pre-activation): all the backward needs of it.
    ops_->gelu_forward_and_grad(a.fch_gelu.data(), a.fch.data(), a.fch.data(), static_cast<size_t>(N) * 4 * C,
                                cfg_.gelu_kind());
    ops_->linear_forward(out, a.fch_gelu.data(), P(lp.mproj_w), P(lp.mproj_b), N, 4 * C, C, prec);
    ops_->add_inplace(out, a.res2.data(), static_cast<size_t>(N) * C);
  }

  // dres: gradient of the block's output on entry, of its input x on return.
  void block_backward(int l, float* dres, const float* x, Acts& a, int B, int T) {
    const int N = B * T, C = cfg_.n_embd;
    const auto& lp = layers_[l];
    const auto prec = cfg_.precision();
    float* dc = dscratch();
    float* dfch = dfch_.data();
    ops_->linear_backward(dfch, G(lp.mproj_w), G(lp.mproj_b), dres, a.fch_gelu.data(), P(lp.mproj_w), N, 4 * C, C,
                          0.0f, prec);
    fire(lp.mproj_b);
    fire(lp.mproj_w);
    ops_->mul(dfch, dfch, a.fch.data(), static_cast<size_t>(N) * 4 * C);
    ops_->linear_backward(dc, G(lp.fc_w), G(lp.fc_b), dfch, a.ln2.data(), P(lp.fc_w), N, C, 4 * C, 0.0f, prec);
    fire(lp.fc_b);
    fire(lp.fc_w);
    ops_->layernorm_backward(dres, G(lp.ln2_w), G(lp.ln2_b), dc, a.res2.data(), P(lp.ln2_w), a.ln2_mean.data(),
                             a.ln2_rstd.data(), N, C);
    fire(lp.ln2_b);
    fire(lp.ln2_w);
    ops_->linear_backward(dc, G(lp.proj_w), G(lp.proj_b), dres, a.atty.data(), P(lp.proj_w), N, C, C, 0.0f, prec);
    fire(lp.proj_b);
    fire(lp.proj_w);
    ops_->attention_backward(dqkv_.data(), dc, a.qkv.data(), a.atty.data(), a.lse.data(), B, T, C, cfg_.n_head);
    ops_->linear_backward(dc, G(lp.attn_w), G(lp.attn_b), dqkv_.data(), a.ln1.data(), P(lp.attn_w), N, C, 3 * C, 0.0f,
                          prec);
    fire(lp.attn_b);
    fire(lp.attn_w);
    ops_->layernorm_backward(dres, G(lp.ln1_w), G(lp.ln1_b), dc, x, P(lp.ln1_w), a.ln1_mean.data(), a.ln1_rstd.data(),
                             N, C);
    fire(lp.ln1_b);
    fire(lp.ln1_w);
  }

  std::vector<LayerParams> layers_;
  std::vector<Acts> acts_;
  kernels::DeviceArray<float> dqkv_, dfch_, scratch_out_;
};

std::unique_ptr<Model> make_gpt(const ModelConfig& c) { return std::make_unique<Gpt>(c); }

}  // namespace trident::nn
