#include "trident/nn/model_config.h"

#include <cmath>

#include <fmt/ranges.h>

#include "trident/core/error.h"
#include "trident/core/json_int.h"
#include "trident/nn/arch/architecture.h"

namespace trident::nn {

const std::vector<std::string>& model_config_keys() {
  static const std::vector<std::string> keys = {
      "kind",      "n_layer",    "n_head",       "n_kv_head", "n_embd",       "intermediate_size",
      "block_size", "vocab_size", "valid_vocab_size", "bias",         "dropout",   "gelu",         "norm_eps",
      "rope_theta", "rope_scaling", "activation_checkpointing", "seed", "dtype", "tie_embeddings", "device"};
  return keys;
}

namespace {

int get_int(const nlohmann::json& j, const char* key, int fallback, int min_value) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  // A whole float (12.0) is accepted; it is range-checked before the cast (1e300 would be undefined).
  const bool whole_float = v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
                           std::fabs(v.get<double>()) <= static_cast<double>(int64_t{1} << 30);
  int64_t x = 0;
  TRIDENT_CHECK(json_int::to_int(v, &x) || whole_float, InvalidArgument,
                "model config: '{}' must be an integer >= {}, got {}", key, min_value, v.dump());
  if (whole_float) x = static_cast<int64_t>(v.get<double>());
  TRIDENT_CHECK(x >= min_value && x <= (int64_t{1} << 30), InvalidArgument,
                "model config: '{}' must be an integer >= {}, got {}", key, min_value, x);
  return static_cast<int>(x);
}

bool get_bool(const nlohmann::json& j, const char* key, bool fallback) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)) return v.get<int64_t>() == 1;
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (s == "true" || s == "True" || s == "1") return true;
    if (s == "false" || s == "False" || s == "0") return false;
  }
  TRIDENT_THROW(InvalidArgument, "model config: '{}' must be true or false, got {}", key, v.dump());
}

double get_positive(const nlohmann::json& j, const char* key, double fallback) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  TRIDENT_CHECK(v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>()), InvalidArgument,
                "model config: '{}' must be a number > 0, got {}", key, v.dump());
  return v.get<double>();
}

std::string get_choice(const nlohmann::json& j, const char* key, const std::string& fallback,
                       const std::vector<std::string>& allowed) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    for (const auto& a : allowed)
      if (s == a) return s;
  }
  TRIDENT_THROW(InvalidArgument, "model config: '{}' must be one of {}, got {}", key, fmt::join(allowed, "|"),
                v.dump());
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  TRIDENT_CHECK(j.is_object(), InvalidArgument, "model config must be a JSON object, got {}", j.dump());
  const auto& keys = model_config_keys();
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const auto& k : keys) known = known || k == it.key();
    TRIDENT_CHECK(known, InvalidArgument, "model config: unknown key '{}'; allowed keys: {}", it.key(),
                  fmt::join(keys, ", "));
  }
  ModelConfig c;
  c.kind = get_choice(j, "kind", c.kind, architecture_kinds());
  c.n_layer = get_int(j, "n_layer", c.n_layer, 0);
  c.n_head = get_int(j, "n_head", c.n_head, 1);
  c.n_kv_head = get_int(j, "n_kv_head", c.n_kv_head, 0);
  c.n_embd = get_int(j, "n_embd", c.n_embd, 1);
  c.intermediate_size = get_int(j, "intermediate_size", c.intermediate_size, 0);
  c.norm_eps = get_positive(j, "norm_eps", c.norm_eps);
  c.rope_theta = get_positive(j, "rope_theta", c.rope_theta);
  if (j.contains("rope_scaling")) c.rope_scaling = j.at("rope_scaling");
  c.block_size = get_int(j, "block_size", c.block_size, 1);
  TRIDENT_CHECK(j.contains("vocab_size"), InvalidArgument,
                "model config: 'vocab_size' is required (the tokenizer's vocabulary size)");
  c.vocab_size = get_int(j, "vocab_size", 0, 1);
  c.valid_vocab_size = get_int(j, "valid_vocab_size", 0, 0);
  TRIDENT_CHECK(c.valid_vocab_size <= c.vocab_size, InvalidArgument,
                "model config: valid_vocab_size {} exceeds vocab_size {} (the padded vocabulary it is part of)",
                c.valid_vocab_size, c.vocab_size);
  if (c.valid_vocab_size == c.vocab_size) c.valid_vocab_size = 0;
  c.bias = get_bool(j, "bias", c.bias);
  if (j.contains("dropout")) {
    const auto& v = j.at("dropout");
    TRIDENT_CHECK(v.is_number(), InvalidArgument, "model config: 'dropout' must be a number in [0, 1), got {}",
                  v.dump());
    c.dropout = v.get<double>();
    TRIDENT_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, InvalidArgument,
                  "model config: 'dropout' must be in [0, 1), got {}", c.dropout);
    TRIDENT_CHECK(c.dropout == 0.0, InvalidArgument,
                  "model config: dropout {} > 0 is not implemented in trident's models; set dropout to 0",
                  c.dropout);
  }
  c.gelu = get_choice(j, "gelu", c.gelu, {"exact", "tanh"});
  c.activation_checkpointing = get_bool(j, "activation_checkpointing", c.activation_checkpointing);
  if (j.contains("seed")) {
    const auto& v = j.at("seed");
    TRIDENT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, InvalidArgument,
                  "model config: 'seed' must be a non-negative integer, got {}", v.dump());
    c.seed = v.get<uint64_t>();
  }
  if (j.contains("dtype")) {
    std::string d = j.at("dtype").is_string() ? j.at("dtype").get<std::string>() : "";
    if (d == "bf16") d = "bfloat16";
    if (d == "fp32" || d == "f32") d = "float32";
    nlohmann::json norm = {{"dtype", d.empty() ? j.at("dtype") : nlohmann::json(d)}};
    c.dtype = get_choice(norm, "dtype", c.dtype, {"float32", "bfloat16"});
  }
  if (j.contains("tie_embeddings")) c.tie_embeddings = get_bool(j, "tie_embeddings", false);
  c.device = get_choice(j, "device", c.device, {"cpu", "cuda"});
  architecture(c.kind).resolve(c);
  return c;
}

ModelConfig ModelConfig::resolved() const { return from_json(to_json(true)); }

nlohmann::json ModelConfig::to_json(bool with_device) const {
  nlohmann::json j = {{"kind", kind},
          {"n_layer", n_layer},
          {"n_head", n_head},
          {"n_kv_head", n_kv_head},
          {"n_embd", n_embd},
          {"intermediate_size", intermediate_size},
          {"norm_eps", norm_eps},
          {"rope_theta", rope_theta},
          {"rope_scaling", rope_scaling},
          {"block_size", block_size},
          {"vocab_size", vocab_size},
          {"valid_vocab_size", valid_vocab_size},
          {"bias", bias},
          {"dropout", dropout},
          {"gelu", gelu},
          {"activation_checkpointing", activation_checkpointing},
          {"seed", seed},
          {"dtype", dtype}};
  if (tie_embeddings) j["tie_embeddings"] = *tie_embeddings;
  if (with_device) j["device"] = device;
  return j;
}

kernels::cpu::GeluKind ModelConfig::gelu_kind() const {
  return gelu == "tanh" ? kernels::cpu::GeluKind::kTanh : kernels::cpu::GeluKind::kExact;
}
kernels::cpu::Precision ModelConfig::precision() const {
  return dtype == "bfloat16" ? kernels::cpu::Precision::kBFloat16 : kernels::cpu::Precision::kFloat32;
}

}  // namespace trident::nn
