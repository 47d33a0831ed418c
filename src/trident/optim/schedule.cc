#include "trident/optim/schedule.h"

#include <cmath>

#include "trident/kernels/cpu/ops.h"

namespace trident::optim {

float lr_at(int it, int warmup_iters, int lr_decay_iters, float lr, float min_lr) {
  // nanoGPT train.py get_lr().
  if (it < warmup_iters) return lr * static_cast<float>(it + 1) / static_cast<float>(warmup_iters + 1);
  if (it > lr_decay_iters) return min_lr;
  if (lr_decay_iters <= warmup_iters) return min_lr;
  const double ratio = static_cast<double>(it - warmup_iters) / static_cast<double>(lr_decay_iters - warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return static_cast<float>(min_lr + coeff * (static_cast<double>(lr) - min_lr));
}

double grad_norm_squared(const float* grads, size_t n) {
  return kernels::cpu::sum_squares(grads, n);
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

float clip_grad_norm(float* grads, size_t n, float max_norm) {
  return clip_grad_norm(kernels::device_ops(kernels::Device::kCpu), grads, n, max_norm);
}

float clip_grad_norm(const kernels::DeviceOps& ops, float* grads, size_t n, float max_norm) {
  const double norm = std::sqrt(ops.sum_squares(grads, n));
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0f) ops.scale_inplace(grads, coef, n);
  return static_cast<float>(norm);
}

}  // namespace trident::optim
