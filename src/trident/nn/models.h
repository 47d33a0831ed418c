// Model factory: builds a model of any of trident's architectures (the GPT-2 family, the Llama family, the
// deep MLP: nn/arch/) from a JSON config (see model.h for the interface). The keys, their defaults and
// their validation are nn/model_config.h's; unknown keys and bad values throw InvalidArgument naming the key
// and what is allowed. device "cuda" throws kernels::DeviceUnavailable when this build has no CUDA or no GPU
// is visible. The returned model's config() holds every key with its resolved value, enough to rebuild it.
// Ownership: the caller owns the model. Thread-safety: a model is used from one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/nn/model.h"
#include "trident/nn/model_config.h"

namespace trident::nn {

// initialize = false builds the model without drawing its initial values (model.h: deferred initialization).
std::unique_ptr<Model> make_model(const nlohmann::json& config, bool initialize = true);

}  // namespace trident::nn
