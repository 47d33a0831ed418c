// Architectures as data: one descriptor per model family, each in a file of its own beside this header
// (gpt.cc: the GPT-2 family; llama.cc: the Llama family; mlp.cc: the deep MLP). A descriptor declares its
// parameters (names, logical shapes, initialisation, how tensor parallelism splits each), resolves and
// validates its configuration, and builds its units from nn/layers.h's parts: the embedding (with or
// without learned positions), the normalization (LayerNorm or RMSNorm), the attention (heads and key/value
// heads, with or without rotary embeddings), the MLP (GELU or SwiGLU) and the head (tied or untied).
// Everything outside nn/arch/ asks the descriptor of a config's `kind`; nothing compares the kind string.
//
// Adding an architecture: a descriptor file here (registered in architecture.cc's table) plus whatever new
// kernels its layers need (kernels/device.h's op table, CPU and CUDA).
//
// Thread-safety: descriptors are immutable singletons; every function is pure.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/nn/layers.h"
#include "trident/nn/model_config.h"
#include "trident/nn/model_spec.h"

namespace trident::nn {

class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual const char* kind() const = 0;
  // One line for help texts: what the architecture is.
  virtual const char* summary() const = 0;

  // Fills the keys left to the architecture (0 or unset: n_kv_head, intermediate_size, tie_embeddings) with its
  // defaults and checks its rules (throws InvalidArgument naming the key, the value found and what is allowed).
  virtual void resolve(ModelConfig& c) const = 0;
  // Throws InvalidArgument naming the sizes that would work when `tp` ranks cannot shard `c`.
  virtual void check_tp(const ModelConfig& c, int tp) const = 0;

  // The declarations of layers [l0, l1) in registration order (the embedding's first when `embedding`, the
  // head's last when `head`; `wte_copy`: the tied head's own copy of the embedding on a last pipeline stage
  // that does not hold it), for a model split over `tp` tensor-parallel ranks.
  virtual std::vector<ParamDecl> declare(const ModelConfig& c, int l0, int l1, bool embedding, bool head,
                                         bool wte_copy, int tp) const = 0;
  // The units a range of layers runs as: (first layer, layer count); one layer each unless overridden.
  virtual std::vector<std::pair<int, int>> unit_spans(const ModelConfig& c, int l0, int l1, int tp) const;
  // nn's layers over the indices of `ix` for the units of [l0, l1) (as unit_spans lists them).
  virtual std::vector<std::unique_ptr<Layer>> build_units(const ModelConfig& c, const ParamIndex& ix, int l0, int l1,
                                                          int tp) const = 0;
  // The normalization of the blocks and the head.
  virtual NormKind norm() const = 0;
  // The name of layer l's block (Model::blocks()), e.g. "transformer.h.3".
  virtual std::string block_name(int layer) const = 0;

  // Facts the planner and the startup log read (train/ derives plan::ModelSpec from them in one function).
  virtual int head_dim(const ModelConfig& c) const { return 0; }  // 0: no attention
  virtual bool gated_mlp() const { return false; }
  virtual bool learned_positions() const { return true; }
  virtual int ffn_size(const ModelConfig& c) const { return c.intermediate_size; }
};

// Shared by the descriptors: a declaration, and the sizes in [1, limit] that divide g (for error messages).
ParamDecl make_decl(std::string name, std::vector<int64_t> shape, Role role, int layer, Split split, bool normal,
                    double init, int sections = 1);
std::string divisors_text(int64_t g, int limit);
// The vocabulary-parallel embedding and head split vocab_size by rows: throws InvalidArgument naming the padding
// and the sizes (divisors of g) that work when tp does not divide it. vocab_size 0 (not known yet) passes.
void check_vocab_split(const ModelConfig& c, int tp, int64_t g);

// The descriptor of `kind`; throws InvalidArgument naming the known kinds.
const Architecture& architecture(const std::string& kind);
std::vector<std::string> architecture_kinds();

}  // namespace trident::nn
