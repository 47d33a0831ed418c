// AdamW with PyTorch / nanoGPT semantics over a Model's flat parameter and gradient buffers.
//
// Ownership: AdamW keeps a reference to the Model (which must outlive it) and owns its state: two flat
// float32 buffers (exp_avg, exp_avg_sq) with the model's flat layout, created as zeros by the first step
// (or filled by load_state()), and the step count.
// Parameter groups as nanoGPT's configure_optimizers: weight decay only on parameters with
// Parameter::weight_decay (tensors with >= 2 dims); biases and LayerNorm weights get none.
// Update per element (t = step count after increment):
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//   p -= lr*wd*p   (decoupled decay, only in the decay group)
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// Device: the update runs through the op table of the model's device (kernels/device.h). On a device
// other than the CPU the moments live in device memory; exp_avg()/exp_avg_sq() are host copies that
// sync_state_to_host() refreshes (call it before saving them) and load_state() uploads.
// Optimizer offload (AdamWConfig::offload, ZeRO-Offload): the moments live in host memory whatever the
// device (exp_avg()/exp_avg_sq() are the state itself), and each step copies the parameters and gradients
// to the host in chunks, updates them with the CPU's AdamW kernel and copies the parameters back
// (offloaded_adamw_update). The device then holds parameters and gradients only: 8 of the 16 bytes per
// parameter that training keeps. Under data parallelism the same config makes each rank offload its own
// shard (parallel/dp_storage.h); with tensor/pipeline parallelism each rank's AdamW covers its own slices.
// Blocking: step() runs on the calling thread. Not thread-safe. No timeouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trident/kernels/device.h"
#include "trident/nn/model.h"

namespace trident::optim {

struct AdamWConfig {
  float lr = 6e-4f;  // default lr; step(lr) takes the scheduled value
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  bool offload = false;  // moments in host memory, the update on the CPU (see above)
  // With offload: elements per host copy of parameters and gradients (a testability knob: small values
  // make small tests cross chunk ends).
  size_t offload_chunk = size_t{1} << 20;
};

// One AdamW update (decay `weight_decay`, step count t) of n elements whose parameters p and gradients g live
// on `device` and whose moments m, v live in host memory: p and g go to the host `chunk` elements at a time,
// the CPU kernel updates them, p comes back. On the CPU the copies are plain copies, so the result is the
// CPU kernel's bit for bit. Blocks until the parameters are back on the device.
void offloaded_adamw_update(const kernels::DeviceOps& device, float* p, const float* g, float* m, float* v, size_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                            size_t chunk = size_t{1} << 20);

class AdamW {
 public:
  AdamW(nn::Model& model, AdamWConfig config);

  // One update of every parameter from the model's current gradients, with learning rate `lr`.
  void step(float lr);
  // As step(lr), over the element range [begin, end) of the flat buffers only (ZeRO shards); the step
  // count advances once per call of step() or step_range().
  void step_range(float lr, size_t begin, size_t end);

  const AdamWConfig& config() const { return config_; }
  // Checkpoint state: the flat moment buffers (num_params() elements each, model layout) and step count.
  std::vector<float>& exp_avg() { return exp_avg_; }
  std::vector<float>& exp_avg_sq() { return exp_avg_sq_; }
  const std::vector<float>& exp_avg() const { return exp_avg_; }
  const std::vector<float>& exp_avg_sq() const { return exp_avg_sq_; }
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  // Restores the state; throws InvalidArgument when the sizes do not match the model.
  // Takes the vectors by value: pass them with std::move to hand over large state without a copy.
  void load_state(std::vector<float> exp_avg, std::vector<float> exp_avg_sq, int64_t step);
  // Frees the moment buffers (for a trainer whose data-parallel wrapper keeps its own, sharded, state):
  // exp_avg()/exp_avg_sq() are then empty until step()/step_range() re-creates them as zeros or
  // load_state() refills them. The step count is kept.
  void release_state();
  // Copies device moments into exp_avg()/exp_avg_sq() (no-op on the CPU, where they are the state); before
  // any step (no state yet) fills both with zeros, a fresh optimizer's state, for a checkpoint.
  void sync_state_to_host();
  bool has_state() const { return !exp_avg_.empty() || dev_m_.size() > 0 || model_.num_params() == 0; }

 private:
  // Where the moments live: host memory on the CPU, and with offload on any device.
  bool on_host() const { return ops_->device == kernels::Device::kCpu || config_.offload; }

  nn::Model& model_;
  AdamWConfig config_;
  const kernels::DeviceOps* ops_;
  kernels::DeviceArray<float> dev_m_, dev_v_;  // the moments on a device other than the CPU
  std::vector<float> exp_avg_;
  std::vector<float> exp_avg_sq_;
  struct Segment {
    size_t begin, end;
    bool decay;
  };
  std::vector<Segment> segments_;  // the flat buffer as runs of equal decay flag (padding: no decay)
  int64_t step_ = 0;
};

}  // namespace trident::optim
