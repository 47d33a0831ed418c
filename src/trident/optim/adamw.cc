#include "trident/optim/adamw.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "trident/core/error.h"

namespace trident::optim {

AdamW::AdamW(nn::Model& model, AdamWConfig config)
    : model_(model), config_(config), ops_(&kernels::device_ops(model.device())) {
  // The moments are created (as zeros) by the first step, or filled by load_state(): a trainer whose
  // data-parallel wrapper keeps its own sharded state never holds a full copy.
  TRIDENT_CHECK(config.beta1 >= 0 && config.beta1 < 1, InvalidArgument, "AdamW: beta1 {} must be in [0, 1)",
                config.beta1);
  TRIDENT_CHECK(config.beta2 >= 0 && config.beta2 < 1, InvalidArgument, "AdamW: beta2 {} must be in [0, 1)",
                config.beta2);
  TRIDENT_CHECK(config.eps > 0, InvalidArgument, "AdamW: eps {} must be > 0", config.eps);
  TRIDENT_CHECK(config.weight_decay >= 0, InvalidArgument, "AdamW: weight_decay {} must be >= 0",
                config.weight_decay);
  std::vector<uint8_t> mask(model.num_params(), 0);
  for (const auto& p : model.parameters())
    if (p.weight_decay) std::fill(mask.begin() + p.offset, mask.begin() + p.offset + p.numel, 1);
  for (size_t i = 0; i < mask.size();) {
    size_t j = i;
    while (j < mask.size() && mask[j] == mask[i]) ++j;
    segments_.push_back({i, j, mask[i] != 0});
    i = j;
  }
}

void AdamW::step(float lr) { step_range(lr, 0, model_.num_params()); }

void AdamW::step_range(float lr, size_t begin, size_t end) {
  TRIDENT_CHECK(begin <= end && end <= model_.num_params(), InvalidArgument,
                "AdamW::step_range: [{}, {}) is outside the {} parameters", begin, end, model_.num_params());
  float* m = nullptr;
  float* v = nullptr;
  if (on_host()) {
    if (exp_avg_.size() != model_.num_params()) {  // before the first step, or after release_state()
      exp_avg_.assign(model_.num_params(), 0.0f);
      exp_avg_sq_.assign(model_.num_params(), 0.0f);
    }
    m = exp_avg_.data();
    v = exp_avg_sq_.data();
  } else {
    if (dev_m_.size() != model_.num_params()) {  // before the first step, or after release_state()
      dev_m_ = kernels::DeviceArray<float>(*ops_, model_.num_params());
      dev_v_ = kernels::DeviceArray<float>(*ops_, model_.num_params());
    }
    m = dev_m_.data();
    v = dev_v_.data();
  }
  ++step_;
  float* p = model_.param_data();
  const float* g = model_.grad_data();
  // Each run of equal decay flag, clipped to [begin, end), is one kernel call.
  for (const auto& s : segments_) {
    const size_t i = std::max(s.begin, begin), j = std::min(s.end, end);
    if (i >= j) continue;
    const float decay = s.decay ? config_.weight_decay : 0.0f;
    if (config_.offload)
      offloaded_adamw_update(*ops_, p + i, g + i, m + i, v + i, j - i, lr, config_.beta1, config_.beta2, config_.eps,
                             decay, step_, config_.offload_chunk);
    else
      ops_->adamw_update(p + i, g + i, m + i, v + i, j - i, lr, config_.beta1, config_.beta2, config_.eps, decay,
                         step_);
  }
}

void offloaded_adamw_update(const kernels::DeviceOps& device, float* p, const float* g, float* m, float* v, size_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                            size_t chunk) {
  TRIDENT_CHECK(chunk > 0, InvalidArgument, "offloaded_adamw_update: chunk must be > 0");
  const kernels::DeviceOps& cpu = kernels::device_ops(kernels::Device::kCpu);
  // Staging for one chunk of parameters and gradients, kept by the thread between steps.
  thread_local std::vector<float> hp, hg;
  const size_t w = std::min(chunk, n);
  if (hp.size() < w) {
    hp.resize(w);
    hg.resize(w);
  }
  for (size_t o = 0; o < n; o += chunk) {
    const size_t k = std::min(chunk, n - o);
    device.to_host(hp.data(), p + o, k * sizeof(float));
    device.to_host(hg.data(), g + o, k * sizeof(float));
    cpu.adamw_update(hp.data(), hg.data(), m + o, v + o, k, lr, beta1, beta2, eps, weight_decay, t);
    device.to_device(p + o, hp.data(), k * sizeof(float));
  }
}

void AdamW::load_state(std::vector<float> exp_avg, std::vector<float> exp_avg_sq, int64_t step) {
  TRIDENT_CHECK(exp_avg.size() == model_.num_params() && exp_avg_sq.size() == model_.num_params(), InvalidArgument,
                "AdamW::load_state: state has {} / {} elements but the model has {}; the checkpoint belongs to a "
                "different model",
                exp_avg.size(), exp_avg_sq.size(), model_.num_params());
  TRIDENT_CHECK(step >= 0, InvalidArgument, "AdamW::load_state: negative step count {}", step);
  exp_avg_ = std::move(exp_avg);
  exp_avg_sq_ = std::move(exp_avg_sq);
  step_ = step;
  if (!on_host()) {
    dev_m_ = kernels::DeviceArray<float>(*ops_, exp_avg_.size());
    dev_v_ = kernels::DeviceArray<float>(*ops_, exp_avg_.size());
    ops_->to_device(dev_m_.data(), exp_avg_.data(), exp_avg_.size() * sizeof(float));
    ops_->to_device(dev_v_.data(), exp_avg_sq_.data(), exp_avg_sq_.size() * sizeof(float));
  }
}

void AdamW::sync_state_to_host() {
  if (!has_state()) {  // no step yet: the state a fresh optimizer stands for is zeros
    exp_avg_.assign(model_.num_params(), 0.0f);
    exp_avg_sq_.assign(model_.num_params(), 0.0f);
    return;
  }
  if (on_host()) return;
  exp_avg_.resize(dev_m_.size());
  exp_avg_sq_.resize(dev_v_.size());
  ops_->to_host(exp_avg_.data(), dev_m_.data(), dev_m_.size() * sizeof(float));
  ops_->to_host(exp_avg_sq_.data(), dev_v_.data(), dev_v_.size() * sizeof(float));
}

void AdamW::release_state() {
  std::vector<float>().swap(exp_avg_);
  std::vector<float>().swap(exp_avg_sq_);
  dev_m_.reset();
  dev_v_.reset();
}

}  // namespace trident::optim
