#include "trident/bench/verifiable.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "trident/core/error.h"

namespace trident::bench {
namespace {

// A cheap mix of (rank, k, iter): neighbouring elements, ranks and iterations get unrelated values, so a
// block landing at the wrong offset or from the wrong rank is caught (no short period to hide behind).
inline uint64_t mix(int rank, size_t k, int iter) {
  uint64_t x = (static_cast<uint64_t>(k) + 1) * 0x9E3779B97F4A7C15ull;
  x ^= (static_cast<uint64_t>(rank) + 1) * 0xC2B2AE3D27D4EB4Full + (static_cast<uint64_t>(iter) + 7) * 0x165667B19E3779F9ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return x;
}

template <typename T>
void fill_typed(T* p, size_t count, int rank, size_t k0, int iter, DType dtype, ReduceOp redop, bool reduces) {
  for (size_t i = 0; i < count; ++i)
    p[i] = static_cast<T>(input_value(rank, k0 + i, iter, dtype, redop, reduces));
}

}  // namespace

double input_value(int rank, size_t k, int iter, DType dtype, ReduceOp redop, bool reduces) {
  const uint64_t h = mix(rank, k, iter);
  if (dtype == DType::kUInt8) return static_cast<double>(h % 251);  // 255 is the poison
  if (reduces && redop == ReduceOp::kProd) {
    static constexpr double kProdValues[3] = {1, 2, -1};
    return kProdValues[h % 3];
  }
  // Sums of up to 64 ranks stay within 256 (exact even in bfloat16); moved values use a wider range.
  if (reduces) return static_cast<double>(static_cast<int64_t>(h % 9) - 4);
  return static_cast<double>(static_cast<int64_t>(h % 201) - 100);
}

double round_to(double v, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<float>(v);
    case DType::kFloat64: return v;
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    case DType::kFloat16: return fp16_to_float(float_to_fp16(static_cast<float>(v)));
    case DType::kInt32: return static_cast<double>(static_cast<int32_t>(v));
    case DType::kInt64: return static_cast<double>(static_cast<int64_t>(v));
    case DType::kUInt8: return static_cast<double>(static_cast<uint8_t>(v));
  }
  return v;
}

void fill_input(void* buf, size_t count, DType dtype, int rank, size_t k0, int iter, ReduceOp redop, bool reduces) {
  switch (dtype) {
    case DType::kFloat32: return fill_typed(static_cast<float*>(buf), count, rank, k0, iter, dtype, redop, reduces);
    case DType::kFloat64: return fill_typed(static_cast<double*>(buf), count, rank, k0, iter, dtype, redop, reduces);
    case DType::kInt32: return fill_typed(static_cast<int32_t*>(buf), count, rank, k0, iter, dtype, redop, reduces);
    case DType::kInt64: return fill_typed(static_cast<int64_t*>(buf), count, rank, k0, iter, dtype, redop, reduces);
    case DType::kUInt8: return fill_typed(static_cast<uint8_t*>(buf), count, rank, k0, iter, dtype, redop, reduces);
    case DType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i)
        p[i] = float_to_bf16(static_cast<float>(input_value(rank, k0 + i, iter, dtype, redop, reduces)));
      return;
    }
    case DType::kFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i)
        p[i] = float_to_fp16(static_cast<float>(input_value(rank, k0 + i, iter, dtype, redop, reduces)));
      return;
    }
  }
}

void poison(void* buf, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = std::numeric_limits<float>::quiet_NaN();
      return;
    }
    case DType::kFloat64: {
      auto* p = static_cast<double*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = std::numeric_limits<double>::quiet_NaN();
      return;
    }
    case DType::kBFloat16:
    case DType::kFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = 0x7fff;  // a NaN in both formats
      return;
    }
    case DType::kInt32: {
      auto* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = 0x5A5A5A5A;
      return;
    }
    case DType::kInt64: {
      auto* p = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = 0x5A5A5A5A5A5A5A5ALL;
      return;
    }
    case DType::kUInt8: std::memset(buf, 0xff, count); return;
  }
}

double load_value(const void* buf, size_t i, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(buf)[i];
    case DType::kFloat64: return static_cast<const double*>(buf)[i];
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
  }
  return std::numeric_limits<double>::quiet_NaN();
}

double reduced_value(int world, size_t k, int iter, DType dtype, ReduceOp redop) {
  double acc = input_value(0, k, iter, dtype, redop, true);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(r, k, iter, dtype, redop, true);
    switch (redop) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMax: acc = v > acc ? v : acc; break;
      case ReduceOp::kMin: acc = v < acc ? v : acc; break;
    }
  }
  if (redop == ReduceOp::kAvg && world > 1) {
    if (dtype == DType::kFloat64) return acc / world;
    if (dtype == DType::kInt32 || dtype == DType::kInt64)
      return static_cast<double>(static_cast<int64_t>(acc) / world);  // truncation, as C++ divides
    // float32, and bfloat16/float16 (reduced with float32 accumulation): float division, then rounding.
    return round_to(static_cast<float>(acc) / static_cast<float>(world), dtype);
  }
  return round_to(acc, dtype);
}

size_t count_wrong_reduced(const void* buf, size_t count, DType dtype, int world, size_t k0, int iter, ReduceOp redop) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i)
    if (!(load_value(buf, i, dtype) == reduced_value(world, k0 + i, iter, dtype, redop))) ++wrong;
  return wrong;
}

}  // namespace trident::bench
