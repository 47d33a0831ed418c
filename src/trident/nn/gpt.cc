// nanoGPT's GPT (model.py): its parameters in nanoGPT's order and initialisation, over the layers of
// nn/layers.h (GptBlock). See models.h for the config and model.h for the interface. Activations are kept
// per layer (or, with activation_checkpointing, only each block's input, the block being recomputed in
// backward into one shared scratch set).
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
    layer_prefix_ = "transformer.h.";
    for (int l = 0; l < L; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      const bool bias = cfg_.bias;
      auto opt = [&](const std::string& name, std::vector<int64_t> shape) {
        return bias ? add_param(p + name, std::move(shape)) : -1;
      };
      GptBlock::Params bp;
      bp.ln1.w = add_param(p + "ln_1.weight", {C});
      bp.ln1.b = opt("ln_1.bias", {C});
      bp.attn.w = add_param(p + "attn.c_attn.weight", {3 * C, C});
      bp.attn.b = opt("attn.c_attn.bias", {3 * C});
      bp.proj.w = add_param(p + "attn.c_proj.weight", {C, C});
      bp.proj.b = opt("attn.c_proj.bias", {C});
      bp.ln2.w = add_param(p + "ln_2.weight", {C});
      bp.ln2.b = opt("ln_2.bias", {C});
      bp.fc.w = add_param(p + "mlp.c_fc.weight", {4 * C, C});
      bp.fc.b = opt("mlp.c_fc.bias", {4 * C});
      bp.mproj.w = add_param(p + "mlp.c_proj.weight", {C, 4 * C});
      bp.mproj.b = opt("mlp.c_proj.bias", {C});
      layers_.push_back(std::make_unique<GptBlock>(bp, cfg_.n_embd, cfg_.n_head));
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
};

std::unique_ptr<Model> make_gpt(const ModelConfig& c) { return std::make_unique<Gpt>(c); }

}  // namespace trident::nn
