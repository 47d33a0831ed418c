#include "trident/core/dtype.h"

#include "trident/core/error.h"

namespace trident {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  TRIDENT_THROW(InvalidArgument, "unknown dtype code {}", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

DType parse_dtype(std::string_view n) {
  if (n == "float32" || n == "f32" || n == "fp32" || n == "float") return DType::kFloat32;
  if (n == "float64" || n == "f64" || n == "fp64" || n == "double") return DType::kFloat64;
  if (n == "bfloat16" || n == "bf16") return DType::kBFloat16;
  if (n == "float16" || n == "f16" || n == "fp16" || n == "half") return DType::kFloat16;
  if (n == "int32" || n == "i32" || n == "int") return DType::kInt32;
  if (n == "int64" || n == "i64" || n == "long") return DType::kInt64;
  if (n == "uint8" || n == "u8" || n == "byte") return DType::kUInt8;
  TRIDENT_THROW(InvalidArgument, "unknown dtype '{}'; use float32, float64, bfloat16, float16, int32, int64 or uint8", n);
}

bool dtype_is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kBFloat16 || t == DType::kFloat16;
}

}  // namespace trident
