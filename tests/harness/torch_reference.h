// A model against a PyTorch reference program run on its weights: the reference (a script taking a folder)
// reads DIR/meta.json ({config, B, T, inputs, targets, params: [{name, shape}]}) and DIR/params.bin (float32,
// parameter order) and writes DIR/out.bin (little-endian float64: logits [B*T*V], the mean loss, then each
// parameter's gradient in parameter order). expect_matches_torch runs it and compares logits, loss and every
// gradient at relative tolerance `tol` (max |got - want| / max |want| per tensor). With accum = k > 1, trident
// takes the batch as k micro-batches of B/k rows, each loss scaled by 1/k and the gradients accumulated (the
// trainer's gradient accumulation), while the reference takes all B rows at once. Scripts:
// tests/unit/nn/torch_parity.py (nanoGPT's GPT), tests/unit/nn/llama_torch.py (Hugging Face's Llama).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trident/nn/model.h"

namespace trident::testing {

inline bool have_torch() { return std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") == 0; }

inline double rel_err(const float* got, const double* want, size_t n) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

inline void expect_matches_torch(nn::Model& m, const std::string& script, int B, int T,
                                 const std::vector<int32_t>& x, const std::vector<int32_t>& y, double tol,
                                 const std::string& what, int accum = 1) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(accum >= 1 && B % accum == 0) << B << " rows do not split into " << accum << " micro-batches";
  const int V = m.config()["vocab_size"];
  const auto dir = std::filesystem::temp_directory_path() / ("trident_torch_ref_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nlohmann::json meta = {{"config", m.config()}, {"B", B}, {"T", T}, {"inputs", x}, {"targets", y}};
  std::vector<float> host(m.num_params());
  std::memcpy(host.data(), m.param_data(), host.size() * sizeof(float));  // CPU models
  {
    std::ofstream pb(dir / "params.bin", std::ios::binary);
    for (const auto& p : m.parameters()) {
      meta["params"].push_back({{"name", p.name}, {"shape", p.shape}});
      pb.write(reinterpret_cast<const char*>(host.data() + p.offset), static_cast<std::streamsize>(p.numel * 4));
    }
  }
  std::ofstream(dir / "meta.json") << meta.dump();
  const std::string cmd = "/usr/bin/python3 " + script + " " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream ob(dir / "out.bin", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(ob)), std::istreambuf_iterator<char>());
  ob.close();
  std::filesystem::remove_all(dir);
  std::vector<double> ref(bytes.size() / sizeof(double));
  std::memcpy(ref.data(), bytes.data(), ref.size() * sizeof(double));
  size_t want = static_cast<size_t>(B) * T * V + 1;
  for (const auto& p : m.parameters()) want += p.numel;
  ASSERT_EQ(ref.size(), want);

  std::vector<float> logits(static_cast<size_t>(B) * T * V);
  m.forward_logits(x.data(), B, T, logits.data());
  EXPECT_LT(rel_err(logits.data(), ref.data(), logits.size()), tol) << "logits";
  m.zero_grad();
  const int rows = B / accum;
  const size_t per = static_cast<size_t>(rows) * T;
  double loss = 0;
  for (int k = 0; k < accum; ++k)
    loss += m.forward_backward(x.data() + k * per, y.data() + k * per, rows, T, true, 1.0f / static_cast<float>(accum));
  loss /= accum;
  const double ref_loss = ref[logits.size()];
  EXPECT_LT(std::abs(loss - ref_loss) / ref_loss, tol) << "loss " << loss << " vs " << ref_loss;
  size_t off = logits.size() + 1;
  for (const auto& p : m.parameters()) {
    EXPECT_LT(rel_err(m.grad_data() + p.offset, ref.data() + off, p.numel), tol) << p.name;
    off += p.numel;
  }
}

}  // namespace trident::testing
