#include "trident/nn/model_spec.h"

#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/nn/arch/architecture.h"

namespace trident::nn {

std::vector<ParamDecl> declare_params(const ModelConfig& cfg, int l0, int l1, bool embedding, bool head,
                                      bool wte_copy, int tp_size) {
  return architecture(cfg.kind).declare(cfg, l0, l1, embedding, head, wte_copy, tp_size);
}

std::vector<std::pair<int, int>> unit_spans(const ModelConfig& cfg, int l0, int l1, int tp_size) {
  return architecture(cfg.kind).unit_spans(cfg, l0, l1, tp_size);
}

void ParamIndex::set(int layer_index, Role role, int index) {
  if (layer_index >= 0) {
    TRIDENT_CHECK(layer_index < static_cast<int>(layer.size()), InvalidArgument,
                  "ParamIndex: layer {} is outside the model's {} layers", layer_index, layer.size());
    layer[layer_index][static_cast<int>(role)] = index;
    return;
  }
  switch (role) {
    case Role::kWte: wte = index; break;
    case Role::kWpe: wpe = index; break;
    case Role::kLnfW: lnf_w = index; break;
    case Role::kLnfB: lnf_b = index; break;
    case Role::kLmHead:
    case Role::kWteCopy: head = index; break;
    default: break;
  }
}

std::vector<std::unique_ptr<Layer>> build_units(const ModelConfig& cfg, const ParamIndex& ix, int l0, int l1,
                                                int tp_size) {
  return architecture(cfg.kind).build_units(cfg, ix, l0, l1, tp_size);
}

Embedding make_embedding(const ModelConfig& cfg, const ParamIndex& ix, int64_t v0, int64_t vl) {
  return Embedding{ix.wte, ix.wpe, cfg.vocab_size, v0, vl};
}

LmHead make_head(const ModelConfig& cfg, const ParamIndex& ix, int64_t v0, int64_t vl) {
  // An own head weight (lm_head, the wte copy) fires when the head's backward is done; the tied wte of a
  // model that also holds the embedding is final only after the embedding's backward.
  const int head = ix.head >= 0 ? ix.head : ix.wte;
  const Norm lnf{architecture(cfg.kind).norm(), ix.lnf_w, ix.lnf_b, static_cast<float>(cfg.norm_eps)};
  return LmHead{lnf, head, ix.head >= 0, cfg.vocab_size, v0, vl, cfg.valid_vocab_size};
}

}  // namespace trident::nn
