#include "trident/nn/model_spec.h"

#include <algorithm>
#include <cmath>

#include "trident/core/error.h"

namespace trident::nn {

namespace {

ParamDecl decl(std::string name, std::vector<int64_t> shape, Role role, int layer, Split split, bool normal,
               double init, int sections = 1) {
  return ParamDecl{std::move(name), std::move(shape), split, sections, layer, role, normal, init};
}

}  // namespace

std::vector<ParamDecl> declare_params(const ModelConfig& cfg, int l0, int l1, bool embedding, bool head,
                                      bool wte_copy) {
  const bool gpt = cfg.kind == "gpt";
  const int64_t C = cfg.n_embd, V = cfg.vocab_size;
  const double w_std = 0.02, resid_std = 0.02 / std::sqrt(2.0 * std::max(1, cfg.n_layer));
  const std::string pre = gpt ? "transformer." : "";
  std::vector<ParamDecl> out;
  auto wte = [&](Role role) { return decl(pre + "wte.weight", {V, C}, role, -1, Split::kRows, true, w_std); };
  if (embedding) {
    out.push_back(wte(Role::kWte));
    out.push_back(decl(pre + "wpe.weight", {cfg.block_size, C}, Role::kWpe, -1, Split::kReplicated, true, w_std));
  }
  for (int l = l0; l < l1; ++l) {
    if (gpt) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      auto add = [&](const char* name, std::vector<int64_t> shape, Role role, Split split, bool normal, double init,
                     int sections = 1) {
        out.push_back(decl(p + name, std::move(shape), role, l, split, normal, init, sections));
      };
      const bool b = cfg.bias;
      add("ln_1.weight", {C}, Role::kLn1W, Split::kReplicated, false, 1.0);
      if (b) add("ln_1.bias", {C}, Role::kLn1B, Split::kReplicated, false, 0.0);
      add("attn.c_attn.weight", {3 * C, C}, Role::kAttnW, Split::kRows, true, w_std, 3);
      if (b) add("attn.c_attn.bias", {3 * C}, Role::kAttnB, Split::kRows, false, 0.0, 3);
      add("attn.c_proj.weight", {C, C}, Role::kProjW, Split::kCols, true, resid_std);
      if (b) add("attn.c_proj.bias", {C}, Role::kProjB, Split::kReplicated, false, 0.0);
      add("ln_2.weight", {C}, Role::kLn2W, Split::kReplicated, false, 1.0);
      if (b) add("ln_2.bias", {C}, Role::kLn2B, Split::kReplicated, false, 0.0);
      add("mlp.c_fc.weight", {4 * C, C}, Role::kFcW, Split::kRows, true, w_std);
      if (b) add("mlp.c_fc.bias", {4 * C}, Role::kFcB, Split::kRows, false, 0.0);
      add("mlp.c_proj.weight", {C, 4 * C}, Role::kMprojW, Split::kCols, true, resid_std);
      if (b) add("mlp.c_proj.bias", {C}, Role::kMprojB, Split::kReplicated, false, 0.0);
    } else {
      const std::string p = "layers." + std::to_string(l) + ".";
      // Within a stage the layers pair up under tensor parallelism: even ones column-, odd ones row-parallel.
      const bool row = (l - l0) % 2 == 1;
      out.push_back(decl(p + "weight", {C, C}, Role::kMlpW, l, row ? Split::kCols : Split::kRows, true, resid_std));
      if (cfg.bias)
        out.push_back(decl(p + "bias", {C}, Role::kMlpB, l, row ? Split::kReplicated : Split::kRows, false, 0.0));
    }
  }
  if (head) {
    out.push_back(decl(pre + "ln_f.weight", {C}, Role::kLnfW, -1, Split::kReplicated, false, 1.0));
    if (cfg.bias) out.push_back(decl(pre + "ln_f.bias", {C}, Role::kLnfB, -1, Split::kReplicated, false, 0.0));
    if (!gpt && !cfg.tie_embeddings)
      out.push_back(decl("lm_head.weight", {V, C}, Role::kLmHead, -1, Split::kRows, true, w_std));
    else if (wte_copy)
      out.push_back(wte(Role::kWteCopy));
  }
  return out;
}

std::vector<std::pair<int, int>> unit_spans(const ModelConfig& cfg, int l0, int l1, int tp_size) {
  std::vector<std::pair<int, int>> out;
  const int span = cfg.kind == "mlp" && tp_size > 1 ? 2 : 1;
  for (int l = l0; l < l1; l += span) out.emplace_back(l, std::min(span, l1 - l));
  return out;
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
  std::vector<std::unique_ptr<Layer>> units;
  for (const auto& [first, count] : unit_spans(cfg, l0, l1, tp_size)) {
    if (cfg.kind == "gpt") {
      const auto& r = ix.layer[first];
      auto at = [&](Role role) { return r[static_cast<int>(role)]; };
      GptBlock::Params p;
      p.ln1 = {at(Role::kLn1W), at(Role::kLn1B)};
      p.attn = {at(Role::kAttnW), at(Role::kAttnB)};
      p.proj = {at(Role::kProjW), at(Role::kProjB)};
      p.ln2 = {at(Role::kLn2W), at(Role::kLn2B)};
      p.fc = {at(Role::kFcW), at(Role::kFcB)};
      p.mproj = {at(Role::kMprojW), at(Role::kMprojB)};
      units.push_back(std::make_unique<GptBlock>(p, cfg.n_embd, cfg.n_head));
    } else {
      std::vector<MlpLayers::Params> ls;
      for (int l = first; l < first + count; ++l)
        ls.push_back({ix.layer[l][static_cast<int>(Role::kMlpW)], ix.layer[l][static_cast<int>(Role::kMlpB)]});
      units.push_back(std::make_unique<MlpLayers>(std::move(ls), cfg.n_embd));
    }
  }
  return units;
}

Embedding make_embedding(const ModelConfig& cfg, const ParamIndex& ix, int64_t v0, int64_t vl) {
  return Embedding{ix.wte, ix.wpe, cfg.vocab_size, v0, vl};
}

LmHead make_head(const ModelConfig& cfg, const ParamIndex& ix, int64_t v0, int64_t vl) {
  // An own head weight (lm_head, the wte copy) fires when the head's backward is done; the tied wte of a
  // model that also holds the embedding is final only after the embedding's backward.
  const int head = ix.head >= 0 ? ix.head : ix.wte;
  return LmHead{LayerNorm{ix.lnf_w, ix.lnf_b}, head, ix.head >= 0, cfg.vocab_size, v0, vl};
}

}  // namespace trident::nn
