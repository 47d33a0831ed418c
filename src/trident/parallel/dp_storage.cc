#include "trident/parallel/dp_storage.h"

#include <algorithm>

#include "trident/core/error.h"
#include "trident/nn/flat_model.h"

namespace trident::parallel {

double MemoryReport::total() const {
  double t = 0;
  for (auto& [k, v] : bytes) t += v;
  return t;
}

std::map<std::string, double> MemoryReport::merged() const {
  std::map<std::string, double> m = bytes;
  for (const auto& [k, v] : host_bytes) m[k] += v;
  return m;
}

double MemoryReport::host_total() const {
  double t = 0;
  for (auto& [k, v] : host_bytes) t += v;
  return t;
}

StoragePolicy::StoragePolicy(detail::DpContext& c, const optim::AdamWConfig& adamw) : c_(c), adamw_(adamw) {
  const auto& params = c_.model.parameters();
  std::vector<uint8_t> mask(c_.n, 0);
  for (const auto& p : params)
    if (p.weight_decay) std::fill(mask.begin() + p.offset, mask.begin() + p.offset + p.numel, 1);
  for (size_t i = 0; i < c_.n;) {
    size_t j = i;
    while (j < c_.n && mask[j] == mask[i]) ++j;
    decay_segments_.push_back({i, j, mask[i] != 0});
    i = j;
  }
}

const kernels::DeviceOps& StoragePolicy::state_ops() const {
  return offloaded() ? kernels::device_ops(kernels::Device::kCpu) : c_.ops;
}

void StoragePolicy::allocate_moments(size_t count) {
  exp_avg_ = kernels::DeviceArray<float>(state_ops(), count);
  exp_avg_sq_ = kernels::DeviceArray<float>(state_ops(), count);
}

template <class Fn>
void StoragePolicy::for_each_decay_run(size_t flat_begin, size_t count, Fn&& fn) const {
  const size_t flat_end = flat_begin + count;
  auto it = std::upper_bound(decay_segments_.begin(), decay_segments_.end(), flat_begin,
                             [](size_t x, const Segment& s) { return x < s.end; });
  for (; it != decay_segments_.end() && it->begin < flat_end; ++it) {
    const size_t i = std::max(it->begin, flat_begin), j = std::min(it->end, flat_end);
    if (i >= j) continue;
    fn(i - flat_begin, j - i, it->decay ? adamw_.weight_decay : 0.0f);
  }
}

void StoragePolicy::adamw_range(const kernels::DeviceOps& ops, float* p, const float* g, float* m, float* v,
                                size_t flat_begin, size_t count, float lr) {
  const auto& c = adamw_;
  for_each_decay_run(flat_begin, count, [&](size_t o, size_t k, float decay) {
    ops.adamw_update(p + o, g + o, m + o, v + o, k, lr, c.beta1, c.beta2, c.eps, decay, step_);
  });
}

void StoragePolicy::offloaded_adamw_range(float* p, const float* g, float* m, float* v, size_t flat_begin,
                                          size_t count, float lr) {
  const auto& c = adamw_;
  for_each_decay_run(flat_begin, count, [&](size_t o, size_t k, float decay) {
    optim::offloaded_adamw_update(c_.ops, p + o, g + o, m + o, v + o, k, lr, c.beta1, c.beta2, c.eps, decay, step_,
                                  c.offload_chunk);
  });
}

namespace {

double resident(const detail::DpContext& c, const void* p, size_t bytes) {
  return c.on_cpu() ? static_cast<double>(nn::resident_bytes(p, bytes)) : static_cast<double>(bytes);
}

double host_resident(const void* p, size_t bytes) { return static_cast<double>(nn::resident_bytes(p, bytes)); }

// Offloaded state is host memory: its held bytes move from the device's categories to the host's.
void move_offloaded_to_host(MemoryReport& m) {
  for (const char* k : {"optimizer_state", "master_weights"}) {
    m.host_bytes[k] = m.bytes[k];
    m.bytes[k] = 0;
  }
}

class Fp32Storage : public StoragePolicy {
 public:
  using StoragePolicy::StoragePolicy;
  DType dtype() const override { return DType::kFloat32; }

  bool allocate(const ShardingStrategy& s,
                const std::function<std::shared_ptr<RegisteredBuffer>(size_t)>& shared) override {
    sharded_grads_ = s.shards_gradients();
    sharded_params_ = s.shards_parameters();
    allocate_moments(s.state_numel());
    if (sharded_grads_) shard_grads_ = kernels::DeviceArray<float>(c_.ops, s.shard_numel());
    if (sharded_params_) shard_params_ = kernels::DeviceArray<float>(c_.ops, s.shard_numel());
    // A reduce-scatter reads world x piece elements from the unit's begin: past the unit's end it reads
    // the next (higher, already reduced) unit's gradients into padding lanes; past the buffer it needs staging.
    size_t stage = 0;
    for (const auto& u : s.units())
      if (u.begin + c_.world * u.piece > c_.n) stage = std::max(stage, c_.world * u.piece);
    rs_stage_ = kernels::DeviceArray<float>(c_.ops, stage);
    if (auto buf = shared ? shared(c_.n * sizeof(float)) : nullptr)  // the model's gradients are what is reduced
      return c_.model.adopt_grad_storage(static_cast<float*>(buf->data()), buf);
    return false;
  }

  void* all_reduce_source(GradBucket& b) override { return c_.model.grad_data() + b.begin; }

  void* reduce_scatter_source(size_t, const ShardUnit& u) override {
    float* src = c_.model.grad_data() + u.begin;
    if (u.begin + c_.world * u.piece <= c_.n) return src;
    const size_t L = u.end - u.begin, total = c_.world * u.piece;
    c_.ops.copy(rs_stage_.data(), src, L * sizeof(float));
    c_.ops.memset_zero(rs_stage_.data() + L, (total - L) * sizeof(float));
    return rs_stage_.data();
  }

  void* full_grads() override { return c_.model.grad_data(); }
  void* grad_shard() override { return shard_grads_.data(); }
  double sum_squares(const void* g, size_t count) override {
    return c_.ops.sum_squares(static_cast<const float*>(g), count);
  }
  void clip(float coef) override {
    if (coef == 1.0f) return;
    if (sharded_grads_) c_.ops.scale_inplace(shard_grads_.data(), coef, shard_grads_.size());
    else c_.ops.scale_inplace(c_.model.grad_data(), coef, c_.n);
  }

  void* params_full() override { return c_.model.param_data(); }
  size_t params_full_capacity() const override { return c_.n; }
  void* params_shard() override { return shard_params_.data(); }

  void update(const OwnedPiece& p, void* out, float lr) override {
    float* master = sharded_params_ ? shard_params_.data() + p.offset : c_.model.param_data() + p.flat_begin;
    const float* g = sharded_grads_ ? shard_grads_.data() + p.offset : c_.model.grad_data() + p.flat_begin;
    float* m = exp_avg_.data() + p.offset;
    float* v = exp_avg_sq_.data() + p.offset;
    // The parameters are their own master: offload moves the moments only.
    if (offloaded()) offloaded_adamw_range(master, g, m, v, p.flat_begin, p.count, lr);
    else adamw_range(c_.ops, master, g, m, v, p.flat_begin, p.count, lr);
    if (out != master) c_.ops.copy(out, master, p.count * sizeof(float));
  }

  void take_params(const ShardingStrategy& s) override {
    if (!sharded_params_) return;  // the model's buffer is the stored parameters
    const float* w = c_.model.param_data();
    for (const auto& p : s.owned())
      c_.ops.copy(shard_params_.data() + p.offset, w + p.flat_begin, p.count * sizeof(float));
  }

  void* param_gather_dst(const ShardUnit& u) override { return c_.model.param_data() + u.begin; }

  void memory(MemoryReport& m, double gathered) const override {
    const double n = static_cast<double>(c_.n);
    // float32 parameters are also the master weights.
    m.bytes["parameters"] = sharded_params_ ? (static_cast<double>(shard_params_.size()) + gathered) * 4 : n * 4;
    m.bytes["gradients"] = sharded_grads_ ? static_cast<double>(shard_grads_.size()) * 4 : n * 4;
    m.bytes["optimizer_state"] = static_cast<double>(exp_avg_.size() + exp_avg_sq_.size()) * 4;
    m.bytes["master_weights"] = 0;
    m.bytes["comm_buffers"] = static_cast<double>(rs_stage_.size()) * 4;
    if (offloaded()) move_offloaded_to_host(m);
  }

  void resident(MemoryReport& m) const override {
    auto& model = const_cast<nn::Model&>(c_.model);
    auto res = [&](const kernels::DeviceArray<float>& a) { return parallel::resident(c_, a.data(), a.size() * 4); };
    m.bytes["parameters"] = parallel::resident(c_, model.param_data(), c_.n * 4) + res(shard_params_);
    m.bytes["gradients"] = parallel::resident(c_, model.grad_data(), c_.n * 4) + res(shard_grads_);
    m.bytes["optimizer_state"] = res(exp_avg_) + res(exp_avg_sq_);
    m.bytes["master_weights"] = 0;
    m.bytes["comm_buffers"] = res(rs_stage_);
    if (offloaded()) {
      m.bytes["optimizer_state"] = 0;
      m.host_bytes["optimizer_state"] = host_resident(exp_avg_.data(), exp_avg_.size() * 4) +
                                        host_resident(exp_avg_sq_.data(), exp_avg_sq_.size() * 4);
      m.host_bytes["master_weights"] = 0;
    }
  }

 private:
  kernels::DeviceArray<float> shard_grads_, shard_params_;
  kernels::DeviceArray<float> rs_stage_;  // reduce-scatter staging for a unit that would run past the buffer
};

class Bf16Storage : public StoragePolicy {
 public:
  Bf16Storage(detail::DpContext& c, const optim::AdamWConfig& adamw)
      : StoragePolicy(c, adamw), scratch_f_(c.ops, kChunk), scratch_h_(c.ops, kChunk) {
    if (offloaded()) {  // host staging of one chunk: the bf16 gradients in, the float32 ones, the bf16 result out
      host_g16_.resize(kChunk);
      host_f_.resize(kChunk);
      host_out16_.resize(kChunk);
    }
  }
  DType dtype() const override { return DType::kBFloat16; }

  bool allocate(const ShardingStrategy& s,
                const std::function<std::shared_ptr<RegisteredBuffer>(size_t)>& shared) override {
    sharded_grads_ = s.shards_gradients();
    sharded_params_ = s.shards_parameters();
    allocate_moments(s.state_numel());
    master_ = kernels::DeviceArray<float>(state_ops(), s.state_numel());
    params16_ = kernels::DeviceArray<uint16_t>(c_.ops, sharded_params_ ? s.shard_numel() : c_.padded);
    bool in_shared = false;
    // ddp/zero1 reduce the persistent bf16 gradients (in registered memory when shared); zero2/zero3
    // reduce-scatter from the model's float32 gradient buffer, narrowed in place.
    if (!sharded_grads_ && shared) in_shared = grads16_.assign_shared(shared(c_.n * sizeof(uint16_t)), c_.n);
    if (!in_shared) grads16_.assign(c_.ops, sharded_grads_ ? s.shard_numel() : c_.n);
    stage16_.clear();
    stage16_.resize(s.units().size());
    for (size_t i = 0; i < s.units().size(); ++i) {
      const auto& u = s.units()[i];
      const size_t L = u.end - u.begin;
      if (c_.world * u.piece > 2 * L) stage16_[i] = kernels::DeviceArray<uint16_t>(c_.ops, c_.world * u.piece);
    }
    if (sharded_grads_ && shared)
      if (auto buf = shared(c_.n * sizeof(float)))
        in_shared = c_.model.adopt_grad_storage(static_cast<float*>(buf->data()), buf);
    return in_shared;
  }

  // ddp/zero1: round into the persistent bf16 gradients and hand the float32 pages back.
  void* all_reduce_source(GradBucket& b) override {
    const size_t count = b.end - b.begin;
    c_.ops.to_bf16(grads16_.data() + b.begin, c_.model.grad_data() + b.begin, count);
    c_.release(c_.model.grad_data() + b.begin, count);
    b.grads_released = true;
    return grads16_.data() + b.begin;
  }

  // zero2/zero3: round the unit's float32 gradients to bf16 in place (first half of its range) and zero
  // the padding lanes up to world x piece.
  void* reduce_scatter_source(size_t ui, const ShardUnit& u) override {
    const size_t L = u.end - u.begin, total = c_.world * u.piece;
    float* g = c_.model.grad_data() + u.begin;
    narrow_in_place(g, L);
    uint16_t* src = reinterpret_cast<uint16_t*>(g);
    if (stage16_[ui].size() > 0) {
      c_.ops.copy(stage16_[ui].data(), src, L * 2);
      src = stage16_[ui].data();
    }
    c_.ops.memset_zero(src + L, (total - L) * 2);
    return src;
  }

  void* full_grads() override { return grads16_.data(); }
  void* grad_shard() override { return grads16_.data(); }

  double sum_squares(const void* g, size_t count) override {
    const auto* x = static_cast<const uint16_t*>(g);
    double s = 0;
    for (size_t i = 0; i < count; i += kChunk) {
      const size_t w = std::min(kChunk, count - i);
      c_.ops.from_bf16(scratch_f_.data(), x + i, w);
      s += c_.ops.sum_squares(scratch_f_.data(), w);
    }
    return s;
  }
  // The scale is applied in float32 by the next update (no second rounding of the bf16 gradients).
  void clip(float coef) override { clip_coef_ = coef; }

  void* params_full() override { return params16_.data(); }
  size_t params_full_capacity() const override { return params16_.size(); }
  void* params_shard() override { return params16_.data(); }

  void update(const OwnedPiece& p, void* out, float lr) override {
    float* master = master_.data() + p.offset;
    const uint16_t* g16 = grads16_.data() + (sharded_grads_ ? p.offset : p.flat_begin);
    float* m = exp_avg_.data() + p.offset;
    float* v = exp_avg_sq_.data() + p.offset;
    auto* out16 = static_cast<uint16_t*>(out);
    if (offloaded()) {
      // The master and moments are host memory: the bf16 gradients come over, the CPU's kernels run the
      // same steps as below on the host, the bf16 result goes back.
      const kernels::DeviceOps& cpu = state_ops();
      for (size_t o = 0; o < p.count; o += kChunk) {
        const size_t w = std::min(kChunk, p.count - o);
        c_.ops.to_host(host_g16_.data(), g16 + o, w * 2);
        cpu.from_bf16(host_f_.data(), host_g16_.data(), w);
        if (clip_coef_ != 1.0f) cpu.scale_inplace(host_f_.data(), clip_coef_, w);
        adamw_range(cpu, master + o, host_f_.data(), m + o, v + o, p.flat_begin + o, w, lr);
        cpu.to_bf16(host_out16_.data(), master + o, w);
        c_.ops.to_device(out16 + o, host_out16_.data(), w * 2);
      }
      return;
    }
    float* g = scratch_f_.data();
    for (size_t o = 0; o < p.count; o += kChunk) {
      const size_t w = std::min(kChunk, p.count - o);
      c_.ops.from_bf16(g, g16 + o, w);
      if (clip_coef_ != 1.0f) c_.ops.scale_inplace(g, clip_coef_, w);
      adamw_range(c_.ops, master + o, g, m + o, v + o, p.flat_begin + o, w, lr);
      c_.ops.to_bf16(out16 + o, master + o, w);
    }
  }

  void take_params(const ShardingStrategy& s) override {
    const float* w = c_.model.param_data();
    for (const auto& p : s.owned()) {
      if (offloaded()) c_.ops.to_host(master_.data() + p.offset, w + p.flat_begin, p.count * sizeof(float));
      else c_.ops.copy(master_.data() + p.offset, w + p.flat_begin, p.count * sizeof(float));
      if (sharded_params_) c_.ops.to_bf16(params16_.data() + p.offset, w + p.flat_begin, p.count);
    }
    if (!sharded_params_) c_.ops.to_bf16(params16_.data(), w, c_.n);
  }
  float* master() override { return master_.data(); }

  // Into the upper half of the unit's float32 range; after_param_gather widens it in place.
  void* param_gather_dst(const ShardUnit& u) override {
    return reinterpret_cast<uint16_t*>(c_.model.param_data() + u.begin) + (u.end - u.begin);
  }
  void after_param_gather(size_t b, size_t e) override { widen_in_place(c_.model.param_data() + b, e - b); }
  void materialize(size_t b, size_t e) override {
    c_.ops.from_bf16(c_.model.param_data() + b, params16_.data() + b, e - b);
  }

  void memory(MemoryReport& m, double gathered) const override {
    double stage = 0;
    for (const auto& s : stage16_) stage += static_cast<double>(s.size()) * 2;
    m.bytes["parameters"] = static_cast<double>(params16_.size()) * 2 + gathered * 4;
    m.bytes["gradients"] = static_cast<double>(grads16_.size()) * 2;
    m.bytes["master_weights"] = static_cast<double>(master_.size()) * 4;
    m.bytes["optimizer_state"] = static_cast<double>(exp_avg_.size() + exp_avg_sq_.size()) * 4;
    m.bytes["comm_buffers"] = stage;
    if (offloaded()) move_offloaded_to_host(m);
  }

  void resident(MemoryReport& m) const override {
    auto& model = const_cast<nn::Model&>(c_.model);
    auto res = [&](const void* p, size_t bytes) { return parallel::resident(c_, p, bytes); };
    m.bytes["parameters"] = res(model.param_data(), c_.n * 4) + res(params16_.data(), params16_.size() * 2);
    m.bytes["gradients"] = res(model.grad_data(), c_.n * 4) + res(grads16_.data(), grads16_.size() * 2);
    m.bytes["optimizer_state"] = res(exp_avg_.data(), exp_avg_.size() * 4) + res(exp_avg_sq_.data(), exp_avg_sq_.size() * 4);
    m.bytes["master_weights"] = res(master_.data(), master_.size() * 4);
    double stage = 0;
    for (const auto& s : stage16_) stage += res(s.data(), s.size() * 2);
    m.bytes["comm_buffers"] = stage;
    if (offloaded()) {
      m.bytes["optimizer_state"] = m.bytes["master_weights"] = 0;
      m.host_bytes["optimizer_state"] = host_resident(exp_avg_.data(), exp_avg_.size() * 4) +
                                        host_resident(exp_avg_sq_.data(), exp_avg_sq_.size() * 4);
      m.host_bytes["master_weights"] = host_resident(master_.data(), master_.size() * 4);
    }
  }

 private:
  static constexpr size_t kChunk = 2048;  // elements converted at a time through the scratch buffers

  // bf16 values stored at byte offset 2L of the float32 range p[0, L) widened in place to p[0, L).
  // Forward in chunks, each read (into scratch) before it is written: writing float i (bytes [4i, 4i+4))
  // overwrites only bf16 elements j <= i (bytes [2L+2j, 2L+2j+2)), all read by then.
  void widen_in_place(float* p, size_t L) {
    char* base = reinterpret_cast<char*>(p);
    for (size_t i = 0; i < L; i += kChunk) {
      const size_t w = std::min(kChunk, L - i);
      c_.ops.copy(scratch_h_.data(), base + 2 * L + 2 * i, 2 * w);
      c_.ops.from_bf16(scratch_f_.data(), scratch_h_.data(), w);
      c_.ops.copy(base + 4 * i, scratch_f_.data(), 4 * w);
    }
  }
  // float32 p[0, L) rounded to bf16 in place into the first 2L bytes (forward: writing bf16 i, bytes
  // [2i, 2i+2), overwrites only floats j <= i/2, already read).
  void narrow_in_place(float* p, size_t L) {
    char* base = reinterpret_cast<char*>(p);
    for (size_t i = 0; i < L; i += kChunk) {
      const size_t w = std::min(kChunk, L - i);
      c_.ops.copy(scratch_f_.data(), base + 4 * i, 4 * w);
      c_.ops.to_bf16(scratch_h_.data(), scratch_f_.data(), w);
      c_.ops.copy(base + 2 * i, scratch_h_.data(), 2 * w);
    }
  }

  kernels::DeviceArray<float> master_;
  kernels::DeviceArray<uint16_t> params16_;
  detail::GradientArray<uint16_t> grads16_;  // ddp/zero1: in the group's registered memory when shared
  std::vector<kernels::DeviceArray<uint16_t>> stage16_;  // per unit; empty unless world * piece > 2 x its length
  kernels::DeviceArray<float> scratch_f_;
  kernels::DeviceArray<uint16_t> scratch_h_;
  std::vector<uint16_t> host_g16_, host_out16_;  // offload: one chunk's bf16 gradients in, parameters out
  std::vector<float> host_f_;                     // offload: one chunk's float32 gradients
  float clip_coef_ = 1.0f;
};

}  // namespace

std::unique_ptr<StoragePolicy> make_storage(DType dtype, detail::DpContext& c, const optim::AdamWConfig& adamw) {
  if (dtype == DType::kFloat32) return std::make_unique<Fp32Storage>(c, adamw);
  if (dtype == DType::kBFloat16) return std::make_unique<Bf16Storage>(c, adamw);
  TRIDENT_THROW(InvalidArgument, "data parallel: storage dtype {} is not supported; use float32 or bfloat16 (--param_dtype)",
                dtype_name(dtype));
}

}  // namespace trident::parallel
