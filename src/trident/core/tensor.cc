#include "trident/core/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace trident {
namespace {

int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    TRIDENT_CHECK(d >= 0, InvalidArgument, "tensor shape {} has a negative dimension", shape_string(shape));
    TRIDENT_CHECK(d == 0 || n <= INT64_MAX / d, InvalidArgument, "tensor shape {} has more than 2^63 elements",
                  shape_string(shape));
    n *= d;
  }
  return n;
}

bool is_float_like(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kBFloat16 || t == DType::kFloat16;
}

double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat64: return static_cast<const double*>(p)[i];
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return 0;
  }
}

void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(p)[i] = v; break;
    // Through float32 first: the float32 -> 16-bit rounding is the one every kernel uses.
    case DType::kBFloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_fp16(static_cast<float>(v)); break;
    default: break;
  }
}

}  // namespace

const char* device_name(Device d) { return d == Device::kCUDA ? "cuda" : "cpu"; }

std::string shape_string(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.numel_ = checked_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  const size_t bytes = (t.nbytes() + 63) / 64 * 64;
  if (bytes > 0) {
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) TRIDENT_THROW(Error, "tensor {}: cannot allocate {} bytes", t.describe(), bytes);
    std::memset(p, 0, bytes);
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    t.data_ = p;
  }
  return t;
}

Tensor Tensor::view(void* data, std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.numel_ = checked_numel(shape);
  TRIDENT_CHECK(data != nullptr || t.numel_ == 0, InvalidArgument, "tensor view of shape {}: data is null",
                shape_string(shape));
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.data_ = data;
  return t;
}

Tensor Tensor::from_external(void* data, std::vector<int64_t> shape, DType dtype, Device device,
                             std::function<void(void*)> deleter) {
  Tensor t = view(data, std::move(shape), dtype, device);
  if (data != nullptr) t.storage_ = std::shared_ptr<void>(data, std::move(deleter));
  return t;
}

int64_t Tensor::size(int d) const {
  const int n = dim();
  const int i = d < 0 ? d + n : d;
  TRIDENT_CHECK(i >= 0 && i < n, InvalidArgument, "tensor {}: dimension {} is out of range for {} dimension(s)",
                describe(), d, n);
  return shape_[static_cast<size_t>(i)];
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  const int64_t n = checked_numel(shape);
  TRIDENT_CHECK(n == numel_, InvalidArgument, "cannot reshape tensor {} ({} elements) to {} ({} elements)", describe(),
                numel_, shape_string(shape), n);
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  TRIDENT_CHECK(dim() >= 1, InvalidArgument, "tensor {}: rows() needs at least one dimension", describe());
  TRIDENT_CHECK(0 <= begin && begin <= end && end <= shape_[0], InvalidArgument,
                "tensor {}: rows [{}, {}) are outside [0, {})", describe(), begin, end, shape_[0]);
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.numel_ = checked_numel(t.shape_);
  const int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  return t;
}

void Tensor::require_cpu(const char* what) const {
  TRIDENT_CHECK(device_ == Device::kCPU, Unsupported,
                "tensor {}: {} runs on CPU tensors only; copy it to the host first (trident_cuda)", describe(), what);
}

void Tensor::copy_from(const Tensor& src) {
  require_cpu("copy_from");
  src.require_cpu("copy_from");
  TRIDENT_CHECK(src.numel_ == numel_, InvalidArgument, "copy_from: tensor {} has {} elements, destination {} has {}",
                src.describe(), src.numel_, describe(), numel_);
  if (src.dtype_ == dtype_) {
    if (nbytes() > 0) std::memmove(data_, src.data_, nbytes());
    return;
  }
  TRIDENT_CHECK(is_float_like(src.dtype_) && is_float_like(dtype_), Unsupported,
                "cannot convert tensor {} to {}: conversions are among float32, float64, bfloat16 and float16 only",
                src.describe(), dtype_name(dtype_));
  if (src.dtype_ == DType::kFloat32 && dtype_ == DType::kBFloat16) {
    const float* in = static_cast<const float*>(src.data_);
    uint16_t* out = static_cast<uint16_t*>(data_);
    for (int64_t i = 0; i < numel_; ++i) out[i] = float_to_bf16(in[i]);
    return;
  }
  if (src.dtype_ == DType::kBFloat16 && dtype_ == DType::kFloat32) {
    const uint16_t* in = static_cast<const uint16_t*>(src.data_);
    float* out = static_cast<float*>(data_);
    for (int64_t i = 0; i < numel_; ++i) out[i] = bf16_to_float(in[i]);
    return;
  }
  for (int64_t i = 0; i < numel_; ++i) store_from_double(data_, dtype_, i, load_as_double(src.data_, src.dtype_, i));
}

Tensor Tensor::to(DType dtype) const {
  require_cpu("to()");
  Tensor out = zeros(shape_, dtype);
  out.copy_from(*this);
  return out;
}

std::string Tensor::describe() const {
  return fmt::format("{}{} {}", dtype_name(dtype_), shape_string(shape_), device_name(device_));
}

}  // namespace trident
