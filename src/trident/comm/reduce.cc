#include "trident/comm/reduce.h"

#include <algorithm>
#include <cstdint>

#include "trident/core/error.h"

namespace trident {
namespace {

template <typename T>
inline void combine(T* __restrict__ d, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
      break;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) d[i] = a[i] * b[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) d[i] = a[i] > b[i] ? a[i] : b[i];
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) d[i] = a[i] < b[i] ? a[i] : b[i];
      break;
  }
}

// Half types: widen to float, combine, round once.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
inline void combine_half(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n, ReduceOp op) {
  constexpr size_t kBlock = 256;
  float fa[kBlock], fb[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) fa[i] = ToF(a[base + i]), fb[i] = ToF(b[base + i]);
    combine<float>(fa, fa, fb, m, op);
    for (size_t i = 0; i < m; ++i) d[base + i] = FromF(fa[i]);
  }
}

}  // namespace

bool reduce_supported(DType dtype, ReduceOp op) { return dtype != DType::kUInt8; }

void reduce_into3(void* dst, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32:
      return combine(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b), n, op);
    case DType::kFloat64:
      return combine(static_cast<double*>(dst), static_cast<const double*>(a), static_cast<const double*>(b), n, op);
    case DType::kInt32:
      return combine(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), n, op);
    case DType::kInt64:
      return combine(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), n, op);
    case DType::kBFloat16:
      return combine_half<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                                        static_cast<const uint16_t*>(b), n, op);
    case DType::kFloat16:
      return combine_half<fp16_to_float, float_to_fp16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                                        static_cast<const uint16_t*>(b), n, op);
    case DType::kUInt8:
      TRIDENT_THROW(InvalidArgument, "reduce op {} is not defined on uint8 (uint8 supports data movement only)",
                    reduce_op_name(op));
  }
}

void reduce_into(void* dst, const void* src, size_t n, DType dtype, ReduceOp op) {
  reduce_into3(dst, dst, src, n, dtype, op);
}

void scale_divide(void* buf, size_t n, DType dtype, int divisor) {
  switch (dtype) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(buf);
      const float d = static_cast<float>(divisor);  // true division: exact where the quotient is representable
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      return;
    }
    case DType::kFloat64: {
      auto* p = static_cast<double*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] /= divisor;
      return;
    }
    case DType::kInt32: {
      auto* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] /= divisor;
      return;
    }
    case DType::kInt64: {
      auto* p = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] /= divisor;
      return;
    }
    case DType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / static_cast<float>(divisor));
      return;
    }
    case DType::kFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_fp16(fp16_to_float(p[i]) / static_cast<float>(divisor));
      return;
    }
    case DType::kUInt8:
      TRIDENT_THROW(InvalidArgument, "avg is not defined on uint8 (uint8 supports data movement only)");
  }
}

}  // namespace trident
