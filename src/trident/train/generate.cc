#include "trident/train/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "trident/core/error.h"
#include "trident/data/rng.h"
#include "trident/data/sampler.h"

namespace trident::train {

int32_t sample_logits(const float* logits, int V, double temperature, int top_k, double u) {
  if (temperature <= 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<double> z(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) z[i] = static_cast<double>(logits[i]) / temperature;
  if (top_k > 0 && top_k < V) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    double kth = sorted[static_cast<size_t>(top_k - 1)];
    for (auto& v : z) {
      if (v < kth) v = -std::numeric_limits<double>::infinity();
    }
  }
  double mx = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (auto& v : z) sum += (v = std::exp(v - mx));
  double target = u * sum, acc = 0;
  int32_t last = 0;
  for (int i = 0; i < V; ++i) {
    if (z[i] <= 0) continue;
    acc += z[i];
    last = i;
    if (target < acc) return i;
  }
  return last;
}

std::vector<int32_t> generate(nn::Model& model, int block_size, int vocab_size, std::vector<int32_t> context,
                              const GenerateOptions& opts) {
  TRIDENT_CHECK(!context.empty(), InvalidArgument, "generate: the prompt must have at least one token");
  data::Rng rng(opts.seed, data::kStreamGenerate);
  std::vector<float> logits;
  for (int n = 0; n < opts.max_new_tokens; ++n) {
    int T = static_cast<int>(std::min<size_t>(context.size(), static_cast<size_t>(block_size)));
    const int32_t* ctx = context.data() + (context.size() - static_cast<size_t>(T));
    logits.resize(static_cast<size_t>(T) * vocab_size);
    model.forward_logits(ctx, 1, T, logits.data());
    const float* last = logits.data() + static_cast<size_t>(T - 1) * vocab_size;
    context.push_back(sample_logits(last, vocab_size, opts.temperature, opts.top_k, rng.next_double()));
  }
  return context;
}

}  // namespace trident::train
