#include "trident/nn/models.h"

#include "trident/nn/flat_model.h"

namespace trident::nn {

std::unique_ptr<Model> make_gpt(const ModelConfig& c);
std::unique_ptr<Model> make_mlp(const ModelConfig& c);

std::unique_ptr<Model> make_model(const nlohmann::json& config) {
  const ModelConfig c = ModelConfig::from_json(config);
  if (c.kind == "mlp") return make_mlp(c);
  return make_gpt(c);
}

}  // namespace trident::nn
