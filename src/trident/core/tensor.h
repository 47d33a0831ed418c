// Tensor: a typed, shaped, contiguous (row-major) block of memory on a device — the unit in which trident
// names data at its edges (checkpoint files, conversions between float32 and bfloat16/float16 storage,
// device buffers). Inside the training loop models keep parameters in ONE flat float32 buffer with
// per-parameter offsets (nn/model.h: DDP buckets and ZeRO shards are ranges of it); Tensor::view wraps any
// such range without copying.
//
// Storage is shared: copies of a Tensor (and reshape/rows views) alias the same memory, which lives while
// any of them does; view() borrows memory the caller keeps alive. CPU allocations are 64-byte aligned and
// zero-filled. Device::kCUDA tensors are created by the CUDA layer (trident_cuda) through from_external()
// with its deleter; the CPU-only operations below (to(), fill) refuse them with an error saying so.
// Thread-safety: like a pointer (concurrent reads fine; writes need the caller's synchronization).
// No blocking, no timeouts.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/dtype.h"
#include "trident/core/error.h"

namespace trident {

enum class Device : uint8_t { kCPU = 0, kCUDA = 1 };
const char* device_name(Device d);  // "cpu" | "cuda"

class Tensor {
 public:
  Tensor() = default;

  // A new zero-filled CPU tensor (64-byte aligned).
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::kFloat32);
  // A non-owning view of `data` (must outlive every use of the view).
  static Tensor view(void* data, std::vector<int64_t> shape, DType dtype, Device device = Device::kCPU);
  static Tensor view(const float* data, std::vector<int64_t> shape) {
    return view(const_cast<float*>(data), std::move(shape), DType::kFloat32);
  }
  // Takes ownership of memory allocated elsewhere (e.g. cudaMalloc), released by `deleter`.
  static Tensor from_external(void* data, std::vector<int64_t> shape, DType dtype, Device device,
                              std::function<void(void*)> deleter);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end; throws when out of range
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  void* raw() const { return data_; }

  // Typed access: T must match the dtype (float, double, BFloat16/uint16_t for bfloat16 and float16,
  // int32_t, int64_t, uint8_t); a mismatch throws naming both.
  template <typename T>
  T* data() const {
    check_element<T>();
    return static_cast<T*>(data_);
  }

  // Same storage, another shape with the same number of elements.
  Tensor reshape(std::vector<int64_t> shape) const;
  // Rows [begin, end) of the leading dimension, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // A new CPU tensor converted to `dtype` (float32/float64/bfloat16/float16 among themselves, round to
  // nearest even; same dtype = a copy). Integer dtypes convert only to themselves.
  Tensor to(DType dtype) const;
  // Copies src's elements into this tensor (same numel; converting dtype as to() does). CPU only.
  void copy_from(const Tensor& src);
  // "bfloat16[3, 4] cpu"
  std::string describe() const;

 private:
  template <typename T>
  void check_element() const;
  void require_cpu(const char* what) const;

  std::shared_ptr<void> storage_;  // keeps owned memory alive (null for borrowed views)
  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kFloat32;
  Device device_ = Device::kCPU;
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[3, 4]"

template <typename T>
void Tensor::check_element() const {
  DType want;
  if constexpr (std::is_same_v<T, float>) want = DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) want = DType::kFloat64;
  else if constexpr (std::is_same_v<T, BFloat16>) want = DType::kBFloat16;
  else if constexpr (std::is_same_v<T, Float16>) want = DType::kFloat16;
  else if constexpr (std::is_same_v<T, int32_t>) want = DType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>) want = DType::kInt64;
  else if constexpr (std::is_same_v<T, uint8_t>) want = DType::kUInt8;
  else if constexpr (std::is_same_v<T, uint16_t>) {
    TRIDENT_CHECK(dtype_ == DType::kBFloat16 || dtype_ == DType::kFloat16, InvalidArgument,
                  "tensor {}: uint16_t access needs bfloat16 or float16 storage", describe());
    return;
  } else {
    static_assert(sizeof(T) == 0, "unsupported tensor element type");
  }
  TRIDENT_CHECK(dtype_ == want, InvalidArgument, "tensor {} accessed as {}: convert with .to({}) first", describe(),
                dtype_name(want), dtype_name(want));
}

}  // namespace trident
