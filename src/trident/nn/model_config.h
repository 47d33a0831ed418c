// The configuration of one of trident's language models: the keys nn::make_model reads (nn/models.h), their
// defaults, their validation, and the JSON a checkpoint stores. One struct for every architecture; what an
// architecture makes of it (which keys it uses, their defaults where the JSON leaves them out, its rules)
// is its descriptor's (nn/arch/architecture.h), looked up by `kind`.
//
// Keys (JSON; unknown keys and bad values throw InvalidArgument naming the key and what is allowed):
//   kind "gpt" | "llama" | "mlp" (default "gpt"): the architecture;
//   n_layer (4), n_head (4), n_embd (128), block_size (64), vocab_size (required), valid_vocab_size (0:
//     vocab_size; below it, the ids above are padding whose logits are -inf);
//   n_kv_head (0 = n_head): key/value heads of grouped-query attention (llama; must divide n_head);
//   intermediate_size (0 = the architecture's: gpt 4 n_embd, llama ~8/3 n_embd rounded up to 32);
//   bias (false, as nanoGPT's train.py; GPT-2's checkpoints and catalog shapes set true; llama: false only),
//   dropout (0.0; > 0 is refused: not implemented),
//   gelu "exact" | "tanh" (gpt, mlp), norm_eps (1e-5: LayerNorm's or RMSNorm's epsilon),
//   rope_theta (10000), rope_scaling (null or {"rope_type": "llama3", "factor", "low_freq_factor",
//     "high_freq_factor", "original_max_position_embeddings"}: Llama 3.1's; other types are refused by name),
//   tie_embeddings (unset: the architecture's; gpt: true only; llama: false; mlp: true),
//   activation_checkpointing (false), seed (1337),
//   dtype "float32" | "bfloat16" (also "fp32", "bf16"): precision of the GEMM operands, float32
//     accumulation; master weights, gradients and optimizer state stay float32,
//   device "cpu" | "cuda" (cpu): where the flat buffers live and the kernels run (kernels/device.h); not
//     echoed by to_json(), so checkpoints stay device-independent.
// to_json() holds every key with its resolved value, enough to rebuild the model.
//
// The defaults are the one set every part of trident starts from (`trident train`'s too: train::TrainConfig
// holds a ModelConfig): nanoGPT's shakespeare_char configuration in its CPU form, a model that trains on a
// CPU in minutes.
//
// Ownership: value type. Thread-safety: no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/device.h"

namespace trident::nn {

struct ModelConfig {
  std::string kind = "gpt";
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 0;  // 0 = n_head
  int n_embd = 128;
  int intermediate_size = 0;  // 0 = the architecture's default (resolved by from_json)
  int block_size = 64;
  int vocab_size = 0;
  // Ids [valid_vocab_size, vocab_size) are padding rows (a vocabulary rounded up for the GPU or for tensor
  // parallelism): never targets, never predicted (their logits are -inf). 0 = vocab_size (no padding).
  int valid_vocab_size = 0;
  bool bias = false;
  double dropout = 0.0;
  std::string gelu = "exact";
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  nlohmann::json rope_scaling;  // null, or Llama 3.1's scaling (see above)
  bool activation_checkpointing = false;
  uint64_t seed = 1337;
  std::string dtype = "float32";
  // Unset: the architecture's (resolved by from_json, so a resolved config always holds a value).
  std::optional<bool> tie_embeddings;
  // cpu | cuda: where the buffers live and the kernels run. Not part of to_json() (nor of a model's
  // config(), nor so of checkpoints): it says where a model runs, not what it is.
  std::string device = "cpu";

  // Reads and validates (the architecture's rules included); keys left out take the architecture's defaults.
  static ModelConfig from_json(const nlohmann::json& j);
  // Every key set (tie_embeddings only once resolved), device included when `with_device`.
  nlohmann::json to_json(bool with_device = false) const;
  // This config with the architecture's defaults filled in and its rules checked (from_json of to_json).
  ModelConfig resolved() const;

  bool tied() const { return tie_embeddings.value_or(true); }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
  kernels::cpu::GeluKind gelu_kind() const;
  kernels::cpu::Precision precision() const;
  kernels::Device device_kind() const { return kernels::parse_device(device); }
};

// The keys ModelConfig::from_json understands (a trainer can pick these out of its full config).
const std::vector<std::string>& model_config_keys();

}  // namespace trident::nn
