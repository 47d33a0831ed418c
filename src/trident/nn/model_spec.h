// The parameters of trident's language models (the GPT and the deep MLP), declared once: names, logical
// shapes, initialisation and how tensor parallelism splits each. The single-process model registers
// every declaration whole (nn/language_model.h); parallel/parallel_model.cc registers this rank's slice of
// the declarations of its pipeline stages (its shard plan). Both build their layers from the indices the
// declarations landed at (build_units / make_embedding / make_head), so the two are one model.
//
// GPT (nanoGPT's model.py, kind "gpt"): transformer.wte.weight [V, C], transformer.wpe.weight [block, C],
// per layer transformer.h.{l}.{ln_1.weight, ln_1.bias, attn.c_attn.weight [3C, C], attn.c_attn.bias,
// attn.c_proj.weight [C, C], attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight [4C, C],
// mlp.c_fc.bias, mlp.c_proj.weight [C, 4C], mlp.c_proj.bias}, transformer.ln_f.{weight, bias}; the head
// is wte (tied). Biases only with bias = true.
// Deep MLP (kind "mlp"): wte.weight, wpe.weight, layers.{l}.{weight [C, C], bias}, ln_f.{weight, bias},
// lm_head.weight [V, C] when tie_embeddings is false:
//   x_0 = wte[token] + wpe[position]; x_{l+1} = x_l + gelu(x_l W_l^T + b_l); logits = ln_f(x_L) head^T.
// Initialisation (nanoGPT's _init_weights, drawn in registration order): LayerNorm weights 1, biases 0,
// residual projections (GPT c_proj weights, the MLP's layers) N(0, 0.02/sqrt(2 n_layer)), every other
// weight N(0, 0.02).
//
// Tensor parallelism over T ranks (rank t): Split::kRows keeps rows [t R/T, (t+1) R/T) of each of the
// tensor's `sections` equal row sections (column-parallel Linear: c_attn by heads of each of q, k, v, c_fc,
// the MLP's even layers of a stage; vocab-parallel wte and lm_head); Split::kCols keeps input columns
// (row-parallel Linear: both c_proj, the MLP's odd layers of a stage); Split::kReplicated keeps all of it
// (LayerNorms, row-parallel biases, wpe). The MLP's layers pair up within a stage (column then row).
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trident/nn/flat_model.h"
#include "trident/nn/layers.h"

namespace trident::nn {

enum class Split : uint8_t { kReplicated, kRows, kCols };

// What a parameter is in its model (indices of ParamIndex).
enum class Role : uint8_t {
  // per layer (GPT)
  kLn1W = 0, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kMprojW, kMprojB,
  // per layer (MLP)
  kMlpW = 0 + 12, kMlpB,
  // not per layer
  kWte, kWpe, kLnfW, kLnfB, kLmHead,
  kWteCopy,  // the last stage's own copy of wte for the tied head, when another rank holds the embedding
};
inline constexpr int kLayerRoles = 14;  // roles kLn1W .. kMlpB

struct ParamDecl {
  std::string name;             // nanoGPT's naming
  std::vector<int64_t> shape;   // logical (whole-model) shape, PyTorch layout
  Split split = Split::kReplicated;
  int sections = 1;             // kRows: equal row sections split separately (c_attn: q, k, v)
  int layer = -1;               // global layer index, -1 for the embedding and the head
  Role role = Role::kWte;
  bool normal = true;           // N(0, init^2), else the constant init
  double init = 0.0;
};

// The declarations of layers [l0, l1) in registration order, preceded by the embedding's when `embedding`
// and followed by the head's (ln_f, an untied lm_head) when `head`; `wte_copy` adds the tied head's own
// wte copy (a last stage on a rank without the embedding). The whole model: (cfg, 0, n_layer, true, true).
std::vector<ParamDecl> declare_params(const ModelConfig& cfg, int l0, int l1, bool embedding, bool head,
                                      bool wte_copy = false);

// The units a range of layers runs as: (first layer, layer count); one layer each, except the deep MLP's
// column/row pairs under tensor parallelism.
std::vector<std::pair<int, int>> unit_spans(const ModelConfig& cfg, int l0, int l1, int tp_size);

// Where the declarations of a model (or a shard) landed in its FlatModel: parameter index per role (-1:
// not held here).
struct ParamIndex {
  std::vector<std::array<int, kLayerRoles>> layer;  // per global layer
  int wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1, head = -1;  // head: lm_head, the wte copy, or -1 (wte)
  explicit ParamIndex(int n_layer = 0) { layer.assign(n_layer, filled()); }
  void set(int layer_index, Role role, int index);  // layer_index -1: not per layer
  static std::array<int, kLayerRoles> filled() {
    std::array<int, kLayerRoles> a{};
    a.fill(-1);
    return a;
  }
};

// nn's layers over the indices of `ix`: the units of [l0, l1), the embedding (vocabulary rows [v0, v0 + vl)
// of V) and the head (which fires its weight's hook itself unless it is the embedding's own wte).
std::vector<std::unique_ptr<Layer>> build_units(const ModelConfig& cfg, const ParamIndex& ix, int l0, int l1,
                                                int tp_size);
Embedding make_embedding(const ModelConfig& cfg, const ParamIndex& ix, int64_t v0, int64_t vl);
LmHead make_head(const ModelConfig& cfg, const ParamIndex& ix, int64_t v0, int64_t vl);

}  // namespace trident::nn
