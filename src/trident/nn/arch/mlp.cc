// The deep MLP (kind "mlp"): a residual stack of GELU layers between a token + position embedding and a
// LayerNorm head, trident's smallest model for tests and communication studies:
//   x_0 = wte[token] + wpe[position]; x_{l+1} = x_l + gelu(x_l W_l^T + b_l); logits = ln_f(x_L) head^T.
// Parameters: wte.weight, wpe.weight, layers.{l}.{weight [C, C], bias}, ln_f.{weight, bias}, lm_head.weight
// [V, C] when tie_embeddings is false. Initialisation: the layers' weights N(0, 0.02/sqrt(2 n_layer)), the
// embeddings and lm_head N(0, 0.02), LayerNorm weights 1, biases 0.
// Tensor parallelism: within a stage the layers pair up, even ones column-parallel, odd ones row-parallel
// (one all-reduce per pair each way); an unpaired last layer is column-parallel. wte and lm_head
// vocab-parallel.
#include <cmath>
#include <numeric>

#include "trident/core/error.h"
#include "trident/nn/arch/architecture.h"

namespace trident::nn {
namespace {

class Mlp final : public Architecture {
 public:
  const char* kind() const override { return "mlp"; }
  const char* summary() const override { return "deep MLP: residual GELU layers, LayerNorm head (tests, studies)"; }

  void resolve(ModelConfig& c) const override {
    if (!c.tie_embeddings) c.tie_embeddings = true;
    TRIDENT_CHECK(c.n_kv_head == 0, InvalidArgument,
                  "model config: n_kv_head {} is set, but the deep MLP has no attention", c.n_kv_head);
    TRIDENT_CHECK(c.intermediate_size == 0 || c.intermediate_size == c.n_embd, InvalidArgument,
                  "model config: intermediate_size {}: the deep MLP's layers are n_embd x n_embd", c.intermediate_size);
    c.intermediate_size = c.n_embd;
    TRIDENT_CHECK(c.rope_scaling.is_null(), InvalidArgument,
                  "model config: rope_scaling is set, but the deep MLP has no attention");
  }

  void check_tp(const ModelConfig& c, int T) const override {
    // vocab_size 0: not known yet (a training config before its tokenizer is read).
    const int64_t V = c.vocab_size;
    const int64_t g = V > 0 ? std::gcd<int64_t, int64_t>(c.n_embd, V) : c.n_embd;
    TRIDENT_CHECK(c.n_embd % T == 0, InvalidArgument,
                  "model layout: tp={} does not divide n_embd={} (the MLP's layers are split by columns); "
                  "tensor-parallel sizes that work: {}",
                  T, c.n_embd, divisors_text(g, 64));
    check_vocab_split(c, T, g);
  }

  std::vector<ParamDecl> declare(const ModelConfig& c, int l0, int l1, bool embedding, bool head, bool wte_copy,
                                 int) const override {
    const int64_t C = c.n_embd, V = c.vocab_size;
    const double w_std = 0.02, resid_std = 0.02 / std::sqrt(2.0 * std::max(1, c.n_layer));
    std::vector<ParamDecl> out;
    auto wte = [&](Role role) { return make_decl("wte.weight", {V, C}, role, -1, Split::kRows, true, w_std); };
    if (embedding) {
      out.push_back(wte(Role::kWte));
      out.push_back(make_decl("wpe.weight", {c.block_size, C}, Role::kWpe, -1, Split::kReplicated, true, w_std));
    }
    for (int l = l0; l < l1; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      // Within a stage the layers pair up under tensor parallelism: even ones column-, odd ones row-parallel.
      const bool row = (l - l0) % 2 == 1;
      out.push_back(make_decl(p + "weight", {C, C}, Role::kMlpW, l, row ? Split::kCols : Split::kRows, true, resid_std));
      if (c.bias)
        out.push_back(make_decl(p + "bias", {C}, Role::kMlpB, l, row ? Split::kReplicated : Split::kRows, false, 0.0));
    }
    if (head) {
      out.push_back(make_decl("ln_f.weight", {C}, Role::kLnfW, -1, Split::kReplicated, false, 1.0));
      if (c.bias) out.push_back(make_decl("ln_f.bias", {C}, Role::kLnfB, -1, Split::kReplicated, false, 0.0));
      if (!c.tied())
        out.push_back(make_decl("lm_head.weight", {V, C}, Role::kLmHead, -1, Split::kRows, true, w_std));
      else if (wte_copy)
        out.push_back(wte(Role::kWteCopy));
    }
    return out;
  }

  std::vector<std::pair<int, int>> unit_spans(const ModelConfig&, int l0, int l1, int tp) const override {
    std::vector<std::pair<int, int>> out;
    const int span = tp > 1 ? 2 : 1;
    for (int l = l0; l < l1; l += span) out.emplace_back(l, std::min(span, l1 - l));
    return out;
  }

  std::vector<std::unique_ptr<Layer>> build_units(const ModelConfig& c, const ParamIndex& ix, int l0, int l1,
                                                  int tp) const override {
    std::vector<std::unique_ptr<Layer>> units;
    for (const auto& [first, count] : unit_spans(c, l0, l1, tp)) {
      std::vector<MlpLayers::Params> ls;
      for (int l = first; l < first + count; ++l)
        ls.push_back({ix.layer[l][static_cast<int>(Role::kMlpW)], ix.layer[l][static_cast<int>(Role::kMlpB)]});
      units.push_back(std::make_unique<MlpLayers>(std::move(ls), c.n_embd));
    }
    return units;
  }

  NormKind norm() const override { return NormKind::kLayerNorm; }
  std::string block_name(int layer) const override { return "layers." + std::to_string(layer); }
};

}  // namespace

const Architecture& mlp_architecture() {
  static const Mlp a;
  return a;
}

}  // namespace trident::nn
