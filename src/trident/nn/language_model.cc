#include "trident/nn/language_model.h"

#include "trident/core/error.h"
#include "trident/nn/arch/architecture.h"
#include "trident/nn/models.h"

namespace trident::nn {

LanguageModel::LanguageModel(ModelConfig c, bool initialize)
    : FlatModel(std::move(c), initialize), ix_(cfg_.n_layer) {
  const int L = cfg_.n_layer;
  const std::vector<ParamDecl> decls = declare_params(cfg_, 0, L, true, true);
  for (const auto& d : decls) ix_.set(d.layer, d.role, add_param(d.name, d.shape));
  finalize_params();
  for (size_t i = 0; i < decls.size(); ++i) {
    const auto& d = decls[i];
    const int64_t R = d.shape[0], cols = static_cast<int64_t>(params_[i].numel) / std::max<int64_t>(R, 1);
    init_param(static_cast<int>(i), d, {{0, R}}, 0, cols);
  }
  finish_init();
  std::vector<int> firsts;
  for (const auto& span : unit_spans(cfg_, 0, L, 1)) firsts.push_back(span.first);
  const int64_t V = cfg_.vocab_size;
  range_ = std::make_unique<LayerRange>(make_embedding(cfg_, ix_, 0, V), build_units(cfg_, ix_, 0, L, 1),
                                        std::move(firsts), make_head(cfg_, ix_, 0, V), L, cfg_.n_embd,
                                        cfg_.activation_checkpointing);
}

LayerEnv LanguageModel::env() {
  LayerEnv e{*ops_, *this};
  e.workspace = &workspace_;
  e.precision = cfg_.precision();
  e.gelu = cfg_.gelu_kind();
  return e;
}

float LanguageModel::forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                                      float loss_scale) {
  check_batch(inputs, B, T);
  TRIDENT_CHECK(targets != nullptr, InvalidArgument, "model: targets is null");
  const size_t n = static_cast<size_t>(B) * T;
  inputs = on_device(inputs_, inputs, n);
  targets = on_device(targets_, targets, n);
  const LayerEnv e = env();
  const double loss = range_->forward(e, 0, inputs, targets, nullptr, nullptr, B, T, loss_scale, backward, nullptr);
  if (backward) range_->backward(e, 0, nullptr, nullptr);
  return static_cast<float>(loss);
}

void LanguageModel::forward_logits(const int32_t* inputs, int B, int T, float* logits) {
  check_batch(inputs, B, T);
  TRIDENT_CHECK(logits != nullptr, InvalidArgument, "model: logits is null");
  range_->forward(env(), 0, on_device(inputs_, inputs, static_cast<size_t>(B) * T), nullptr, nullptr, nullptr, B,
                  T, 1.0f, false, logits);
}

std::vector<Model::Block> LanguageModel::blocks() const {
  auto ids = [](std::initializer_list<int> v) {
    std::vector<size_t> out;
    for (int i : v)
      if (i >= 0) out.push_back(static_cast<size_t>(i));
    return out;
  };
  const Architecture& arch = architecture(cfg_.kind);
  std::vector<Block> b;
  b.push_back({"embedding", ids({ix_.wte, ix_.wpe})});
  const auto& units = range_->units();
  for (size_t l = 0; l < units.size(); ++l) b.push_back({arch.block_name(static_cast<int>(l)), units[l]->params()});
  b.push_back({"head", ids({ix_.lnf_w, ix_.lnf_b, ix_.head >= 0 ? ix_.head : ix_.wte})});
  return b;
}

std::unique_ptr<Model> make_model(const nlohmann::json& config, bool initialize) {
  return std::make_unique<LanguageModel>(ModelConfig::from_json(config), initialize);
}


}  // namespace trident::nn
