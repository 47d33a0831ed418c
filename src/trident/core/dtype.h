// Element types shared by tensors and the communication layer (below comm/ a buffer is ptr, count, dtype).
// bfloat16 and float16 are stored as uint16_t bit patterns; arithmetic on them goes through float32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace trident {

enum class DType : uint8_t { kFloat32 = 0, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kUInt8 };
inline constexpr int kNumDTypes = 7;

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "float32", "bfloat16", ...
// Accepts the names above and common aliases (f32, fp32, float, bf16, half, fp16, f64, double, int, long, byte).
DType parse_dtype(std::string_view name);
bool dtype_is_floating(DType t);

struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};

// Round-to-nearest-even conversions; NaN stays NaN.
inline float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float fp16_to_float(uint16_t h) {
#if defined(__FLT16_MAX__)
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
#else
#error "trident needs a compiler with _Float16 (GCC >= 12 on x86-64)"
#endif
}
inline uint16_t float_to_fp16(float f) {
  _Float16 v = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}

}  // namespace trident
