// The parameters of trident's language models, declared once per architecture (nn/arch/: the GPT-2 family,
// the Llama family, the deep MLP): names, logical shapes, initialisation and how tensor parallelism splits
// each. The single-process model registers every declaration whole (nn/language_model.h);
// parallel/parallel_model.cc registers this rank's slice of the declarations of its pipeline stages (its
// shard plan). Both build their layers from the indices the declarations landed at (build_units /
// make_embedding / make_head, which ask the config's architecture), so the two are one model.
//
// Tensor parallelism over T ranks (rank t): Split::kRows keeps rows [t R/T, (t+1) R/T) of each of the
// tensor's `sections` equal row sections (column-parallel Linear; vocab-parallel embedding and head);
// Split::kCols keeps input columns (row-parallel Linear); Split::kReplicated keeps all of it (norms,
// row-parallel biases, learned positions, and key/value projections whose heads T does not divide).
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
  // per layer (Llama: its norms, o_proj and down_proj take the GPT's kLn1W, kLn2W, kProjW and kMprojW)
  kQ, kK, kV, kGate, kUp,
  // not per layer
  kWte, kWpe, kLnfW, kLnfB, kLmHead,
  kWteCopy,  // the last stage's own copy of wte for the tied head, when another rank holds the embedding
};
inline constexpr int kLayerRoles = 19;  // roles kLn1W .. kUp

struct ParamDecl {
  std::string name;             // the architecture's naming (nanoGPT's, Hugging Face's Llama)
  std::vector<int64_t> shape;   // logical (whole-model) shape, PyTorch layout
  Split split = Split::kReplicated;
  int sections = 1;             // kRows: equal row sections split separately (c_attn: q, k, v)
  int layer = -1;               // global layer index, -1 for the embedding and the head
  Role role = Role::kWte;
  bool normal = true;           // N(0, init^2), else the constant init
  double init = 0.0;
};

// The declarations of layers [l0, l1) of cfg's architecture for a model split over tp_size ranks, in
// registration order, preceded by the embedding's when `embedding` and followed by the head's (the final
// norm, an untied head) when `head`; `wte_copy` adds the tied head's own copy of the embedding (a last stage
// on a rank without the embedding). The whole model: (cfg, 0, n_layer, true, true).
std::vector<ParamDecl> declare_params(const ModelConfig& cfg, int l0, int l1, bool embedding, bool head,
                                      bool wte_copy = false, int tp_size = 1);

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
