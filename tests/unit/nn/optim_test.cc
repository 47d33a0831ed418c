// AdamW against a hand-computed float64 reference, the learning-rate schedule and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "trident/core/error.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/nn/models.h"
#include "trident/optim/adamw.h"
#include "trident/optim/schedule.h"

namespace {

nlohmann::json tiny() {
  return {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}, {"block_size", 4}, {"vocab_size", 7}, {"seed", 3}};
}

}  // namespace

TEST(AdamW, KernelMatchesHandComputedSteps) {
  // Three steps of PyTorch AdamW on 3 elements, computed in double from the formulas.
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  double p[3] = {0.5, -1.0, 2.0}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
  float pf[3] = {0.5f, -1.0f, 2.0f}, mf[3] = {0, 0, 0}, vf[3] = {0, 0, 0};
  const double grads[3][3] = {{0.1, -0.2, 0.3}, {0.05, 0.0, -0.4}, {-0.3, 0.2, 0.1}};
  for (int t = 1; t <= 3; ++t) {
    float gf[3];
    for (int i = 0; i < 3; ++i) {
      const double g = grads[t - 1][i];
      gf[i] = static_cast<float>(g);
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    trident::kernels::cpu::adamw_update(pf, gf, mf, vf, 3, lr, b1, b2, eps, wd, t);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(pf[i], p[i], 1e-6) << "step " << t << " element " << i;
      EXPECT_NEAR(mf[i], m[i], 1e-7);
      EXPECT_NEAR(vf[i], v[i], 1e-8);
    }
    // The first step moves each element with a nonzero gradient by lr against the gradient's sign.
    if (t == 1) {
      EXPECT_NEAR(pf[0], 0.5 * (1 - lr * wd) - lr, 1e-6);
    }
  }
}

TEST(AdamW, DecaysOnlyTwoDimensionalWeightsAndKeepsState) {
  auto m = trident::nn::make_model(tiny());
  std::vector<float> before(m->param_data(), m->param_data() + m->num_params());
  trident::optim::AdamW opt(*m, {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f});
  m->zero_grad();  // zero gradients: the update is weight decay alone
  opt.step(0.1f);
  EXPECT_EQ(opt.step_count(), 1);
  for (const auto& p : m->parameters())
    for (size_t i = 0; i < p.numel; ++i) {
      const float want = p.weight_decay ? before[p.offset + i] * (1.0f - 0.1f * 0.5f) : before[p.offset + i];
      ASSERT_EQ(m->param_data()[p.offset + i], want) << p.name;
    }
  // Save and restore the state into a second optimizer on a copy: the next steps agree bit for bit.
  auto m2 = trident::nn::make_model(tiny());
  std::memcpy(m2->param_data(), m->param_data(), m->num_params() * sizeof(float));
  auto x = std::vector<int32_t>{1, 2, 3, 4, 5, 6, 0, 1}, y = std::vector<int32_t>{2, 3, 4, 5, 6, 0, 1, 2};
  m->zero_grad();
  m->forward_backward(x.data(), y.data(), 2, 4, true);
  opt.step(0.1f);
  trident::optim::AdamW opt2(*m2, opt.config());
  EXPECT_THROW(opt2.load_state(std::vector<float>(3), std::vector<float>(3), 1), trident::InvalidArgument);
  // Rebuild opt2's state as it was after one step: replay from the same start.
  auto m3 = trident::nn::make_model(tiny());
  trident::optim::AdamW opt3(*m3, opt.config());
  m3->zero_grad();
  opt3.step(0.1f);
  opt2.load_state(opt3.exp_avg(), opt3.exp_avg_sq(), opt3.step_count());
  m2->zero_grad();
  m2->forward_backward(x.data(), y.data(), 2, 4, true);
  opt2.step(0.1f);
  EXPECT_EQ(opt2.step_count(), 2);
  EXPECT_EQ(0, std::memcmp(m->param_data(), m2->param_data(), m->num_params() * sizeof(float)));
  EXPECT_EQ(opt.exp_avg(), opt2.exp_avg());
}

// Optimizer offload: the moments in host memory and the update on the CPU's kernel, through copies in chunks.
// On the CPU the copies are plain ones, so every step must be the in-place update's bit for bit: a chunk
// boundary off by one, a segment's decay flag or a moment offset would show.
TEST(AdamW, OffloadedUpdateIsTheKernelsBitForBit) {
  const auto& cpu = trident::kernels::device_ops(trident::kernels::Device::kCpu);
  const size_t n = 53;
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.3f * i);
    g[i] = std::cos(0.7f * i) * 0.1f;
  }
  auto p2 = p, m2 = m, v2 = v;
  for (int t = 1; t <= 3; ++t) {
    trident::kernels::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    trident::optim::offloaded_adamw_update(cpu, p2.data(), g.data(), m2.data(), v2.data(), n, 0.01f, 0.9f, 0.95f,
                                           1e-8f, 0.1f, t, /*chunk=*/7);  // 53 = 7 x 7 + 4
  }
  EXPECT_EQ(0, std::memcmp(p.data(), p2.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m.data(), m2.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v.data(), v2.data(), n * sizeof(float)));
  EXPECT_THROW(trident::optim::offloaded_adamw_update(cpu, p2.data(), g.data(), m2.data(), v2.data(), n, 0.01f, 0.9f,
                                                      0.95f, 1e-8f, 0.1f, 4, 0),
               trident::InvalidArgument);
}

TEST(AdamW, OffloadKeepsTheStateOnTheHostAndStepsAsWithout) {
  auto a = trident::nn::make_model(tiny());
  auto b = trident::nn::make_model(tiny());
  const trident::optim::AdamWConfig in_place{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                             .weight_decay = 0.5f};
  trident::optim::AdamWConfig offloaded = in_place;
  offloaded.offload = true;
  trident::optim::AdamW oa(*a, in_place), ob(*b, offloaded);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < a->num_params(); ++i) a->grad_data()[i] = b->grad_data()[i] = std::sin(0.1f * i + step);
    if (step < 2) {
      oa.step(0.05f);
      ob.step(0.05f);
    } else {  // a ZeRO-style range across a decay boundary
      oa.step_range(0.05f, 3, a->num_params() - 5);
      ob.step_range(0.05f, 3, b->num_params() - 5);
    }
  }
  EXPECT_EQ(0, std::memcmp(a->param_data(), b->param_data(), a->num_params() * sizeof(float)));
  ASSERT_EQ(ob.exp_avg().size(), b->num_params());  // the host vectors are the state itself
  EXPECT_EQ(oa.exp_avg(), ob.exp_avg());
  EXPECT_EQ(oa.exp_avg_sq(), ob.exp_avg_sq());
  ob.sync_state_to_host();  // a no-op for host state
  EXPECT_EQ(oa.exp_avg(), ob.exp_avg());
  // Loaded state is used as it is.
  std::vector<float> m(b->num_params(), 0.25f), v(b->num_params(), 0.5f);
  ob.load_state(m, v, 7);
  EXPECT_EQ(ob.exp_avg(), m);
  EXPECT_EQ(ob.step_count(), 7);
}

TEST(Schedule, WarmupThenCosineAsNanoGpt) {
  using trident::optim::lr_at;
  EXPECT_FLOAT_EQ(lr_at(0, 100, 2000, 1e-3f, 1e-4f), 1e-3f * 1 / 101);
  EXPECT_FLOAT_EQ(lr_at(99, 100, 2000, 1e-3f, 1e-4f), 1e-3f * 100 / 101);
  EXPECT_FLOAT_EQ(lr_at(100, 100, 2000, 1e-3f, 1e-4f), 1e-3f);
  EXPECT_FLOAT_EQ(lr_at(1050, 100, 2000, 1e-3f, 1e-4f), 5.5e-4f);  // halfway: min + 0.5 (max - min)
  // A quarter of the way: coeff = 0.5 (1 + cos(pi/4)).
  EXPECT_NEAR(lr_at(575, 100, 2000, 1e-3f, 1e-4f), 1e-4 + 0.5 * (1 + std::sqrt(0.5)) * 9e-4, 1e-9);
  EXPECT_FLOAT_EQ(lr_at(2000, 100, 2000, 1e-3f, 1e-4f), 1e-4f);
  EXPECT_FLOAT_EQ(lr_at(5000, 100, 2000, 1e-3f, 1e-4f), 1e-4f);
  EXPECT_FLOAT_EQ(lr_at(0, 0, 10, 1.0f, 0.0f), 1.0f);
}

TEST(Clip, GlobalNormClippingAsTorch) {
  std::vector<float> g = {3.0f, 4.0f, 0.0f};
  EXPECT_FLOAT_EQ(trident::optim::clip_grad_norm(g.data(), g.size(), 10.0f), 5.0f);
  EXPECT_EQ(g, (std::vector<float>{3.0f, 4.0f, 0.0f}));  // below the limit: untouched
  EXPECT_FLOAT_EQ(trident::optim::clip_grad_norm(g.data(), g.size(), 1.0f), 5.0f);
  EXPECT_NEAR(g[0], 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(g[1], 4.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(std::sqrt(trident::optim::grad_norm_squared(g.data(), g.size())), 1.0, 1e-6);
  std::vector<float> z = {0.0f, 0.0f};
  EXPECT_EQ(trident::optim::clip_grad_norm(z.data(), z.size(), 1.0f), 0.0f);
  // max_norm 0 disables clipping but still reports the norm.
  std::vector<float> h = {6.0f, 8.0f};
  EXPECT_FLOAT_EQ(trident::optim::clip_grad_norm(h.data(), h.size(), 0.0f), 10.0f);
  EXPECT_EQ(h[0], 6.0f);
}

// The one clipping rule every site scales by: min(1, max_norm / (norm + 1e-6)), 1 when clipping is off.
TEST(Clip, CoefficientIsTorchsClampedRatio) {
  using trident::optim::clip_coefficient;
  EXPECT_EQ(clip_coefficient(5.0, 10.0), 1.0f);  // below the limit: no scaling
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0f);   // zero gradients: no division by zero
  EXPECT_EQ(clip_coefficient(5.0, 0.0), 1.0f);   // max_norm 0 turns clipping off
  EXPECT_EQ(clip_coefficient(5.0, -1.0), 1.0f);
  // Above the limit: the ratio, with torch's 1e-6 in the denominator (so a norm equal to the limit still
  // scales by slightly less than 1, as torch does).
  EXPECT_EQ(clip_coefficient(5.0, 1.0), static_cast<float>(1.0 / (5.0 + 1e-6)));
  EXPECT_EQ(clip_coefficient(400.0, 1.0), static_cast<float>(1.0 / (400.0 + 1e-6)));
  EXPECT_LT(clip_coefficient(1.0, 1.0), 1.0f);
  EXPECT_GT(clip_coefficient(1.0, 1.0), 0.999998f);
  // clip_grad_norm scales by exactly this factor.
  std::vector<float> g = {30.0f, 40.0f};
  const float coef = clip_coefficient(50.0, 2.0);
  trident::optim::clip_grad_norm(g.data(), g.size(), 2.0f);
  EXPECT_EQ(g[0], 30.0f * coef);
  EXPECT_EQ(g[1], 40.0f * coef);
}
