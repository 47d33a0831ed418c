// The Llama family (Hugging Face's LlamaForCausalLM, kind "llama"; Llama 2 and 3, Mistral without a sliding
// window, TinyLlama and SmolLM share it): no learned positions, rotary embeddings on q and k (rotate-half
// layout, theta from the config, Llama 3.1's rope_scaling), RMSNorm, grouped-query attention (n_kv_head
// key/value heads, dividing n_head; 1 is multi-query), a SwiGLU MLP intermediate_size wide, no biases, an
// untied head unless tie_embeddings (Llama 3.2 1B ties it).
//
// Parameters (Hugging Face's names, nn.Linear's [out, in] layouts, hd = n_embd / n_head):
// model.embed_tokens.weight [V, C]; per layer model.layers.{l}.{input_layernorm.weight [C],
// self_attn.q_proj.weight [H hd, C], self_attn.k_proj.weight [KV hd, C], self_attn.v_proj.weight [KV hd, C],
// self_attn.o_proj.weight [C, H hd], post_attention_layernorm.weight [C], mlp.gate_proj.weight [I, C],
// mlp.up_proj.weight [I, C], mlp.down_proj.weight [C, I]}; model.norm.weight [C]; lm_head.weight [V, C] when
// untied. Registered in forward order (so the grad-ready hooks, in descending index order, follow backward).
// Initialisation (Hugging Face's _init_weights): every weight N(0, 0.02), norms 1.
// Tensor parallelism over T ranks: q_proj column-parallel by heads; k_proj and v_proj by key/value heads when
// T divides n_kv_head, else whole on every rank (their gradients all-reduced over the group, nn/layers.h);
// o_proj and down_proj row-parallel; gate_proj and up_proj column-parallel; embed_tokens and lm_head
// vocab-parallel; norms replicated.
#include <numeric>

#include "trident/core/error.h"
#include "trident/nn/arch/architecture.h"

namespace trident::nn {
namespace {

double number(const nlohmann::json& scaling, const char* key) {
  TRIDENT_CHECK(scaling.contains(key) && scaling.at(key).is_number(), InvalidArgument,
                "model config: rope_scaling of type llama3 needs a number '{}', got {}", key,
                scaling.contains(key) ? scaling.at(key).dump() : "nothing");
  return scaling.at(key).get<double>();
}

class Llama final : public Architecture {
 public:
  const char* kind() const override { return "llama"; }
  const char* summary() const override {
    return "Llama family: rotary embeddings, RMSNorm, grouped-query attention, SwiGLU MLP, no biases";
  }

  void resolve(ModelConfig& c) const override {
    if (c.n_kv_head == 0) c.n_kv_head = c.n_head;
    TRIDENT_CHECK(c.n_kv_head <= c.n_head && c.n_head % c.n_kv_head == 0, InvalidArgument,
                  "model config: n_head {} is not divisible by n_kv_head {} (grouped-query attention shares each "
                  "key/value head among n_head / n_kv_head query heads); use n_kv_head in {{{}}}",
                  c.n_head, c.n_kv_head, divisors_text(c.n_head, c.n_head));
    TRIDENT_CHECK(c.n_embd % c.n_head == 0 && (c.n_embd / c.n_head) % 2 == 0, InvalidArgument,
                  "model config: n_embd {} / n_head {} must be an even whole head dimension (rotary embeddings "
                  "rotate pairs)",
                  c.n_embd, c.n_head);
    if (c.intermediate_size == 0) c.intermediate_size = (8 * c.n_embd / 3 + 31) / 32 * 32;
    TRIDENT_CHECK(!c.bias, InvalidArgument,
                  "model config: bias true: the Llama family has no biases (Hugging Face's attention_bias and mlp_bias "
                  "are not supported); set bias false");
    if (!c.tie_embeddings) c.tie_embeddings = false;
    TRIDENT_CHECK(c.rope_theta > 0, InvalidArgument, "model config: rope_theta must be > 0, got {}", c.rope_theta);
    TRIDENT_CHECK(c.norm_eps > 0, InvalidArgument, "model config: norm_eps must be > 0, got {}", c.norm_eps);
    const nlohmann::json& s = c.rope_scaling;
    if (s.is_null()) return;
    TRIDENT_CHECK(s.is_object(), InvalidArgument, "model config: rope_scaling must be null or an object, got {}",
                  s.dump());
    const char* type_key = s.contains("rope_type") ? "rope_type" : "type";
    const std::string type = s.contains(type_key) && s.at(type_key).is_string() ? s.at(type_key).get<std::string>()
                                                                               : std::string("(none)");
    TRIDENT_CHECK(type == "llama3", InvalidArgument,
                  "model config: rope_scaling type '{}' is not supported; trident implements Llama 3.1's 'llama3' "
                  "(or rope_scaling null)",
                  type);
    const double factor = number(s, "factor"), lo = number(s, "low_freq_factor"), hi = number(s, "high_freq_factor"),
                 old_len = number(s, "original_max_position_embeddings");
    TRIDENT_CHECK(factor > 0 && lo > 0 && hi > lo && old_len >= 1, InvalidArgument,
                  "model config: rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                  "original_max_position_embeddings >= 1, got {}",
                  s.dump());
  }

  void check_tp(const ModelConfig& c, int T) const override {
    // vocab_size 0: not known yet (a training config before its tokenizer is read).
    const int64_t V = c.vocab_size;
    TRIDENT_CHECK(c.n_head % T == 0, InvalidArgument,
                  "model layout: tp={} does not divide n_head={} (each rank holds whole query heads; key/value heads "
                  "are split when tp divides n_kv_head={}, else copied); tensor-parallel sizes that work: {}",
                  T, c.n_head, c.kv_heads(), divisors_text(c.n_head, c.n_head));
    TRIDENT_CHECK(c.intermediate_size % T == 0, InvalidArgument,
                  "model layout: tensor-parallel size {} does not divide intermediate_size {} (gate_proj and up_proj "
                  "are split by rows); tensor-parallel sizes that work: {}",
                  T, c.intermediate_size, divisors_text(std::gcd(c.intermediate_size, c.n_head), c.n_head));
    check_vocab_split(c, T, V > 0 ? std::gcd<int64_t, int64_t>(c.n_head, V) : c.n_head);
  }

  std::vector<ParamDecl> declare(const ModelConfig& c, int l0, int l1, bool embedding, bool head, bool wte_copy,
                                 int tp) const override {
    const int64_t C = c.n_embd, V = c.vocab_size, hd = c.head_dim(), H = c.n_head, KV = c.kv_heads(),
                  I = c.intermediate_size;
    const double w_std = 0.02;
    const Split kv_split = KV % tp == 0 ? Split::kRows : Split::kReplicated;
    std::vector<ParamDecl> out;
    auto wte = [&](Role role) {
      return make_decl("model.embed_tokens.weight", {V, C}, role, -1, Split::kRows, true, w_std);
    };
    if (embedding) out.push_back(wte(Role::kWte));
    for (int l = l0; l < l1; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      auto add = [&](const char* name, std::vector<int64_t> shape, Role role, Split split, bool normal, double init) {
        out.push_back(make_decl(p + name, std::move(shape), role, l, split, normal, init));
      };
      add("input_layernorm.weight", {C}, Role::kLn1W, Split::kReplicated, false, 1.0);
      add("self_attn.q_proj.weight", {H * hd, C}, Role::kQ, Split::kRows, true, w_std);
      add("self_attn.k_proj.weight", {KV * hd, C}, Role::kK, kv_split, true, w_std);
      add("self_attn.v_proj.weight", {KV * hd, C}, Role::kV, kv_split, true, w_std);
      add("self_attn.o_proj.weight", {C, H * hd}, Role::kProjW, Split::kCols, true, w_std);
      add("post_attention_layernorm.weight", {C}, Role::kLn2W, Split::kReplicated, false, 1.0);
      add("mlp.gate_proj.weight", {I, C}, Role::kGate, Split::kRows, true, w_std);
      add("mlp.up_proj.weight", {I, C}, Role::kUp, Split::kRows, true, w_std);
      add("mlp.down_proj.weight", {C, I}, Role::kMprojW, Split::kCols, true, w_std);
    }
    if (head) {
      out.push_back(make_decl("model.norm.weight", {C}, Role::kLnfW, -1, Split::kReplicated, false, 1.0));
      if (!c.tied())
        out.push_back(make_decl("lm_head.weight", {V, C}, Role::kLmHead, -1, Split::kRows, true, w_std));
      else if (wte_copy)
        out.push_back(wte(Role::kWteCopy));
    }
    return out;
  }

  std::vector<std::unique_ptr<Layer>> build_units(const ModelConfig& c, const ParamIndex& ix, int l0, int l1,
                                                  int tp) const override {
    const int hd = c.head_dim(), H = c.n_head, KV = c.kv_heads(), I = c.intermediate_size;
    const bool kv_split = KV % tp == 0;
    const int q_rows = H * hd / tp, kv_rows = kv_split ? KV * hd / tp : KV * hd;
    const float eps = static_cast<float>(c.norm_eps);
    auto rope = std::make_shared<const RopeTable>(hd, c.block_size, c.rope_theta, c.rope_scaling);
    std::vector<std::unique_ptr<Layer>> units;
    for (int l = l0; l < l1; ++l) {
      const auto& r = ix.layer[l];
      auto at = [&](Role role) { return r[static_cast<int>(role)]; };
      LlamaBlock::Params p;
      p.attn_norm = {NormKind::kRmsNorm, at(Role::kLn1W), -1, eps};
      p.mlp_norm = {NormKind::kRmsNorm, at(Role::kLn2W), -1, eps};
      p.qkv.parts = {{at(Role::kQ), q_rows, false},
                     {at(Role::kK), kv_rows, !kv_split},
                     {at(Role::kV), kv_rows, !kv_split}};
      p.o = {at(Role::kProjW), -1};
      p.gate_up.parts = {{at(Role::kGate), I / tp, false}, {at(Role::kUp), I / tp, false}};
      p.down = {at(Role::kMprojW), -1};
      units.push_back(std::make_unique<LlamaBlock>(std::move(p), c.n_embd, H, KV, I, kv_split, rope));
    }
    return units;
  }

  NormKind norm() const override { return NormKind::kRmsNorm; }
  std::string block_name(int layer) const override { return "model.layers." + std::to_string(layer); }
  int head_dim(const ModelConfig& c) const override { return c.head_dim(); }
  bool gated_mlp() const override { return true; }
  bool learned_positions() const override { return false; }
};

}  // namespace

const Architecture& llama_architecture() {
  static const Llama a;
  return a;
}

}  // namespace trident::nn
