#include "trident/nn/flat_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "trident/core/error.h"
#include "trident/nn/model_spec.h"
#include "trident/nn/models.h"

namespace trident::nn {

int FlatModel::add_param(std::string name, std::vector<int64_t> shape) {
  Parameter p;
  p.name = std::move(name);
  p.numel = 1;
  for (auto d : shape) p.numel *= static_cast<size_t>(d);
  p.weight_decay = shape.size() >= 2;
  p.shape = std::move(shape);
  p.offset = params_.empty() ? 0 : kernels::align_floats(params_.back().offset + params_.back().numel);
  params_.push_back(std::move(p));
  return static_cast<int>(params_.size()) - 1;
}

void FlatModel::finalize_params() {
  const size_t n = params_.empty() ? 0 : kernels::align_floats(params_.back().offset + params_.back().numel);
  values_ = kernels::DeviceArray<float>(*ops_, n);
  grad_store_ = kernels::DeviceArray<float>(*ops_, n);
  grads_ = grad_store_.data();
  grad_owner_.reset();
  if (ops_->device != kernels::Device::kCpu && initialize_) init_staging_.assign(n, 0.0f);
}

float* FlatModel::init_target(int idx) {
  float* base = ops_->device == kernels::Device::kCpu ? values_.data() : init_staging_.data();
  return base + params_[idx].offset;
}

void FlatModel::finish_init() {
  if (ops_->device == kernels::Device::kCpu || !initialize_) return;
  ops_->to_device(values_.data(), init_staging_.data(), init_staging_.size() * sizeof(float));
  kernels::AlignedFloats().swap(init_staging_);
}

void FlatModel::init_param(int idx, const ParamDecl& d, const std::vector<std::pair<int64_t, int64_t>>& rows,
                           int64_t col0, int64_t ncols) {
  if (recipes_.size() < params_.size()) recipes_.resize(params_.size());
  recipes_[static_cast<size_t>(idx)] = {std::make_shared<const ParamDecl>(d), rows, col0, ncols};
  if (initialize_) init_slice(d, cfg_.seed, rows, col0, ncols, init_target(idx));
}

void FlatModel::initialize_range(size_t begin, size_t end) {
  TRIDENT_CHECK(begin <= end && end <= num_params(), InvalidArgument,
                "initialize_range: [{}, {}) is outside the {} parameters", begin, end, num_params());
  std::vector<float> host;  // devices other than the CPU: drawn here, then copied up per parameter
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    const size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    TRIDENT_CHECK(i < recipes_.size() && recipes_[i].decl, Unsupported,
                  "initialize_range: parameter '{}' has no initialization recipe", p.name);
    const InitRecipe& r = recipes_[i];
    // The local tensor is dense [rows, ncols]; [lo, hi) is a partial first row, whole rows, a partial last row.
    std::vector<int64_t> local_rows;  // the declaration's row of each local row
    for (const auto& [r0, cnt] : r.rows)
      for (int64_t k = 0; k < cnt; ++k) local_rows.push_back(r0 + k);
    const auto nc = static_cast<size_t>(r.ncols);
    float* dst = param_data() + lo;
    if (ops_->device != kernels::Device::kCpu) {
      host.assign(hi - lo, 0.0f);
      dst = host.data();
    }
    float* out = dst;
    size_t e = lo - p.offset;
    const size_t stop = hi - p.offset;
    while (e < stop) {
      const size_t row = e / nc, col = e % nc;
      if (col != 0 || stop - e < nc) {  // a part of one row
        const size_t n = std::min(nc - col, stop - e);
        init_slice(*r.decl, cfg_.seed, {{local_rows[row], 1}}, r.col0 + static_cast<int64_t>(col),
                   static_cast<int64_t>(n), out);
        out += n, e += n;
        continue;
      }
      const size_t whole = (stop - e) / nc;  // whole rows from `row` on, grouped into runs of consecutive rows
      std::vector<std::pair<int64_t, int64_t>> runs;
      for (size_t k = row; k < row + whole; ++k) {
        if (!runs.empty() && runs.back().first + runs.back().second == local_rows[k]) ++runs.back().second;
        else runs.push_back({local_rows[k], 1});
      }
      init_slice(*r.decl, cfg_.seed, runs, r.col0, r.ncols, out);
      out += whole * nc, e += whole * nc;
    }
    if (ops_->device != kernels::Device::kCpu) ops_->to_device(param_data() + lo, host.data(), (hi - lo) * sizeof(float));
  }
}

void init_slice(const ParamDecl& d, uint64_t seed, const std::vector<std::pair<int64_t, int64_t>>& rows,
                int64_t col0, int64_t ncols, float* dst) {
  int64_t numel = 1;
  for (auto x : d.shape) numel *= x;
  const int64_t R = d.shape.empty() ? 1 : d.shape[0], cols = R > 0 ? numel / R : 0;
  if (!d.normal) {
    size_t n = 0;
    for (const auto& [r0, cnt] : rows) n += static_cast<size_t>(cnt * ncols);
    std::fill(dst, dst + n, static_cast<float>(d.init));
    return;
  }
  // The tensor's own stream: the model's seed mixed with its name (FNV-1a, then SplitMix64's finalizer).
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : d.name) h = (h ^ ch) * 1099511628211ull;
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (h | 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  std::mt19937_64 rng(z ^ (z >> 31));
  const double k53 = 1.0 / 9007199254740992.0;  // 2^-53
  std::vector<float> row(static_cast<size_t>(cols));
  int64_t next = 0;  // the next row the stream would draw
  for (const auto& [r0, cnt] : rows) {
    for (int64_t r = r0; r < r0 + cnt; ++r) {
      TRIDENT_CHECK(r >= next, InvalidArgument, "init_slice('{}'): rows must ascend", d.name);
      for (; next <= r; ++next)
        for (auto& v : row) {
          const double u1 = static_cast<double>((rng() >> 11) + 1) * k53;  // (0, 1]
          const double u2 = static_cast<double>(rng() >> 11) * k53;        // [0, 1)
          v = static_cast<float>(d.init * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
        }
      std::copy_n(row.data() + col0, ncols, dst);
      dst += ncols;
    }
  }
}

bool FlatModel::adopt_grad_storage(float* storage, std::shared_ptr<void> owner) {
  TRIDENT_CHECK(storage && reinterpret_cast<uintptr_t>(storage) % kernels::kAlignment == 0, InvalidArgument,
                "adopt_grad_storage: the storage must be {}-byte aligned and not null", kernels::kAlignment);
  if (ops_->device != kernels::Device::kCpu) return false;  // the storage offered is host memory
  const size_t n = num_params();
  if (storage != grads_) std::memcpy(storage, grads_, n * sizeof(float));
  grads_ = storage;
  grad_owner_ = std::move(owner);
  grad_store_.reset();
  return true;
}

void FlatModel::zero_grad() {
  const size_t n = num_params();
  if (ops_->device != kernels::Device::kCpu) {
    ops_->memset_zero(grads_, n * sizeof(float));
    return;
  }
  if (!release_on_zero_) {
    std::memset(grads_, 0, n * sizeof(float));
    return;
  }
  // Whole pages go back to the OS (they read back as zero); only the partial pages at the ends are written.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  char* b = reinterpret_cast<char*>(grads_);
  char* e = b + n * sizeof(float);
  char* lo = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(b) + page - 1) / page * page);
  char* hi = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(e) / page * page);
  if (lo >= hi) {
    std::memset(b, 0, static_cast<size_t>(e - b));
    return;
  }
  std::memset(b, 0, static_cast<size_t>(lo - b));
  std::memset(hi, 0, static_cast<size_t>(e - hi));
  release_pages(reinterpret_cast<float*>(b), n);
}

const char* block_event_name(Model::BlockEvent e) {
  switch (e) {
    case Model::BlockEvent::kBeforeForward: return "before_forward";
    case Model::BlockEvent::kAfterForward: return "after_forward";
    case Model::BlockEvent::kBeforeBackward: return "before_backward";
    case Model::BlockEvent::kAfterBackward: return "after_backward";
    case Model::BlockEvent::kBeforeRecompute: return "before_recompute";
    case Model::BlockEvent::kAfterRecompute: return "after_recompute";
  }
  return "?";
}

size_t release_pages(float* p, size_t n) {
  if (p == nullptr || n == 0) return 0;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + n * sizeof(float);
  const uintptr_t lo = (b + page - 1) / page * page, hi = e / page * page;
  if (lo >= hi) return 0;
  // Shared memory (gradients in a group's registered memory): MADV_REMOVE frees the pages and they read back
  // as zero. Private memory refuses it (EINVAL); MADV_DONTNEED does that there.
  if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_REMOVE) == 0) return hi - lo;
  if (errno != EINVAL)
    TRIDENT_THROW(IoError, "madvise(MADV_REMOVE) of {} bytes at {:#x} failed: {}", hi - lo, lo, std::strerror(errno));
  if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0)
    TRIDENT_THROW(IoError, "madvise(MADV_DONTNEED) of {} bytes at {:#x} failed: {}", hi - lo, lo,
                  std::strerror(errno));
  return hi - lo;
}

size_t resident_bytes(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return 0;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> vec((e - b) / page);
  if (::mincore(reinterpret_cast<void*>(b), e - b, vec.data()) != 0)
    TRIDENT_THROW(IoError, "mincore of {} bytes at {:#x} failed: {}", e - b, b, std::strerror(errno));
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n * page;
}

void FlatModel::check_batch(const int32_t* inputs, int B, int T) const {
  TRIDENT_CHECK(B > 0 && T > 0, InvalidArgument, "model: batch {} x {} tokens must be positive", B, T);
  TRIDENT_CHECK(T <= cfg_.block_size, InvalidArgument,
                "model: sequence length {} exceeds block_size {}; crop the input or raise block_size", T,
                cfg_.block_size);
  TRIDENT_CHECK(inputs != nullptr, InvalidArgument, "model: inputs is null");
}

}  // namespace trident::nn
