// LanguageModel: the single-process model of any architecture (nn/arch/; see models.h for the config and
// model.h for the interface). It registers every parameter its architecture declares, whole, initialises
// them (the architecture's init, each tensor from its own seeded stream: flat_model.h), and runs the whole
// model as ONE LayerRange (nn/layer_range.h: the driver pipeline stages run too) at TP = 1 with one
// microbatch in flight.
//
// Blocks: 0 is the embedding, 1..n_layer the layers, n_layer+1 the final norm and the head. Hooks fire in
// descending parameter index order: the untied head, the final norm, then each layer's own, then the
// embedding's (the tied head's gradient is final only after the embedding's). Activation checkpointing keeps only each block's input
// and recomputes the block inside backward into one shared activation set.
// Ownership, blocking, thread-safety: as FlatModel (one thread at a time; buffers on the model's device).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "trident/nn/flat_model.h"
#include "trident/nn/layer_range.h"
#include "trident/nn/model_spec.h"

namespace trident::nn {

class LanguageModel final : public FlatModel {
 public:
  // initialize = false: the parameters stay zero until initialize_range() (model.h: deferred initialization).
  explicit LanguageModel(ModelConfig c, bool initialize = true);

  float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                         float loss_scale) override;
  void forward_logits(const int32_t* inputs, int B, int T, float* logits) override;
  // Block 0: the embedding (wte, wpe); blocks 1..n_layer: the layers; block n_layer+1: ln_f and the head
  // (wte when tied, so wte belongs to the first and the last block).
  std::vector<Block> blocks() const override;

 private:
  LayerEnv env();

  ParamIndex ix_;
  std::unique_ptr<LayerRange> range_;
  LayerActs workspace_;  // the layers' and the driver's backward scratch
};

}  // namespace trident::nn
