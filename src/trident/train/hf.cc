#include "trident/train/hf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>

#include "trident/core/json_int.h"
#include "trident/core/tensor.h"
#include "trident/data/file_io.h"
#include "trident/data/tokenizer.h"

// Throws HfError("<where>: <label> is <found>; expected <expected>") with the fields set (and file:line).
#define TRIDENT_HF_REFUSE(where, key, label, found, expected)                                                  \
  throw ::trident::train::HfError(                                                                           \
      ::trident::detail::with_location(::fmt::format("{}: {} is {}; expected {}", where, label, found, expected), \
                                       __FILE__, __LINE__),                                                  \
      key, ::fmt::format("{}", found), ::fmt::format("{}", expected))

namespace trident::train {
namespace fs = std::filesystem;
namespace {
using json = nlohmann::json;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Typed reads of config.json's keys; a key that is absent or null takes the default (Hugging Face's), a value
// of the wrong type is refused naming the key.
struct ConfigReader {
  const json& j;
  std::string where;

  bool has(const std::string& key) const { return j.contains(key) && !j.at(key).is_null(); }
  int64_t positive(const std::string& key, std::optional<int64_t> dflt = std::nullopt) const {
    if (!has(key)) {
      if (dflt) return *dflt;
      TRIDENT_HF_REFUSE(where, key, key, "missing", "a positive integer");
    }
    int64_t v = 0;
    if (!json_int::to_int(j.at(key), &v) || v <= 0)
      TRIDENT_HF_REFUSE(where, key, key, j.at(key).dump(), "a positive integer");
    return v;
  }
  double number(const std::string& key, double dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_number() || !(j.at(key).get<double>() > 0))
      TRIDENT_HF_REFUSE(where, key, key, j.at(key).dump(), "a positive number");
    return j.at(key).get<double>();
  }
  bool boolean(const std::string& key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_boolean()) TRIDENT_HF_REFUSE(where, key, key, j.at(key).dump(), "true or false");
    return j.at(key).get<bool>();
  }
  std::string string(const std::string& key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_string()) TRIDENT_HF_REFUSE(where, key, key, j.at(key).dump(), "a string");
    return j.at(key).get<std::string>();
  }
};

// The sizes both sides' tensors follow from.
struct Dims {
  int64_t V = 0, Vp = 0;       // vocabulary (config.json's) and trident's padded rows
  int64_t C = 0, L = 0, NH = 0, NKV = 0, I = 0;
  int64_t T_hf = 0, T = 0;     // GPT-2: wpe rows in the file and in trident
  bool tied = false;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto v : shape) n *= v;
  return n;
}

int64_t round_up(int64_t v, int multiple) {
  const int64_t m = std::max(1, multiple);
  return (v + m - 1) / m * m;
}

// How a tensor changes between the two layouts.
enum class Layout : uint8_t {
  kSame,
  kConv1D,        // GPT-2's Conv1D weight [in, out] <-> nn.Linear's [out, in]
  kVocabRows,     // [V, C] <-> [Vp, C]: zero rows appended on import, cropped on export
  kPositionRows,  // GPT-2's wpe [T_hf, C] -> [T, C] (T <= T_hf: cropped on import)
};
struct TensorMap {
  std::string name;              // Hugging Face's (for GPT-2 with "transformer."); trident's is the same
  std::vector<int64_t> hf_shape; // as config.json says
  Layout layout = Layout::kSame;
};

std::vector<int64_t> trident_shape(const TensorMap& m, const Dims& d) {
  switch (m.layout) {
    case Layout::kSame: return m.hf_shape;
    case Layout::kConv1D: return {m.hf_shape[1], m.hf_shape[0]};
    case Layout::kVocabRows: return {d.Vp, m.hf_shape[1]};
    case Layout::kPositionRows: return {d.T, m.hf_shape[1]};
  }
  return m.hf_shape;
}

// Rows [0, rows) of a row-major [*, cols] tensor into dst ([out_rows, cols]; rows beyond the source are 0).
void copy_rows(const float* src, int64_t rows, int64_t cols, float* dst, int64_t out_rows) {
  const int64_t n = std::min(rows, out_rows);
  std::memcpy(dst, src, static_cast<size_t>(n * cols) * sizeof(float));
  std::fill(dst + n * cols, dst + out_rows * cols, 0.0f);
}

void transpose(const float* src, int64_t r, int64_t c, float* dst) {
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
}

// `t` (Hugging Face layout, shape checked) into dst (trident layout, numel of trident_shape).
void to_trident(const TensorMap& m, const Dims& d, const Tensor32& t, float* dst) {
  switch (m.layout) {
    case Layout::kSame: std::memcpy(dst, t.data.data(), t.data.size() * sizeof(float)); break;
    case Layout::kConv1D: transpose(t.data.data(), t.shape[0], t.shape[1], dst); break;
    case Layout::kVocabRows: copy_rows(t.data.data(), t.shape[0], t.shape[1], dst, d.Vp); break;
    case Layout::kPositionRows: copy_rows(t.data.data(), t.shape[0], t.shape[1], dst, d.T); break;
  }
}

// `t` (trident layout, shape checked) in Hugging Face's layout.
Tensor32 to_hf(const TensorMap& m, const Tensor32& t) {
  Tensor32 out;
  out.shape = m.hf_shape;
  out.data.resize(t.data.size());
  switch (m.layout) {
    case Layout::kSame: out.data = t.data; break;
    case Layout::kConv1D: transpose(t.data.data(), t.shape[0], t.shape[1], out.data.data()); break;
    case Layout::kVocabRows:
    case Layout::kPositionRows:
      out.data.resize(static_cast<size_t>(m.hf_shape[0] * m.hf_shape[1]));
      copy_rows(t.data.data(), t.shape[0], t.shape[1], out.data.data(), m.hf_shape[0]);
      break;
  }
  return out;
}

// One architecture, declared once: how config.json maps to trident's model config and back, and every
// tensor's name, shape and layout.
struct Arch {
  const char* model_type;  // what export writes
  std::vector<std::string> reads;  // the model_type values import takes (model_type and its kin)
  const char* kind;        // trident's model kind
  const char* hf_class;    // transformers' class (config.json "architectures")
  Dims (*from_hf)(const ConfigReader& c, int block_size, int vocab_multiple, json* model_config);
  Dims (*from_trident)(const json& model_config, int64_t vocab, const std::string& where);
  json (*to_hf_config)(const json& model_config, const Dims& d, const json& recorded);
  std::vector<TensorMap> (*tensors)(const Dims& d);
  bool (*ignored)(const std::string& name, const Dims& d);  // buffers, a tied head
  std::string (*canonical)(const std::string& hf_name);     // the name a file's tensor is known by
};

// ---- Llama (LlamaForCausalLM; mistral without a short sliding window) ----

json llama_rope_scaling(const ConfigReader& c) {
  if (!c.has("rope_scaling")) return nullptr;
  const json& r = c.j.at("rope_scaling");
  if (!r.is_object()) TRIDENT_HF_REFUSE(c.where, "rope_scaling", "rope_scaling", r.dump(), "null or an object");
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  const std::string key = std::string("rope_scaling.") + type_key;
  if (!r.contains(type_key) || !r.at(type_key).is_string())
    TRIDENT_HF_REFUSE(c.where, key, key, r.value(type_key, json()).dump(), "\"llama3\"");
  const std::string type = r.at(type_key).get<std::string>();
  if (type == "default") return nullptr;  // transformers' spelling of no scaling
  if (type != "llama3")
    TRIDENT_HF_REFUSE(c.where, key, key, "\"" + type + "\"",
                      "\"llama3\" or null (trident implements no other RoPE scaling)");
  ConfigReader rr{r, c.where};
  json out = {{"rope_type", "llama3"}};
  for (const char* k : {"factor", "low_freq_factor", "high_freq_factor"}) {
    if (!rr.has(k)) TRIDENT_HF_REFUSE(c.where, std::string("rope_scaling.") + k, std::string("rope_scaling.") + k,
                                      "missing", "a positive number");
    out[k] = rr.number(k, 0);
  }
  if (!(out["low_freq_factor"].get<double>() < out["high_freq_factor"].get<double>()))
    TRIDENT_HF_REFUSE(c.where, "rope_scaling.low_freq_factor", "rope_scaling.low_freq_factor",
                      out["low_freq_factor"].dump(), "less than rope_scaling.high_freq_factor");
  out["original_max_position_embeddings"] = rr.positive("original_max_position_embeddings");
  return out;
}

Dims llama_from_hf(const ConfigReader& c, int block_size, int vocab_multiple, json* mc) {
  Dims d;
  d.C = c.positive("hidden_size");
  d.I = c.positive("intermediate_size");
  d.L = c.positive("num_hidden_layers");
  d.NH = c.positive("num_attention_heads");
  d.NKV = c.positive("num_key_value_heads", d.NH);
  d.V = c.positive("vocab_size");
  const int64_t max_pos = c.positive("max_position_embeddings", 2048);
  if (d.C % d.NH != 0)
    TRIDENT_HF_REFUSE(c.where, "hidden_size", "hidden_size", d.C,
                      fmt::format("a multiple of num_attention_heads {}", d.NH));
  if (d.NH % d.NKV != 0)
    TRIDENT_HF_REFUSE(c.where, "num_key_value_heads", "num_key_value_heads", d.NKV,
                      fmt::format("a divisor of num_attention_heads {}", d.NH));
  if (c.has("head_dim") && c.positive("head_dim") != d.C / d.NH)
    TRIDENT_HF_REFUSE(c.where, "head_dim", "head_dim", c.j.at("head_dim").dump(),
                      fmt::format("hidden_size / num_attention_heads = {} (or null)", d.C / d.NH));
  if (const std::string act = c.string("hidden_act", "silu"); act != "silu")
    TRIDENT_HF_REFUSE(c.where, "hidden_act", "hidden_act", "\"" + act + "\"", "\"silu\"");
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (c.boolean(k, false)) TRIDENT_HF_REFUSE(c.where, k, k, "true", "false (trident's Llama has no biases)");
  if (c.string("model_type", "") == "mistral") {
    // MistralConfig's default window is 4096; a window shorter than the context changes attention.
    const json w = c.j.contains("sliding_window") ? c.j.at("sliding_window") : json(4096);
    int64_t window = 0;
    if (!w.is_null() && (!json_int::to_int(w, &window) || window < max_pos))
      TRIDENT_HF_REFUSE(c.where, "sliding_window", "sliding_window", w.dump(),
                        fmt::format("null or >= max_position_embeddings {} (trident attends to the whole context)",
                                    max_pos));
  }
  d.tied = c.boolean("tie_word_embeddings", false);
  d.Vp = round_up(d.V, vocab_multiple);
  d.T = d.T_hf = block_size > 0 ? block_size : max_pos;
  *mc = {{"kind", "llama"},
         {"n_layer", d.L},
         {"n_head", d.NH},
         {"n_kv_head", d.NKV},
         {"n_embd", d.C},
         {"intermediate_size", d.I},
         {"block_size", d.T},
         {"vocab_size", d.Vp},
         {"valid_vocab_size", d.V},  // the padding rows take no probability
         {"bias", false},
         {"rope_theta", c.number("rope_theta", 10000.0)},
         {"norm_eps", c.number("rms_norm_eps", 1e-6)},
         {"rope_scaling", llama_rope_scaling(c)},
         {"tie_embeddings", d.tied}};
  return d;
}

int64_t model_int(const json& mc, const char* key, const std::string& where, std::optional<int64_t> dflt = {}) {
  ConfigReader r{mc, where + " (model config)"};
  return r.positive(key, dflt);
}

Dims llama_from_trident(const json& mc, int64_t vocab, const std::string& where) {
  Dims d;
  d.L = model_int(mc, "n_layer", where);
  d.NH = model_int(mc, "n_head", where);
  d.NKV = model_int(mc, "n_kv_head", where, d.NH);
  d.C = model_int(mc, "n_embd", where);
  d.I = model_int(mc, "intermediate_size", where);
  d.T = d.T_hf = model_int(mc, "block_size", where);
  d.Vp = model_int(mc, "vocab_size", where);
  d.V = vocab;
  d.tied = mc.value("tie_embeddings", false);
  if (mc.value("bias", false))
    TRIDENT_HF_REFUSE(where, "bias", "bias", "true", "false (LlamaForCausalLM has no biases)");
  return d;
}

json llama_to_hf_config(const json& mc, const Dims& d, const json& recorded) {
  json c = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", d.C},
            {"intermediate_size", d.I},
            {"num_hidden_layers", d.L},
            {"num_attention_heads", d.NH},
            {"num_key_value_heads", d.NKV},
            {"head_dim", d.C / d.NH},
            {"max_position_embeddings", d.T},
            {"rms_norm_eps", mc.value("norm_eps", 1e-6)},
            {"rope_theta", mc.value("rope_theta", 10000.0)},
            {"rope_scaling", mc.value("rope_scaling", json())},
            {"tie_word_embeddings", d.tied},
            {"vocab_size", d.V},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"torch_dtype", "float32"}};
  // A context trident was imported with a shorter block_size keeps the model's own.
  int64_t max_pos = 0;
  if (recorded.is_object() && recorded.contains("max_position_embeddings") &&
      json_int::to_int(recorded.at("max_position_embeddings"), &max_pos) && max_pos > d.T)
    c["max_position_embeddings"] = max_pos;
  return c;
}

std::vector<TensorMap> llama_tensors(const Dims& d) {
  const int64_t hd = d.C / d.NH;
  std::vector<TensorMap> t{{"model.embed_tokens.weight", {d.V, d.C}, Layout::kVocabRows}};
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    t.push_back({p + "input_layernorm.weight", {d.C}});
    t.push_back({p + "self_attn.q_proj.weight", {d.NH * hd, d.C}});
    t.push_back({p + "self_attn.k_proj.weight", {d.NKV * hd, d.C}});
    t.push_back({p + "self_attn.v_proj.weight", {d.NKV * hd, d.C}});
    t.push_back({p + "self_attn.o_proj.weight", {d.C, d.NH * hd}});
    t.push_back({p + "post_attention_layernorm.weight", {d.C}});
    t.push_back({p + "mlp.gate_proj.weight", {d.I, d.C}});
    t.push_back({p + "mlp.up_proj.weight", {d.I, d.C}});
    t.push_back({p + "mlp.down_proj.weight", {d.C, d.I}});
  }
  t.push_back({"model.norm.weight", {d.C}});
  if (!d.tied) t.push_back({"lm_head.weight", {d.V, d.C}, Layout::kVocabRows});
  return t;
}

// A tied file may hold lm_head.weight (save_pretrained leaves it out); older files hold RoPE's inv_freq buffers.
bool llama_ignored(const std::string& name, const Dims& d) {
  return (d.tied && name == "lm_head.weight") || ends_with(name, ".self_attn.rotary_emb.inv_freq");
}

std::string same_name(const std::string& name) { return name; }

// ---- GPT-2 (GPT2LMHeadModel) ----

Dims gpt2_from_hf(const ConfigReader& c, int block_size, int vocab_multiple, json* mc) {
  Dims d;
  d.C = c.positive("n_embd");
  d.L = c.positive("n_layer");
  d.NH = d.NKV = c.positive("n_head");
  d.V = c.positive("vocab_size");
  d.T_hf = c.positive("n_positions", c.positive("n_ctx", 1024));
  d.I = 4 * d.C;
  d.tied = true;
  if (d.C % d.NH != 0)
    TRIDENT_HF_REFUSE(c.where, "n_embd", "n_embd", d.C, fmt::format("a multiple of n_head {}", d.NH));
  if (c.has("n_inner") && c.positive("n_inner") != d.I)
    TRIDENT_HF_REFUSE(c.where, "n_inner", "n_inner", c.j.at("n_inner").dump(),
                      fmt::format("null or 4 * n_embd = {}", d.I));
  const std::string act = c.string("activation_function", "gelu_new");
  std::string gelu;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") gelu = "tanh";
  else if (act == "gelu") gelu = "exact";
  else TRIDENT_HF_REFUSE(c.where, "activation_function", "activation_function", "\"" + act + "\"",
                         "\"gelu_new\", \"gelu_pytorch_tanh\" or \"gelu\"");
  if (c.has("layer_norm_epsilon") && c.number("layer_norm_epsilon", 1e-5) != 1e-5)
    TRIDENT_HF_REFUSE(c.where, "layer_norm_epsilon", "layer_norm_epsilon", c.j.at("layer_norm_epsilon").dump(),
                      "1e-05 (trident's LayerNorm)");
  struct Flag {
    const char* key;
    bool want;
  };
  for (Flag f : {Flag{"tie_word_embeddings", true}, Flag{"scale_attn_weights", true},
                 Flag{"scale_attn_by_inverse_layer_idx", false}, Flag{"add_cross_attention", false}})
    if (c.boolean(f.key, f.want) != f.want)
      TRIDENT_HF_REFUSE(c.where, f.key, f.key, f.want ? "false" : "true", f.want ? "true" : "false");
  if (block_size > d.T_hf)
    TRIDENT_HF_REFUSE(c.where, "block_size", "block_size", block_size,
                      fmt::format("at most n_positions {} (GPT-2's positions are learned)", d.T_hf));
  d.T = block_size > 0 ? block_size : d.T_hf;
  d.Vp = round_up(d.V, vocab_multiple);
  *mc = {{"kind", "gpt"}, {"n_layer", d.L},       {"n_head", d.NH}, {"n_embd", d.C},
         {"block_size", d.T}, {"vocab_size", d.Vp}, {"valid_vocab_size", d.V}, {"bias", true}, {"gelu", gelu}};
  return d;
}

Dims gpt2_from_trident(const json& mc, int64_t vocab, const std::string& where) {
  if (mc.value("kind", "gpt") != "gpt" || !mc.value("bias", true))
    TRIDENT_HF_REFUSE(where, "bias", "the model", fmt::format("kind {} bias {}", mc.value("kind", "gpt"),
                                                              mc.value("bias", true)),
                      "a gpt with biases (GPT-2's layout)");
  Dims d;
  d.L = model_int(mc, "n_layer", where);
  d.NH = d.NKV = model_int(mc, "n_head", where);
  d.C = model_int(mc, "n_embd", where);
  d.I = 4 * d.C;
  d.T = d.T_hf = model_int(mc, "block_size", where);
  d.Vp = model_int(mc, "vocab_size", where);
  d.V = vocab;
  d.tied = true;
  return d;
}

json gpt2_to_hf_config(const json& mc, const Dims& d, const json&) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", d.V},
          {"n_positions", d.T},
          {"n_ctx", d.T},
          {"n_embd", d.C},
          {"n_layer", d.L},
          {"n_head", d.NH},
          {"n_inner", nullptr},
          {"activation_function", mc.value("gelu", "exact") == "tanh" ? "gelu_new" : "gelu"},
          {"layer_norm_epsilon", 1e-5},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

std::vector<TensorMap> gpt2_tensors(const Dims& d) {
  const int64_t C = d.C;
  std::vector<TensorMap> t{{"transformer.wte.weight", {d.V, C}, Layout::kVocabRows},
                           {"transformer.wpe.weight", {d.T_hf, C}, Layout::kPositionRows}};
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string p = fmt::format("transformer.h.{}.", l);
    t.push_back({p + "ln_1.weight", {C}});
    t.push_back({p + "ln_1.bias", {C}});
    t.push_back({p + "attn.c_attn.weight", {C, 3 * C}, Layout::kConv1D});
    t.push_back({p + "attn.c_attn.bias", {3 * C}});
    t.push_back({p + "attn.c_proj.weight", {C, C}, Layout::kConv1D});
    t.push_back({p + "attn.c_proj.bias", {C}});
    t.push_back({p + "ln_2.weight", {C}});
    t.push_back({p + "ln_2.bias", {C}});
    t.push_back({p + "mlp.c_fc.weight", {C, d.I}, Layout::kConv1D});
    t.push_back({p + "mlp.c_fc.bias", {d.I}});
    t.push_back({p + "mlp.c_proj.weight", {d.I, C}, Layout::kConv1D});
    t.push_back({p + "mlp.c_proj.bias", {C}});
  }
  t.push_back({"transformer.ln_f.weight", {C}});
  t.push_back({"transformer.ln_f.bias", {C}});
  return t;
}

// The tied head, and the causal-mask buffers h.{i}.attn.bias / h.{i}.attn.masked_bias (not attn.c_attn.bias).
bool gpt2_ignored(const std::string& name, const Dims&) {
  return name == "lm_head.weight" || ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

// GPT2Model files (the hub's model.safetensors) name their tensors without "transformer.".
std::string gpt2_canonical(const std::string& name) {
  return name.rfind("transformer.", 0) == 0 || name == "lm_head.weight" ? name : "transformer." + name;
}

const Arch kLlama{.model_type = "llama",
                  .reads = {"llama", "mistral"},
                  .kind = "llama",
                  .hf_class = "LlamaForCausalLM",
                  .from_hf = llama_from_hf,
                  .from_trident = llama_from_trident,
                  .to_hf_config = llama_to_hf_config,
                  .tensors = llama_tensors,
                  .ignored = llama_ignored,
                  .canonical = same_name};
const Arch kGpt2{.model_type = "gpt2",
                 .reads = {"gpt2"},
                 .kind = "gpt",
                 .hf_class = "GPT2LMHeadModel",
                 .from_hf = gpt2_from_hf,
                 .from_trident = gpt2_from_trident,
                 .to_hf_config = gpt2_to_hf_config,
                 .tensors = gpt2_tensors,
                 .ignored = gpt2_ignored,
                 .canonical = gpt2_canonical};

// The Hugging Face families trident reads and writes, one record each.
const Arch* const kArchs[] = {&kLlama, &kGpt2};

// config.json's model_type -> the architecture that reads it.
const Arch& arch_for_model_type(const ConfigReader& c) {
  const std::string type = c.string("model_type", "");
  for (const Arch* a : kArchs)
    for (const auto& t : a->reads)
      if (type == t) return *a;
  const std::string found = type.empty() ? "missing" : "\"" + type + "\"";
  if (type == "qwen2")
    TRIDENT_HF_REFUSE(c.where, "model_type", "model_type", found,
                      "llama, mistral or gpt2 (qwen2's q/k/v projections have biases, "
                      "model.layers.{l}.self_attn.q_proj.bias, which trident's Llama has not)");
  TRIDENT_HF_REFUSE(c.where, "model_type", "model_type", found, "llama, mistral or gpt2");
}

// A trident model config's kind -> the architecture that exports it.
const Arch& arch_for_kind(const json& mc, const std::string& where) {
  const std::string kind = mc.value("kind", "gpt");
  for (const Arch* a : kArchs)
    if (kind == a->kind) return *a;
  TRIDENT_HF_REFUSE(where, "kind", "the model kind", "\"" + kind + "\"", "llama or gpt");
}

json read_config(const std::string& dir) {
  const fs::path p = fs::path(dir) / kConfigFile;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    TRIDENT_HF_REFUSE(dir, "hf_dir", "the folder", "missing", "a Hugging Face model folder (config.json, safetensors)");
  if (!fs::is_regular_file(p, ec)) TRIDENT_HF_REFUSE(dir, kConfigFile, kConfigFile, "missing", "the model's config");
  try {
    json j = json::parse(io::read_file(p.string()));
    if (!j.is_object()) TRIDENT_HF_REFUSE(p.string(), kConfigFile, "the file", "not a JSON object", "an object");
    return j;
  } catch (const json::exception& e) {
    TRIDENT_HF_REFUSE(p.string(), kConfigFile, "the file", fmt::format("not JSON ({})", e.what()), "JSON");
  }
}

// Adds the tensors of `file` to `out` (under their canonical names); refuses a name seen twice.
void add_tensors(const Arch& a, const std::string& file, std::map<std::string, Tensor32>&& tensors,
                 std::map<std::string, Tensor32>& out) {
  for (auto& [name, t] : tensors) {
    auto [it, fresh] = out.emplace(a.canonical(name), std::move(t));
    if (!fresh) TRIDENT_HF_REFUSE(file, it->first, "tensor '" + it->first + "'", "present twice", "once");
  }
}

std::map<std::string, Tensor32> read_tensors(const std::string& dir, const Arch& a) {
  const fs::path index = fs::path(dir) / kIndexFile, single = fs::path(dir) / kSingleFile;
  std::error_code ec;
  std::map<std::string, Tensor32> out;
  if (fs::exists(index, ec)) {
    json j;
    try {
      j = json::parse(io::read_file(index.string()));
    } catch (const json::exception& e) {
      TRIDENT_HF_REFUSE(index.string(), kIndexFile, "the file", fmt::format("not JSON ({})", e.what()), "JSON");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
      TRIDENT_HF_REFUSE(index.string(), "weight_map", "weight_map",
                        j.is_object() && j.contains("weight_map") ? j.at("weight_map").dump().substr(0, 80) : "missing",
                        "an object naming each tensor's shard");
    std::map<std::string, std::set<std::string>> shards;  // shard -> the tensors the index puts there
    for (const auto& [tensor, file] : j.at("weight_map").items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos)
        TRIDENT_HF_REFUSE(index.string(), tensor, "weight_map[\"" + tensor + "\"]", file.dump(),
                          "a file name in the folder");
      const std::string f = file.get<std::string>();
      if (!fs::is_regular_file(fs::path(dir) / f, ec))
        TRIDENT_HF_REFUSE(index.string(), f, "shard '" + f + "' (of tensor '" + tensor + "')", "missing",
                          "a file in " + dir);
      shards[f].insert(tensor);
    }
    if (shards.empty()) TRIDENT_HF_REFUSE(index.string(), "weight_map", "weight_map", "empty", "its tensors");
    for (const auto& [f, names] : shards) {
      const std::string path = (fs::path(dir) / f).string();
      auto tensors = read_safetensors(path);
      for (const auto& n : names)
        if (!tensors.count(n))
          TRIDENT_HF_REFUSE(path, n, "tensor '" + n + "'", "missing", "present (" + std::string(kIndexFile) + " puts it here)");
      for (const auto& [n, t] : tensors)
        if (!names.count(n))
          TRIDENT_HF_REFUSE(path, n, "tensor '" + n + "'", "present",
                            "not in this shard (" + std::string(kIndexFile) + " does not put it here)");
      add_tensors(a, path, std::move(tensors), out);
    }
    return out;
  }
  if (!fs::exists(single, ec)) {
    const bool bin = fs::exists(fs::path(dir) / "pytorch_model.bin", ec);
    TRIDENT_HF_REFUSE(dir, kSingleFile, std::string(kSingleFile) + " (or " + kIndexFile + ")", "missing",
                      bin ? "safetensors (this folder has pytorch_model.bin, which trident does not read: convert "
                            "it with transformers' save_pretrained(safe_serialization=True))"
                          : "the model's weights in safetensors");
  }
  add_tensors(a, single.string(), read_safetensors(single.string()), out);
  return out;
}

// The tokenizer an import records when none is given: gpt2's for GPT-2; else the folder's tokenizer.model
// (SentencePiece: Llama 2; tiktoken's format: Llama 3) or tokenizer.json (Llama 3), the first that reads and
// fits the vocabulary; else byte-level, and `note` says so.
json default_tokenizer(const std::string& dir, const Arch& a, int64_t vocab, std::string* note) {
  std::vector<std::pair<std::string, std::string>> tries;  // (kind, path)
  std::error_code ec;
  if (&a == &kGpt2) tries.emplace_back("gpt2", "");
  if (fs::is_regular_file(fs::path(dir) / "tokenizer.model", ec)) {
    tries.emplace_back("sentencepiece", (fs::path(dir) / "tokenizer.model").string());
    tries.emplace_back("llama3", (fs::path(dir) / "tokenizer.model").string());
  }
  if (fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec))
    tries.emplace_back("llama3", (fs::path(dir) / "tokenizer.json").string());
  std::string why;
  for (const auto& [kind, path] : tries) {
    try {
      auto t = data::Tokenizer::create(data::parse_tokenizer_kind(kind), path);
      if (t.vocab_size() <= vocab) return t.to_json();
      why += fmt::format("{} {}: {} tokens, more than vocab_size {}; ", kind, path, t.vocab_size(), vocab);
    } catch (const Error& e) {
      why += fmt::format("{} {}: {}; ", kind, path.empty() ? "(installed)" : path, e.what());
    }
  }
  *note = fmt::format(
      "recorded the byte-level tokenizer ({}no tokenizer trident reads in {}{}): sample and eval need the model's; "
      "give it with --tokenizer KIND --tokenizer_path PATH",
      why, dir, vocab < 256 ? fmt::format("; and its 256 tokens exceed vocab_size {}", vocab) : "");
  return data::Tokenizer::byte_level().to_json();
}

// Checks `hf` against the architecture's tensors for `d` (presence, shape, no extra, finite) and writes the
// checkpoint. `where` names the source in errors.
std::string write_imported(const Arch& a, const Dims& d, const json& model_config, std::map<std::string, Tensor32>& hf,
                           const std::string& where, const std::string& out_dir, CheckpointMeta meta) {
  const auto maps = a.tensors(d);
  std::set<std::string> expected;
  size_t total = 0;
  for (const auto& m : maps) {
    expected.insert(m.name);
    auto it = hf.find(m.name);
    if (it == hf.end())
      TRIDENT_HF_REFUSE(where, m.name, "tensor '" + m.name + "'", "missing",
                        fmt::format("shape {} ({} of config.json)", shape_string(m.hf_shape), a.model_type));
    if (it->second.shape != m.hf_shape)
      TRIDENT_HF_REFUSE(where, m.name, "the shape of tensor '" + m.name + "'", shape_string(it->second.shape),
                        shape_string(m.hf_shape) + " (as config.json says)");
    total += static_cast<size_t>(numel_of(trident_shape(m, d)));
  }
  for (const auto& [name, t] : hf)
    if (!expected.count(name) && !a.ignored(name, d))
      TRIDENT_HF_REFUSE(where, name, "tensor '" + name + "'", "present",
                        fmt::format("only the tensors of a {} with this config.json", a.model_type));
  for (const auto& m : maps) {
    const auto& t = hf.at(m.name);
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        TRIDENT_HF_REFUSE(where, m.name, fmt::format("element {} of tensor '{}'", i, m.name), t.data[i],
                          "a finite value");
  }
  // An out_dir holding another run's checkpoints would lose them to retention: refused before anything is written.
  std::error_code ec;
  if (fs::is_directory(out_dir, ec))
    for (const auto& e : fs::directory_iterator(out_dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("ckpt-", 0) == 0 && n != fs::path(checkpoint_dir(out_dir, 0)).filename().string())
        TRIDENT_HF_REFUSE(out_dir, "out_dir", "the out_dir", "holding checkpoint " + n,
                          "a folder without checkpoints of other steps (an import is step 0)");
    }

  CheckpointSnapshot snap;
  snap.meta = std::move(meta);
  snap.meta.model_config = model_config;
  snap.model_kind = a.kind;
  snap.values.reserve(total);  // filled tensor by tensor while the source tensors are released
  for (const auto& m : maps) {
    nn::Parameter p;
    p.name = m.name;
    p.shape = trident_shape(m, d);
    p.numel = static_cast<size_t>(numel_of(p.shape));
    p.offset = snap.values.size();
    p.weight_decay = p.shape.size() >= 2;
    snap.values.resize(p.offset + p.numel);
    to_trident(m, d, hf.at(m.name), snap.values.data() + p.offset);
    hf.erase(m.name);
    snap.parameters.push_back(std::move(p));
  }
  return write_checkpoint(out_dir, snap, 1);
}

}  // namespace

nlohmann::json hf_to_model_config(const nlohmann::json& hf_config, int block_size, int vocab_multiple) {
  ConfigReader c{hf_config, kConfigFile};
  json mc;
  arch_for_model_type(c).from_hf(c, block_size, vocab_multiple, &mc);
  return mc;
}

std::map<std::string, Tensor32> read_hf_tensors(const std::string& dir) {
  const json config = read_config(dir);
  ConfigReader c{config, (fs::path(dir) / kConfigFile).string()};
  return read_tensors(dir, arch_for_model_type(c));
}

std::string import_hf(const HfImportOptions& o, std::string* note) {
  const json config = read_config(o.hf_dir);
  ConfigReader c{config, (fs::path(o.hf_dir) / kConfigFile).string()};
  const Arch& a = arch_for_model_type(c);
  if (o.block_size < 0) TRIDENT_HF_REFUSE(o.hf_dir, "block_size", "block_size", o.block_size, "0 or more");
  json mc;
  const Dims d = a.from_hf(c, o.block_size, o.vocab_multiple, &mc);
  auto hf = read_tensors(o.hf_dir, a);

  std::string tok_note;
  CheckpointMeta meta;
  meta.step = 0;
  meta.tokenizer = o.tokenizer.is_null() ? default_tokenizer(o.hf_dir, a, d.V, &tok_note) : o.tokenizer;
  const int tok_vocab = data::Tokenizer::from_json(meta.tokenizer).vocab_size();
  if (tok_vocab > d.V && tok_note.empty())  // the byte-level fallback is named in the note instead
    TRIDENT_HF_REFUSE(o.hf_dir, "tokenizer", "the tokenizer's vocabulary", tok_vocab,
                      fmt::format("at most config.json's vocab_size {} (is it this model's tokenizer?)", d.V));
  meta.train_config = json::object();
  meta.trainer = {{"imported_from", o.hf_dir}};
  meta.hf_config = config;
  std::string dir = write_imported(a, d, mc, hf, o.hf_dir, o.out_dir, std::move(meta));
  if (note != nullptr) *note = tok_note;
  return dir;
}

namespace {
// Tensors of `ckpt` in Hugging Face's names and layouts, cropped to `vocab` (0: the config.json recorded at
// import, else the ids the model predicts, else the tokenizer's).
std::vector<std::pair<std::string, Tensor32>> hf_tensors_of(const LoadedCheckpoint& ckpt, int vocab, const Arch& a,
                                                            Dims* dims) {
  const json& mc = ckpt.meta.model_config;
  int64_t V = vocab;
  const json& rec = ckpt.meta.hf_config;
  if (V <= 0 && rec.is_object() && rec.contains("vocab_size")) json_int::to_int(rec.at("vocab_size"), &V);
  // The ids the model predicts (a run initialised from an import keeps them, whatever its tokenizer).
  if (V <= 0 && mc.contains("valid_vocab_size")) json_int::to_int(mc.at("valid_vocab_size"), &V);
  if (V <= 0) V = data::Tokenizer::from_json(ckpt.meta.tokenizer).vocab_size();
  const Dims d = a.from_trident(mc, V, ckpt.dir);
  if (d.V > d.Vp)
    TRIDENT_HF_REFUSE(ckpt.dir, "vocab_size", "the vocabulary", d.V,
                      fmt::format("at most the model's {} rows", d.Vp));
  std::set<std::string> mapped;
  std::vector<std::pair<std::string, Tensor32>> out;
  for (const auto& m : a.tensors(d)) {
    mapped.insert(m.name);
    auto it = ckpt.weights.find(m.name);
    if (it == ckpt.weights.end())
      TRIDENT_HF_REFUSE(ckpt.dir, m.name, "tensor '" + m.name + "'", "missing",
                        "shape " + shape_string(trident_shape(m, d)) + " (as the model config says)");
    if (it->second.shape != trident_shape(m, d))
      TRIDENT_HF_REFUSE(ckpt.dir, m.name, "the shape of tensor '" + m.name + "'", shape_string(it->second.shape),
                        shape_string(trident_shape(m, d)) + " (as the model config says)");
    out.emplace_back(m.name, to_hf(m, it->second));
  }
  for (const auto& [name, t] : ckpt.weights)
    if (!mapped.count(name) && !(d.tied && name == "lm_head.weight"))
      TRIDENT_HF_REFUSE(ckpt.dir, name, "tensor '" + name + "'", "present",
                        fmt::format("only the tensors of a {} with this model config", a.model_type));
  *dims = d;
  return out;
}

void write_tensors(const std::string& path, const std::vector<std::pair<std::string, Tensor32>>& tensors,
                   int64_t step) {
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : tensors) refs.push_back({name, t.shape, t.data.data()});
  // transformers' from_pretrained wants metadata format "pt".
  write_safetensors(path, refs, {{"format", "pt"}, {"producer", "trident"}, {"step", std::to_string(step)}});
}
}  // namespace

void export_hf(const LoadedCheckpoint& ckpt, const std::string& dir, int vocab) {
  const Arch& a = arch_for_kind(ckpt.meta.model_config, ckpt.dir);
  Dims d;
  auto tensors = hf_tensors_of(ckpt, vocab, a, &d);
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kIndexFile, ec))
    TRIDENT_HF_REFUSE(dir, kIndexFile, "the export folder", "holding " + std::string(kIndexFile),
                      "a folder without a sharded model (transformers would read the shards it names)");
  fs::create_directories(dir, ec);
  if (ec) TRIDENT_THROW(IoError, "cannot create '{}': {}", dir, ec.message());
  json config = a.to_hf_config(ckpt.meta.model_config, d, ckpt.meta.hf_config);
  // Special token ids: config.json's at import, else the tokenizer's end of text.
  const json& rec = ckpt.meta.hf_config;
  bool have_ids = false;
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (rec.is_object() && rec.contains(k) && !rec.at(k).is_null()) {
      config[k] = rec.at(k);
      have_ids = true;
    }
  if (!have_ids) {
    try {
      const int32_t eot = data::Tokenizer::from_json(ckpt.meta.tokenizer).end_of_text();
      if (eot >= 0 && eot < d.V) config["bos_token_id"] = config["eos_token_id"] = eot;
    } catch (const Error&) {  // a tokenizer whose file is gone: no ids, as transformers allows
    }
  }
  write_tensors((fs::path(dir) / kSingleFile).string(), tensors, ckpt.meta.step);
  const std::string text = config.dump(2) + "\n";
  io::atomic_write_file((fs::path(dir) / kConfigFile).string(), [&](io::FileWriter& w) { w.write(text); });
}

std::string import_gpt2(const Gpt2ImportOptions& o) {
  std::map<std::string, Tensor32> hf;
  add_tensors(kGpt2, o.safetensors, read_safetensors(o.safetensors), hf);
  auto find = [&](const std::string& n) -> const Tensor32& {
    auto it = hf.find(n);
    if (it == hf.end() || it->second.shape.size() != 2)
      TRIDENT_HF_REFUSE(o.safetensors, n, "tensor '" + n + "'", it == hf.end() ? "missing" : shape_string(it->second.shape),
                        "a 2-d tensor (is it a GPT-2 state dict?)");
    return it->second;
  };
  const int64_t V = find("transformer.wte.weight").shape[0], C = find("transformer.wte.weight").shape[1];
  const int64_t T = find("transformer.wpe.weight").shape[0];
  int64_t L = 0;
  while (hf.count(fmt::format("transformer.h.{}.ln_1.weight", L))) ++L;
  int64_t n_head = o.n_head;
  if (n_head == 0) {
    for (auto [w, h] : {std::pair{768, 12}, {1024, 16}, {1280, 20}, {1600, 25}})
      if (C == w) n_head = h;
    if (n_head == 0)
      TRIDENT_HF_REFUSE(o.safetensors, "n_head", "the width", C,
                        "one of GPT-2's (768, 1024, 1280, 1600), or the number of heads given (--n_head)");
  }
  const json config = {{"model_type", "gpt2"}, {"vocab_size", V}, {"n_embd", C},
                       {"n_positions", T},     {"n_layer", L},     {"n_head", n_head}};
  ConfigReader c{config, o.safetensors};
  json mc;
  const Dims d = kGpt2.from_hf(c, 0, o.vocab_multiple, &mc);
  CheckpointMeta meta;
  meta.step = 0;
  meta.tokenizer = o.tokenizer;
  meta.train_config = json::object();
  meta.trainer = {{"imported_from", o.safetensors}};
  return write_imported(kGpt2, d, mc, hf, o.safetensors, o.out_dir, std::move(meta));
}

void export_gpt2(const LoadedCheckpoint& ckpt, const std::string& out_path, int vocab) {
  if (ckpt.meta.model_config.value("kind", "gpt") != "gpt")
    TRIDENT_HF_REFUSE(ckpt.dir, "kind", "the model kind", ckpt.meta.model_config.value("kind", "gpt"),
                      "gpt (use `trident export --hf DIR` for other models)");
  Dims d;
  auto tensors = hf_tensors_of(ckpt, vocab, kGpt2, &d);
  for (const auto& [name, t] : tensors)
    if (name == "transformer.wte.weight") {
      Tensor32 head = t;
      tensors.emplace_back("lm_head.weight", std::move(head));
      break;
    }
  write_tensors(out_path, tensors, ckpt.meta.step);
}

}  // namespace trident::train
