// Vectorized reduction kernels.
//
// One generic loop per (type, op, operand form), written so GCC's -O3 vectorizer turns it into SIMD; the
// loops are force-inlined into non-template wrappers compiled three times by target_clones (x86-64-v4 =
// AVX-512, x86-64-v3 = AVX2+FMA+F16C, baseline SSE2), and the dynamic loader picks the best clone for the
// CPU. bfloat16 converts with integer shifts and a branch-free round-to-nearest-even that matches
// dtype.h's float_to_bf16 bit for bit (NaN included). float16 has no vectorizable scalar conversion in
// GCC 12, so it uses F16C intrinsics (8 or 16 lanes) in functions chosen at startup, and the scalar
// dtype.h conversions on CPUs without F16C. Results are identical to the scalar definitions in dtype.h
// and reduce.h: every op is applied to the same operands in the same order, and each half-precision
// result is rounded once (tests/unit/algorithms/reduce_test.cc checks every dtype x op bitwise).
#include "trident/comm/reduce.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdint>

#include "trident/core/error.h"

namespace trident {
namespace {

#define TRIDENT_INLINE inline __attribute__((always_inline))
// Not under a sanitizer: the loader runs an ifunc resolver while relocating, before the sanitizer's runtime
// is up, and ThreadSanitizer's instrumentation of the resolver then crashes the program before main (the
// same rule as kernels/cpu/simd.h). Sanitizer builds check the one generic loop instead.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TRIDENT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TRIDENT_CLONES
#endif

struct Sum {
  template <class T>
  static TRIDENT_INLINE T f(T a, T b) { return a + b; }
};
struct Prod {
  template <class T>
  static TRIDENT_INLINE T f(T a, T b) { return a * b; }
};
struct Max {
  template <class T>
  static TRIDENT_INLINE T f(T a, T b) { return a > b ? a : b; }
};
struct Min {
  template <class T>
  static TRIDENT_INLINE T f(T a, T b) { return a < b ? a : b; }
};

// Operand forms (the pattern of run_form works for any element "type" whose Op::f combines two elements). The restrict-qualified pointers never alias: the callers below route dst == a and
// dst == b to the two-operand forms, which keep the operand order of `a op b`.
template <class T, class Op>
TRIDENT_INLINE void loop3(T* __restrict__ d, const T* __restrict__ a, const T* __restrict__ b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Op::f(a[i], b[i]);
}
template <class T, class Op>
TRIDENT_INLINE void loop_d_op_b(T* __restrict__ d, const T* __restrict__ b, size_t n) {  // d = d op b
  for (size_t i = 0; i < n; ++i) d[i] = Op::f(d[i], b[i]);
}
template <class T, class Op>
TRIDENT_INLINE void loop_a_op_d(T* __restrict__ d, const T* __restrict__ a, size_t n) {  // d = a op d
  for (size_t i = 0; i < n; ++i) d[i] = Op::f(a[i], d[i]);
}

enum class Form { kThree, kDstIsA, kDstIsB, kAllSame };

template <class T, class Op>
TRIDENT_INLINE void run_form(T* d, const T* a, const T* b, size_t n, Form form) {
  switch (form) {
    case Form::kThree: return loop3<T, Op>(d, a, b, n);
    case Form::kDstIsA: return loop_d_op_b<T, Op>(d, b, n);
    case Form::kDstIsB: return loop_a_op_d<T, Op>(d, a, n);
    case Form::kAllSame:
      for (size_t i = 0; i < n; ++i) d[i] = Op::f(d[i], d[i]);
      return;
  }
}

template <class T>
TRIDENT_INLINE void run_op(T* d, const T* a, const T* b, size_t n, ReduceOp op, Form form) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return run_form<T, Sum>(d, a, b, n, form);
    case ReduceOp::kProd: return run_form<T, Prod>(d, a, b, n, form);
    case ReduceOp::kMax: return run_form<T, Max>(d, a, b, n, form);
    case ReduceOp::kMin: return run_form<T, Min>(d, a, b, n, form);
  }
}

TRIDENT_CLONES void reduce_f32(float* d, const float* a, const float* b, size_t n, ReduceOp op, Form form) {
  run_op(d, a, b, n, op, form);
}
TRIDENT_CLONES void reduce_f64(double* d, const double* a, const double* b, size_t n, ReduceOp op, Form form) {
  run_op(d, a, b, n, op, form);
}
TRIDENT_CLONES void reduce_i32(int32_t* d, const int32_t* a, const int32_t* b, size_t n, ReduceOp op, Form form) {
  run_op(d, a, b, n, op, form);
}
TRIDENT_CLONES void reduce_i64(int64_t* d, const int64_t* a, const int64_t* b, size_t n, ReduceOp op, Form form) {
  run_op(d, a, b, n, op, form);
}

// ---- bfloat16: widen by shifting, combine in float, round to nearest even (NaN -> quiet NaN).
TRIDENT_INLINE float bf16_widen(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
TRIDENT_INLINE uint16_t bf16_round(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// The bfloat16 combine of one element, as a "type" for run_form: widen, combine in float, round once.
template <class Op>
struct Bf16 {
  static TRIDENT_INLINE uint16_t f(uint16_t a, uint16_t b) { return bf16_round(Op::f(bf16_widen(a), bf16_widen(b))); }
};

TRIDENT_CLONES void reduce_bf16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n, ReduceOp op, Form form) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return run_form<uint16_t, Bf16<Sum>>(d, a, b, n, form);
    case ReduceOp::kProd: return run_form<uint16_t, Bf16<Prod>>(d, a, b, n, form);
    case ReduceOp::kMax: return run_form<uint16_t, Bf16<Max>>(d, a, b, n, form);
    case ReduceOp::kMin: return run_form<uint16_t, Bf16<Min>>(d, a, b, n, form);
  }
}

// ---- float16 via F16C.
template <class Op>
TRIDENT_INLINE void fp16_scalar_loop(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = float_to_fp16(Op::f(fp16_to_float(a[i]), fp16_to_float(b[i])));
}

template <class Op>
__attribute__((target("arch=x86-64-v3"))) void fp16_avx2(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    __m256 z;
    if constexpr (std::is_same_v<Op, Sum>) z = _mm256_add_ps(x, y);
    else if constexpr (std::is_same_v<Op, Prod>) z = _mm256_mul_ps(x, y);
    else if constexpr (std::is_same_v<Op, Max>) z = _mm256_max_ps(x, y);  // x > y ? x : y, as Max::f
    else z = _mm256_min_ps(x, y);                                         // x < y ? x : y, as Min::f
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(z, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) {
    const float x = _cvtsh_ss(a[i]), y = _cvtsh_ss(b[i]);
    d[i] = _cvtss_sh(Op::f(x, y), _MM_FROUND_TO_NEAREST_INT);
  }
}

// GCC 12 warns inside avx512fintrin.h about the deliberately undefined source of _mm512_cvtph_ps.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <class Op>
__attribute__((target("arch=x86-64-v4"))) void fp16_avx512(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)));
    const __m512 y = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)));
    __m512 z;
    if constexpr (std::is_same_v<Op, Sum>) z = _mm512_add_ps(x, y);
    else if constexpr (std::is_same_v<Op, Prod>) z = _mm512_mul_ps(x, y);
    else if constexpr (std::is_same_v<Op, Max>) z = _mm512_max_ps(x, y);
    else z = _mm512_min_ps(x, y);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm512_cvtps_ph(z, _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) fp16_avx2<Op>(d + i, a + i, b + i, n - i);
}
#pragma GCC diagnostic pop

using Fp16Kernel = void (*)(uint16_t*, const uint16_t*, const uint16_t*, size_t);
template <class Op>
void fp16_scalar(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
  fp16_scalar_loop<Op>(d, a, b, n);
}
template <class Op>
Fp16Kernel pick_fp16() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
    return &fp16_avx512<Op>;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &fp16_avx2<Op>;  // F16C implied
  return &fp16_scalar<Op>;
}

void reduce_fp16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n, ReduceOp op) {
  // Vector loads of a and b happen before the store of d for each group of lanes, so d may equal a or b.
  static const Fp16Kernel kernels[4] = {pick_fp16<Sum>(), pick_fp16<Prod>(), pick_fp16<Max>(), pick_fp16<Min>()};
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return kernels[0](d, a, b, n);
    case ReduceOp::kProd: return kernels[1](d, a, b, n);
    case ReduceOp::kMax: return kernels[2](d, a, b, n);
    case ReduceOp::kMin: return kernels[3](d, a, b, n);
  }
}

template <class T>
void dispatch(void (*fn)(T*, const T*, const T*, size_t, ReduceOp, Form), void* dst, const void* a, const void* b,
              size_t n, ReduceOp op) {
  auto* d = static_cast<T*>(dst);
  auto* pa = static_cast<const T*>(a);
  auto* pb = static_cast<const T*>(b);
  Form form = Form::kThree;
  if (d == pa && d == pb) form = Form::kAllSame;
  else if (d == pa) form = Form::kDstIsA;
  else if (d == pb) form = Form::kDstIsB;
  else if (pa == pb) return fn(d, pa, pa, n, op, Form::kThree);  // reads only: aliasing is harmless
  fn(d, pa, pb, n, op, form);
}

}  // namespace

bool reduce_supported(DType dtype, ReduceOp op) { return dtype != DType::kUInt8; }

void reduce_into3(void* dst, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  if (n == 0) return;
  switch (dtype) {
    case DType::kFloat32: return dispatch<float>(&reduce_f32, dst, a, b, n, op);
    case DType::kFloat64: return dispatch<double>(&reduce_f64, dst, a, b, n, op);
    case DType::kInt32: return dispatch<int32_t>(&reduce_i32, dst, a, b, n, op);
    case DType::kInt64: return dispatch<int64_t>(&reduce_i64, dst, a, b, n, op);
    case DType::kBFloat16: return dispatch<uint16_t>(&reduce_bf16, dst, a, b, n, op);
    case DType::kFloat16:
      return reduce_fp16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n, op);
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
