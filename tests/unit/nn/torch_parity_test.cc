// The GPT agrees with nanoGPT's model.py built in PyTorch (float64) from trident's weights: logits, loss
// and every gradient to 1e-4 relative. Skipped when /usr/bin/python3 cannot import torch
// (a failure under CI=true: harness/skip.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <unistd.h>

#include "harness/skip.h"
#include "trident/nn/models.h"

namespace {

bool have_torch() { return std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") == 0; }

double rel_err(const float* got, const double* want, size_t n) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

}  // namespace

TEST(TorchParity, GptLogitsLossAndGradientsMatchPyTorch) {
  if (!have_torch()) TRIDENT_SKIP_MISSING("/usr/bin/python3 has no torch (apt-get install python3-torch)");
  for (std::string gelu : {"exact", "tanh"}) {
    nlohmann::json cfg = {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 8},
                          {"vocab_size", 13}, {"bias", gelu == "exact"}, {"gelu", gelu}, {"seed", 11}};
    auto m = trident::nn::make_model(cfg);
    std::mt19937_64 g(5);
    std::normal_distribution<float> nd(0.0f, 0.2f);
    for (const auto& p : m->parameters())
      for (size_t i = 0; i < p.numel; ++i) m->param_data()[p.offset + i] += nd(g);
    const int B = 2, T = 8, V = 13;
    std::vector<int32_t> x(B * T), y(B * T);
    for (int i = 0; i < B * T; ++i) x[i] = static_cast<int32_t>(g() % V), y[i] = static_cast<int32_t>(g() % V);

    const auto dir = std::filesystem::temp_directory_path() / ("trident_torch_parity_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    nlohmann::json meta = {{"config", m->config()}, {"B", B}, {"T", T}, {"inputs", x}, {"targets", y}};
    std::ofstream pb(dir / "params.bin", std::ios::binary);
    for (const auto& p : m->parameters()) {
      meta["params"].push_back({{"name", p.name}, {"shape", p.shape}});
      pb.write(reinterpret_cast<const char*>(m->param_data() + p.offset), p.numel * sizeof(float));
    }
    pb.close();
    std::ofstream(dir / "meta.json") << meta.dump();
    const std::string cmd = "/usr/bin/python3 " TRIDENT_SOURCE_DIR "/tests/unit/nn/torch_parity.py " + dir.string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

    std::ifstream ob(dir / "out.bin", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(ob)), std::istreambuf_iterator<char>());
    ob.close();
    std::filesystem::remove_all(dir);
    std::vector<double> ref(bytes.size() / sizeof(double));
    std::memcpy(ref.data(), bytes.data(), ref.size() * sizeof(double));
    size_t want = static_cast<size_t>(B) * T * V + 1;
    for (const auto& p : m->parameters()) want += p.numel;
    ASSERT_EQ(ref.size(), want);

    std::vector<float> logits(B * T * V);
    m->forward_logits(x.data(), B, T, logits.data());
    EXPECT_LT(rel_err(logits.data(), ref.data(), logits.size()), 1e-4) << gelu;
    m->zero_grad();
    const float loss = m->forward_backward(x.data(), y.data(), B, T, true);
    const double ref_loss = ref[logits.size()];
    EXPECT_LT(std::abs(loss - ref_loss) / ref_loss, 1e-4) << gelu;
    size_t off = logits.size() + 1;
    for (const auto& p : m->parameters()) {
      EXPECT_LT(rel_err(m->grad_data() + p.offset, ref.data() + off, p.numel), 1e-4) << p.name << " " << gelu;
      off += p.numel;
    }
  }
}
