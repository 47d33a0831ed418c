// Internal helpers for the CPU kernels: per-ISA function clones and branch-free, vectorizable exp/erf.
// Header-only; the one piece of state, the active ISA level, lives in isa.cc. Thread-safe.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

// Hot loops are compiled three times -- baseline x86-64, x86-64-v3 (AVX2+FMA) and x86-64-v4 (AVX-512) --
// and the active ISA level (isa.h) picks one per call, so one binary is fast everywhere without
// -march=native and TRIDENT_ISA can run every path on one machine. A kernel is written once as an
// always-inline NAME_body; TRIDENT_ISA_CLONES(ret, NAME, (params), (args)) defines NAME_v1/_v3/_v4
// around it and the table NAME_clones; TRIDENT_ISA_CALL(NAME, (args)) calls the active one.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TRIDENT_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define TRIDENT_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#else
#define TRIDENT_TARGET_V4
#define TRIDENT_TARGET_V3
#endif
#define TRIDENT_KERNEL_BODY __attribute__((always_inline)) static inline

#define TRIDENT_ISA_CLONES(ret, name, params, args)                          \
  TRIDENT_TARGET_V4 static ret name##_v4 params { return name##_body args; } \
  TRIDENT_TARGET_V3 static ret name##_v3 params { return name##_body args; } \
  static ret name##_v1 params { return name##_body args; }                   \
  static ret(*const name##_clones[3]) params = {name##_v1, name##_v3, name##_v4}
#define TRIDENT_ISA_CALL(name, args) name##_clones[::trident::kernels::cpu::detail::clone_index()] args

namespace trident::kernels::cpu::detail {

// The active ISA level as an int (isa.h's Isa); -1 until first use, when init_isa() reads TRIDENT_ISA.
extern std::atomic<int> g_isa;
int init_isa();
inline int isa_level() {
  const int v = g_isa.load(std::memory_order_relaxed);
  return v >= 0 ? v : init_isa();
}
// The clone of TRIDENT_ISA_CLONES a level runs: 0 baseline, 1 x86-64-v3, 2 x86-64-v4 (avx512 and up).
inline int clone_index() {
  const int l = isa_level();
  return l >= 2 ? 2 : l;
}

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

// exp(x) for float: range reduction x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial; relative error
// about 2e-7 (within 2 ulp); 0 below -87.3 (so exp(-inf) = 0), clamped at 88.7 (no inf, no denormals).
// Vectorizes (no libm call).
inline float fast_exp(float x) {
  // Below -87.3 the result is 0 (exp(-inf) in a softmax over a padded vocabulary must give exactly 0).
  const bool under = x < -87.3f;
  x = under ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  const float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float t = x * 1.44269504088896341f + kShift;
  float n = t - kShift;
  float r = x - n * 0.693145751953125f;  // ln2 hi
  r = r - n * 1.42860682030941723e-06f;    // ln2 lo
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return under ? 0.0f : p * bits_to_float(e);
}

// erf(x) given e = exp(-x*x), Abramowitz & Stegun 7.1.26: absolute error <= 1.5e-7. Vectorizes.
inline float erf_with_exp(float x, float e) {
  // |x| as fabs (a mask), not x < 0 ? -x : x: from the select GCC derived the polynomial and its division
  // once per sign and blended, twice the work. Equal for every x, -0 and NaN included.
  float ax = std::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float y = 1.061405429f;
  y = y * t - 1.453152027f;
  y = y * t + 1.421413741f;
  y = y * t - 0.284496736f;
  y = y * t + 0.254829592f;
  y = 1.0f - y * t * e;
  return x < 0 ? -y : y;
}
inline float fast_erf(float x) { return erf_with_exp(x, fast_exp(-x * x)); }

// tanh(u) = 1 - 2 / (exp(2u) + 1).
inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

}  // namespace trident::kernels::cpu::detail
