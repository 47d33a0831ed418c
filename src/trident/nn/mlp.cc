// Deep MLP language model (kind "mlp"): the workload of the lecture on parallelism strategies, made to
// train on the same token data with the same interface as the GPT. Each position is processed alone:
//   x_0 = wte[token] + wpe[position]
//   x_{l+1} = x_l + gelu(x_l W_l^T + b_l)        for l < n_layer, W_l [n_embd, n_embd]
//   logits = ln_f(x_L) head^T, head = wte (tie_embeddings, default) or lm_head.weight [vocab, n_embd]
// Parameter names: wte.weight, wpe.weight, layers.{l}.weight, layers.{l}.bias, ln_f.weight, ln_f.bias,
// lm_head.weight. Init: N(0, 0.02) for embeddings and the head, N(0, 0.02/sqrt(2*n_layer)) for layers
// (residual branches, as GPT's c_proj), biases 0, LayerNorm weight 1.
// The layers are nn/layers.h's MlpLayers; activation_checkpointing keeps only x_l and recomputes the
// pre-activation in backward.
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
    layer_prefix_ = "layers.";
    for (int l = 0; l < cfg_.n_layer; ++l) {
      MlpLayers::Params lp;
      lp.w = add_param("layers." + std::to_string(l) + ".weight", {C, C});
      lp.b = cfg_.bias ? add_param("layers." + std::to_string(l) + ".bias", {C}) : -1;
      layers_.push_back(std::make_unique<MlpLayers>(std::vector<MlpLayers::Params>{lp}, cfg_.n_embd));
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
};

std::unique_ptr<Model> make_mlp(const ModelConfig& c) { return std::make_unique<DeepMlp>(c); }

}  // namespace trident::nn
