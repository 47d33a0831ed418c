// Learning-rate schedule and gradient clipping (nanoGPT's train.py).
// Pure functions: no ownership, no blocking, thread-safe.
#pragma once

#include <cstddef>

#include "trident/kernels/device.h"

namespace trident::optim {

// nanoGPT's get_lr: linear warmup for `warmup_iters` steps ((it+1)/(warmup_iters+1) * lr), then cosine
// decay from lr to min_lr until lr_decay_iters, then min_lr.
float lr_at(int it, int warmup_iters, int lr_decay_iters, float lr, float min_lr);

// The one clipping rule, torch.nn.utils.clip_grad_norm_'s: the factor gradients of global L2 norm `norm`
// are scaled by, min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off). Every clipping
// site (this file, DataParallel, the model-parallel trainer) scales by it.
float clip_coefficient(double norm, double max_norm);

// Global L2 norm of grads[0..n) (accumulated in double); scales the gradients by
// clip_coefficient(norm, max_norm) when that is below 1. Returns the pre-clip norm.
float clip_grad_norm(float* grads, size_t n, float max_norm);
// The same on memory of the device `ops` belongs to (kernels/device.h).
float clip_grad_norm(const kernels::DeviceOps& ops, float* grads, size_t n, float max_norm);
// The global L2 norm alone (for logging, or to combine shard norms).
double grad_norm_squared(const float* grads, size_t n);

}  // namespace trident::optim
