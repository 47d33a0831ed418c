// The GPT-2 family (nanoGPT's model.py, kind "gpt"): learned positions, LayerNorm, full multi-head attention,
// a GELU MLP 4 n_embd wide, the head tied to the token embedding.
//
// Parameters (nanoGPT's names): transformer.wte.weight [V, C], transformer.wpe.weight [block, C], per layer
// transformer.h.{l}.{ln_1.weight, ln_1.bias, attn.c_attn.weight [3C, C], attn.c_attn.bias, attn.c_proj.weight
// [C, C], attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight [4C, C], mlp.c_fc.bias, mlp.c_proj.weight
// [C, 4C], mlp.c_proj.bias}, transformer.ln_f.{weight, bias}; biases only with bias = true.
// Initialisation (nanoGPT's _init_weights; each tensor from its own stream, flat_model.h): LayerNorm weights
// 1, biases 0, c_proj weights N(0, 0.02/sqrt(2 n_layer)), every other weight N(0, 0.02).
// Tensor parallelism: c_attn column-parallel by heads of each of q, k, v (3 row sections), c_fc
// column-parallel, both c_proj row-parallel, wte vocab-parallel; LayerNorms, wpe and row-parallel biases
// replicated.
#include <cmath>
#include <numeric>

#include "trident/core/error.h"
#include "trident/nn/arch/architecture.h"

namespace trident::nn {
namespace {

class Gpt final : public Architecture {
 public:
  const char* kind() const override { return "gpt"; }
  const char* summary() const override {
    return "GPT-2 family: learned positions, LayerNorm, multi-head attention, GELU MLP, tied head";
  }

  void resolve(ModelConfig& c) const override {
    TRIDENT_CHECK(c.n_embd % c.n_head == 0, InvalidArgument,
                  "model config: n_embd {} must be divisible by n_head {}", c.n_embd, c.n_head);
    if (!c.tie_embeddings) c.tie_embeddings = true;
    TRIDENT_CHECK(*c.tie_embeddings, InvalidArgument,
                  "model config: the GPT always ties its head to wte (nanoGPT); tie_embeddings false is for kinds "
                  "llama and mlp");
    TRIDENT_CHECK(c.n_kv_head == 0 || c.n_kv_head == c.n_head, InvalidArgument,
                  "model config: n_kv_head {} != n_head {}: the GPT has full multi-head attention; grouped-query "
                  "attention is kind llama's",
                  c.n_kv_head, c.n_head);
    c.n_kv_head = c.n_head;
    TRIDENT_CHECK(c.intermediate_size == 0 || c.intermediate_size == 4 * c.n_embd, InvalidArgument,
                  "model config: intermediate_size {} != 4 n_embd = {}: the GPT's MLP is 4 n_embd wide",
                  c.intermediate_size, 4 * c.n_embd);
    c.intermediate_size = 4 * c.n_embd;
    TRIDENT_CHECK(c.rope_scaling.is_null(), InvalidArgument,
                  "model config: rope_scaling is set, but the GPT learns its positions (rotary embeddings are kind "
                  "llama's)");
  }

  void check_tp(const ModelConfig& c, int T) const override {
    // vocab_size 0: not known yet (a training config before its tokenizer is read).
    const int64_t V = c.vocab_size;
    const int64_t g = V > 0 ? std::gcd<int64_t, int64_t>(c.n_head, V) : c.n_head;
    TRIDENT_CHECK(c.n_head % T == 0, InvalidArgument,
                  "model layout: tp={} does not divide n_head={} (each rank holds whole heads); tensor-parallel sizes "
                  "that work with n_head {}{}: {}",
                  T, c.n_head, c.n_head, V > 0 ? fmt::format(" and vocab_size {}", V) : "", divisors_text(g, 1 << 20));
    TRIDENT_CHECK(c.n_embd % T == 0, InvalidArgument, "model layout: tp={} does not divide n_embd={}", T, c.n_embd);
    check_vocab_split(c, T, g);
  }

  std::vector<ParamDecl> declare(const ModelConfig& c, int l0, int l1, bool embedding, bool head, bool wte_copy,
                                 int) const override {
    const int64_t C = c.n_embd, V = c.vocab_size;
    const double w_std = 0.02, resid_std = 0.02 / std::sqrt(2.0 * std::max(1, c.n_layer));
    std::vector<ParamDecl> out;
    auto wte = [&](Role role) { return make_decl("transformer.wte.weight", {V, C}, role, -1, Split::kRows, true, w_std); };
    if (embedding) {
      out.push_back(wte(Role::kWte));
      out.push_back(make_decl("transformer.wpe.weight", {c.block_size, C}, Role::kWpe, -1, Split::kReplicated, true,
                              w_std));
    }
    const bool b = c.bias;
    for (int l = l0; l < l1; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      auto add = [&](const char* name, std::vector<int64_t> shape, Role role, Split split, bool normal, double init,
                     int sections = 1) {
        out.push_back(make_decl(p + name, std::move(shape), role, l, split, normal, init, sections));
      };
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
    }
    if (head) {
      out.push_back(make_decl("transformer.ln_f.weight", {C}, Role::kLnfW, -1, Split::kReplicated, false, 1.0));
      if (b) out.push_back(make_decl("transformer.ln_f.bias", {C}, Role::kLnfB, -1, Split::kReplicated, false, 0.0));
      if (wte_copy) out.push_back(wte(Role::kWteCopy));
    }
    return out;
  }

  std::vector<std::unique_ptr<Layer>> build_units(const ModelConfig& c, const ParamIndex& ix, int l0, int l1,
                                                  int) const override {
    std::vector<std::unique_ptr<Layer>> units;
    const float eps = static_cast<float>(c.norm_eps);
    for (int l = l0; l < l1; ++l) {
      const auto& r = ix.layer[l];
      auto at = [&](Role role) { return r[static_cast<int>(role)]; };
      GptBlock::Params p;
      p.ln1 = {NormKind::kLayerNorm, at(Role::kLn1W), at(Role::kLn1B), eps};
      p.attn = {at(Role::kAttnW), at(Role::kAttnB)};
      p.proj = {at(Role::kProjW), at(Role::kProjB)};
      p.ln2 = {NormKind::kLayerNorm, at(Role::kLn2W), at(Role::kLn2B), eps};
      p.fc = {at(Role::kFcW), at(Role::kFcB)};
      p.mproj = {at(Role::kMprojW), at(Role::kMprojB)};
      units.push_back(std::make_unique<GptBlock>(p, c.n_embd, c.n_head));
    }
    return units;
  }

  NormKind norm() const override { return NormKind::kLayerNorm; }
  std::string block_name(int layer) const override { return "transformer.h." + std::to_string(layer); }
  int head_dim(const ModelConfig& c) const override { return c.head_dim(); }
};

}  // namespace

const Architecture& gpt_architecture() {
  static const Gpt a;
  return a;
}

}  // namespace trident::nn
