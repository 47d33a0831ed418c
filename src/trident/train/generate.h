// Autoregressive sampling from a model (nanoGPT's sample.py / GPT.generate): crop the context to
// block_size, take the last position's logits, divide by temperature, keep the top_k, softmax, draw.
// temperature 0 picks the argmax. Draws come from a counter-based Rng seeded with `seed`, so the same
// model, prompt and seed give the same text.
//
// Ownership: borrows the model. Blocking: runs max_new_tokens forward passes on the calling thread.
// Thread-safety: one thread per model.
#pragma once

#include <cstdint>
#include <vector>

#include "trident/nn/model.h"

namespace trident::train {

struct GenerateOptions {
  int max_new_tokens = 200;
  double temperature = 0.8;
  int top_k = 200;  // 0 = all
  uint64_t seed = 1337;
};

// Returns the context followed by the new tokens.
std::vector<int32_t> generate(nn::Model& model, int block_size, int vocab_size, std::vector<int32_t> context,
                              const GenerateOptions& opts);

// One draw from logits[vocab] (exposed for tests): temperature, top-k, softmax, inverse CDF at u in [0,1).
int32_t sample_logits(const float* logits, int vocab_size, double temperature, int top_k, double u);

}  // namespace trident::train
