// Model factory: builds a GPT or a deep MLP from a JSON config (see model.h for the interface).
//
// Config keys (all optional except vocab_size; unknown keys and bad values throw InvalidArgument naming
// the key and what is allowed):
//   kind "gpt" | "mlp" (default "gpt"); n_layer (6), n_head (6), n_embd (384), block_size (256),
//   vocab_size (required), bias (true), dropout (0.0; > 0 is refused: not implemented),
//   gelu "exact" | "tanh" (exact = nn.GELU()), activation_checkpointing (false), seed (1337),
//   dtype "float32" | "bfloat16" (also "fp32", "bf16"): precision of the GEMM operands, float32
//     accumulation; master weights, gradients and optimizer state stay float32. Uses cblas_sbgemm where
//     OpenBLAS has it; Debian's OpenBLAS 0.3.21 lacks it, so there the operands are rounded to bfloat16
//     and multiplied by sgemm: bfloat16 numerics, but no speed-up (about 15% slower than float32),
//   tie_embeddings (true; mlp only: false gives it a separate lm_head.weight).
//   device "cpu" | "cuda" (cpu): where the flat buffers live and the kernels run (kernels/device.h); cuda
//     throws kernels::DeviceUnavailable when this build has no CUDA or no GPU is visible. Not echoed by
//     config(): checkpoints stay device-independent.
// The returned model's config() holds every key with its resolved value, enough to rebuild it.
// Ownership: the caller owns the model. Thread-safety: a model is used from one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/nn/model.h"

namespace trident::nn {

// The keys make_model understands (a trainer can pick these out of its full config).
const std::vector<std::string>& model_config_keys();

std::unique_ptr<Model> make_model(const nlohmann::json& config);

}  // namespace trident::nn
