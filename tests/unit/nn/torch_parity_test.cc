// The GPT agrees with nanoGPT's model.py built in PyTorch (float64) from trident's weights: logits, loss
// and every gradient to 1e-4 relative, also when trident accumulates the gradient over micro-batches of the
// batch PyTorch takes at once. Skipped when /usr/bin/python3 cannot import torch
// (a failure under CI=true: harness/skip.h).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "harness/skip.h"
#include "harness/torch_reference.h"
#include "trident/nn/models.h"

TEST(TorchParity, GptLogitsLossAndGradientsMatchPyTorch) {
  if (!trident::testing::have_torch())
    TRIDENT_SKIP_MISSING("/usr/bin/python3 has no torch (apt-get install python3-torch)");
  for (std::string gelu : {"exact", "tanh"}) {
    nlohmann::json cfg = {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 8},
                          {"vocab_size", 13}, {"bias", gelu == "exact"}, {"gelu", gelu}, {"seed", 11}};
    auto m = trident::nn::make_model(cfg);
    std::mt19937_64 g(5);
    std::normal_distribution<float> nd(0.0f, 0.2f);
    for (const auto& p : m->parameters())
      for (size_t i = 0; i < p.numel; ++i) m->param_data()[p.offset + i] += nd(g);
    const int accum = gelu == "exact" ? 1 : 2, B = 2 * accum, T = 8, V = 13;
    std::vector<int32_t> x(B * T), y(B * T);
    for (int i = 0; i < B * T; ++i) x[i] = static_cast<int32_t>(g() % V), y[i] = static_cast<int32_t>(g() % V);

    trident::testing::expect_matches_torch(*m, TRIDENT_SOURCE_DIR "/tests/unit/nn/torch_parity.py", B, T, x, y, 1e-4,
                                           "gelu " + gelu + (accum > 1 ? ", gradients accumulated over 2 micro-batches" : ""), accum);
  }
}
