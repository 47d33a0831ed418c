// DataParallel's storage policies: what the parameters and gradients are between uses, and the AdamW
// state each rank keeps for the pieces it owns (parallel/dp_sharding.h says which pieces).
//   Fp32Storage  float32 parameters are their own master weights; gradients are reduced in float32 from
//                the model's gradient buffer (zero2/zero3: into a float32 gradient shard; zero3 keeps a
//                float32 parameter shard).
//   Bf16Storage  bfloat16 parameters and gradients, float32 master weights and moments for the owned
//                pieces (PyTorch FSDP's MixedPrecision with param_dtype = reduce_dtype = bfloat16,
//                DeepSpeed's bf16 mode). A ready bucket's float32 gradients are rounded to bf16 (round to
//                nearest even): ddp/zero1 into the persistent bf16 gradient buffer (then all-reduced in
//                place), zero2/zero3 in place into the first half of the bucket's float32 range (then
//                reduce-scattered into the bf16 shard); the float32 pages then go back. AdamW runs on the
//                float32 master with fp32(bf16 grad) x clip coefficient and rounds the result to bf16.
// Every buffer lives on the model's device (kernels::DeviceArray) and every copy, conversion and
// elementwise kernel goes through its DeviceOps, so one policy serves the CPU and CUDA. The registered
// (shm) gradient buffer exists only on the CPU.
// Optimizer offload (AdamWConfig::offload, ZeRO-Offload): the AdamW moments and, with bfloat16 storage,
// the float32 master weights of this rank's owned pieces live in host memory instead (the CPU table's
// allocations; state_ops() is the table of the memory they are in). The update copies the owned pieces'
// gradients (and float32 parameters, which are their own master) to the host in chunks, runs the CPU's
// AdamW kernel there and copies the new stored parameters back; the device keeps parameters and
// gradients only. The same kernels on the same values: the result is bit for bit the one without offload
// wherever the device's kernels are the CPU's.
//
// Ownership: borrows the DpContext; owns its buffers. Thread-safety: the training loop's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/dtype.h"
#include "trident/kernels/device.h"
#include "trident/optim/adamw.h"
#include "trident/parallel/dp_sharding.h"

namespace trident::parallel {

// Persistent bytes held per category on this rank.
struct MemoryReport {
  // On the model's device: parameters, gradients, optimizer_state, master_weights, comm_buffers.
  std::map<std::string, double> bytes;
  // In host memory because of optimizer offload: optimizer_state, master_weights (empty without offload).
  std::map<std::string, double> host_bytes;
  double total() const;  // of `bytes`: the device's
  double host_total() const;
  // bytes + host_bytes per category: what the process holds wherever it lives (on the CPU, all of it is RAM).
  std::map<std::string, double> merged() const;
};

namespace detail {
// n elements of T in the device's memory (assign) or in a fresh registered buffer of at least n elements
// (assign_shared, CPU only, which reads as zeros; a null buffer returns false and changes nothing).
template <class T>
class GradientArray {
 public:
  void assign(const kernels::DeviceOps& ops, size_t n) {
    shm_.reset();
    own_ = kernels::DeviceArray<T>(ops, n);
    p_ = own_.data();
    n_ = n;
  }
  bool assign_shared(std::shared_ptr<RegisteredBuffer> b, size_t n) {
    if (!b) return false;
    own_.reset();
    shm_ = std::move(b);
    p_ = static_cast<T*>(shm_->data());
    n_ = n;
    return true;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  kernels::DeviceArray<T> own_;
  std::shared_ptr<RegisteredBuffer> shm_;
  T* p_ = nullptr;
  size_t n_ = 0;
};
}  // namespace detail

class StoragePolicy {
 public:
  StoragePolicy(detail::DpContext& c, const optim::AdamWConfig& adamw);
  virtual ~StoragePolicy() = default;

  virtual DType dtype() const = 0;  // of the stored parameters and gradients, and of their collectives
  size_t elem() const { return dtype_size(dtype()); }

  // Sizes every buffer for `s` (after its layout()). `shared` is the group's registered memory for the
  // gradients that are reduced (or null); returns whether the reduced gradients live there.
  virtual bool allocate(const ShardingStrategy& s, const std::function<std::shared_ptr<RegisteredBuffer>(size_t)>& shared) = 0;

  // A ready bucket's collective source. ddp/zero1: the bucket's range of the full reduced gradients (may
  // release the model's float32 pages: sets b.grads_released). zero2/zero3: world x piece elements whose
  // first L are unit ui's gradients and the rest zero or already-reduced lanes of a higher unit.
  virtual void* all_reduce_source(GradBucket& b) = 0;
  virtual void* reduce_scatter_source(size_t ui, const ShardUnit& u) = 0;
  virtual void* full_grads() = 0;  // ddp/zero1: the reduced gradients (n elements)
  virtual void* grad_shard() = 0;  // zero2/zero3: the gradient shard (shard_numel elements)
  // Squared L2 norm of `count` stored gradient elements at g.
  virtual double sum_squares(const void* g, size_t count) = 0;
  // Scales the reduced gradients by coef (1: none) now (float32) or in the next update (bfloat16).
  virtual void clip(float coef) = 0;

  // The stored parameters: whole (ddp/zero1/zero2; capacity in elements) or this rank's shard (zero3).
  virtual void* params_full() = 0;
  virtual size_t params_full_capacity() const = 0;
  virtual void* params_shard() = 0;
  // AdamW on one owned piece (step count step()); the new stored values go to `out` (elements of
  // dtype(); may be where the piece's master already is, i.e. in place).
  virtual void update(const OwnedPiece& p, void* out, float lr) = 0;
  // The model's float32 buffer -> the stored parameters (and master weights) of `s`.
  virtual void take_params(const ShardingStrategy& s) = 0;
  // bf16: float32 master of the owned pieces (state_numel elements); null for float32.
  virtual float* master() { return nullptr; }
  // zero3: where unit u's gathered elements land in the model's buffer, and what turns them into float32
  // parameters there; local materialisation of [b, e) from the stored full parameters (bf16 ddp/zero1/zero2).
  virtual void* param_gather_dst(const ShardUnit& u) = 0;
  virtual void after_param_gather(size_t b, size_t e) { (void)b, (void)e; }
  virtual void materialize(size_t b, size_t e) { (void)b, (void)e; }

  // Bytes held (gathered: float32 parameter elements materialised in the model's buffer now) / resident.
  virtual void memory(MemoryReport& m, double gathered) const = 0;
  virtual void resident(MemoryReport& m) const = 0;

  float* exp_avg() { return exp_avg_.data(); }
  float* exp_avg_sq() { return exp_avg_sq_.data(); }
  int64_t& step() { return step_; }
  // Optimizer offload: the moments (and master weights) are in host memory (see the header comment).
  bool offloaded() const { return adamw_.offload; }
  // The table of the memory the moments and master weights live in: the CPU's when offloaded, else the
  // model's device's.
  const kernels::DeviceOps& state_ops() const;

 protected:
  void allocate_moments(size_t count);
  // AdamW over `count` float32 elements whose flat indices start at flat_begin (decay flag per flat run),
  // all four arrays in the memory of `ops`.
  void adamw_range(const kernels::DeviceOps& ops, float* p, const float* g, float* m, float* v, size_t flat_begin,
                   size_t count, float lr);
  // The same with p and g on the model's device and m, v in host memory (offload): chunked copies
  // through optim::offloaded_adamw_update.
  void offloaded_adamw_range(float* p, const float* g, float* m, float* v, size_t flat_begin, size_t count, float lr);

  detail::DpContext& c_;
  optim::AdamWConfig adamw_;
  kernels::DeviceArray<float> exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
  bool sharded_grads_ = false, sharded_params_ = false;

 private:
  struct Segment {
    size_t begin, end;
    bool decay;
  };
  // The decay runs of [flat_begin, flat_begin + count): fn(offset from flat_begin, length, weight decay).
  template <class Fn>
  void for_each_decay_run(size_t flat_begin, size_t count, Fn&& fn) const;
  std::vector<Segment> decay_segments_;  // the flat buffer as runs of equal decay flag
};

std::unique_ptr<StoragePolicy> make_storage(DType dtype, detail::DpContext& c, const optim::AdamWConfig& adamw);

}  // namespace trident::parallel
