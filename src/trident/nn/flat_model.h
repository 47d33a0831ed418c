// Shared machinery of trident's models (internal to nn/): parameter registration into
// one flat 64-byte-aligned buffer, seeded initialization, and the grad-ready hook.
//
// Initialization (bit-reproducible across runs and machines with the same libm): each tensor draws from its
// own std::mt19937_64, seeded with config.seed mixed with the tensor's name (init_slice), in row-major order;
// each normal draw is Box-Muller on two 53-bit uniforms u1 in (0,1], u2 in [0,1): sqrt(-2 ln u1) *
// cos(2 pi u2) (the sine half is discarded), computed in double and scaled by the std. So a tensor's values
// do not depend on which other tensors a model holds: a tensor/pipeline shard initializes only its own
// slices and holds what the single-process model holds there, without ever building the whole model.
// Device: the flat buffers and activations live in the memory of config.device ("cpu" | "cuda"),
// allocated through that device's op table (kernels/device.h), and every kernel call goes through the
// table. Initial values are drawn on the host (into the buffer itself on the CPU, into a host staging
// copy uploaded by finish_init() elsewhere), so a model's initial weights are the same on every device.
// Ownership: the model owns its buffers. Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "trident/kernels/aligned.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/device.h"
#include "trident/nn/model.h"
#include "trident/nn/model_config.h"

namespace trident::nn {

struct LayerEnv;
struct ParamDecl;

// The initial values of declaration d of a model seeded with `seed` (N(0, d.init^2) or the constant d.init,
// from an RNG seeded by seed and d.name), restricted to the rows `rows` ((first, count) pairs, in order) and
// columns [col0, col0 + ncols) of the tensor viewed as [shape[0], numel / shape[0]], written densely into dst.
// Draws every element up to the last row kept (so a slice equals the same slice of the whole tensor) but
// holds one row at a time.
void init_slice(const ParamDecl& d, uint64_t seed, const std::vector<std::pair<int64_t, int64_t>>& rows,
                int64_t col0, int64_t ncols, float* dst);

class FlatModel : public Model {
 public:
  // Throws kernels::DeviceUnavailable when config.device cannot be used here.
  // initialize = false: init_param() only records each tensor's recipe; initialize_range() draws on demand.
  explicit FlatModel(ModelConfig config, bool initialize = true)
      : cfg_(std::move(config)), ops_(&kernels::device_ops(cfg_.device_kind())), initialize_(initialize) {}

  const std::vector<Parameter>& parameters() const override { return params_; }
  float* param_data() override { return values_.data(); }
  float* grad_data() override { return grads_; }
  size_t num_params() const override { return values_.size(); }
  kernels::Device device() const override { return ops_->device; }
  void zero_grad() override;
  void set_grad_ready_hook(GradReadyHook hook) override { hook_ = std::move(hook); }
  nlohmann::json config() const override { return cfg_.to_json(); }
  std::string kind() const override { return cfg_.kind; }
  void set_block_hook(BlockHook hook) override { block_hook_ = std::move(hook); }
  void set_zero_grad_releases_pages(bool release) override { release_on_zero_ = release; }
  bool adopt_grad_storage(float* storage, std::shared_ptr<void> owner) override;
  bool initialized() const override { return initialize_; }
  void initialize_range(size_t begin, size_t end) override;

 protected:
  friend struct LayerEnv;  // the layers (nn/layers.h) read parameters and fire hooks through it
  // Registers a parameter (shape in PyTorch layout) and returns its index.
  int add_param(std::string name, std::vector<int64_t> shape);
  // Allocates the flat buffers (zero-filled) after all add_param calls.
  void finalize_params();
  // Fills parameter idx with the rows `rows` ((first, count) pairs, in order) and columns [col0, col0 + ncols)
  // of declaration d's initial values (init_slice); then finish_init() once, after the last one.
  void init_param(int idx, const ParamDecl& d, const std::vector<std::pair<int64_t, int64_t>>& rows, int64_t col0,
                  int64_t ncols);
  void finish_init();
  // Host memory the init_* calls write parameter idx into (the buffer itself on the CPU).
  float* init_target(int idx);
  const kernels::DeviceOps& ops() const { return *ops_; }
  // Resizes an activation buffer to n floats of this model's device (zero-filled when it reallocates).
  float* resize_buffer(kernels::DeviceArray<float>& buf, size_t n) {
    buf.resize(*ops_, n);
    return buf.data();
  }
  // Tokens on this model's device: `host` itself on the CPU, else a copy in `buf`.
  const int32_t* on_device(kernels::DeviceArray<int32_t>& buf, const int32_t* host, size_t n) {
    if (ops_->device == kernels::Device::kCpu) return host;
    if (buf.size() < n) buf.resize(*ops_, n);
    ops_->to_device(buf.data(), host, n * sizeof(int32_t));
    return buf.data();
  }

  float* P(int idx) { return idx < 0 ? nullptr : values_.data() + params_[idx].offset; }
  float* G(int idx) { return idx < 0 ? nullptr : grads_ + params_[idx].offset; }
  void fire(int idx) {
    if (idx >= 0 && hook_) hook_(static_cast<size_t>(idx));
  }
  void check_batch(const int32_t* inputs, int B, int T) const;
  void block_event(int block, BlockEvent e) {
    if (block_hook_) block_hook_(block, e);
  }

  ModelConfig cfg_;
  const kernels::DeviceOps* ops_;
  std::vector<Parameter> params_;
  kernels::DeviceArray<float> values_;
  kernels::DeviceArray<float> grad_store_;  // the gradients, unless adopt_grad_storage() moved them
  kernels::AlignedFloats init_staging_;     // host copy being initialised (devices other than the CPU)
  kernels::DeviceArray<int32_t> inputs_, targets_;  // device copies of the batch (devices other than the CPU)
  float* grads_ = nullptr;             // grad_store_.data() or the adopted storage
  std::shared_ptr<void> grad_owner_;   // keeps adopted storage alive
  GradReadyHook hook_;
  BlockHook block_hook_;
  bool release_on_zero_ = false;
  // What init_param() was asked for, per parameter (the slice of its declaration this model holds), so that
  // initialize_range() can draw any part later.
  struct InitRecipe {
    std::shared_ptr<const ParamDecl> decl;
    std::vector<std::pair<int64_t, int64_t>> rows;
    int64_t col0 = 0, ncols = 0;
  };
  std::vector<InitRecipe> recipes_;
  bool initialize_ = true;
};

// Page-level memory helpers (used by ZeRO to free and to measure memory honestly).
// Hands the whole pages inside [p, p + n) back to the OS (madvise: MADV_DONTNEED on private anonymous
// memory, MADV_REMOVE on shared memory such as a registered gradient buffer: either way they read back as
// zero and stop counting as resident); the partial pages at either end are left untouched. Returns the
// bytes released. Throws IoError when madvise fails.
size_t release_pages(float* p, size_t n);
// Bytes of the pages touching [p, p + bytes) that are resident in RAM now (mincore), counting a partial
// page at either end in full.
size_t resident_bytes(const void* p, size_t bytes);

// Resizes buf to at least n floats (never shrinks).
inline float* ensure_size(kernels::AlignedFloats& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace trident::nn
