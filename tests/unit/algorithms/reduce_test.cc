// The vectorized reduce kernels against a naive per-element reference written here from dtype.h's
// conversions: every dtype x op x operand form (dst == a, dst == b, distinct, all three equal) x length
// (vector bodies and tails) x alignment, with random values including infinities, signed zeros,
// denormals and NaN. Results must be identical bit for bit (any NaN matching any NaN).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "trident/comm/reduce.h"
#include "trident/core/error.h"

namespace trident {
namespace {

template <class T>
T ref_op(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMax: return a > b ? a : b;
    case ReduceOp::kMin: return a < b ? a : b;
  }
  return a;
}

// Reference for element i: returns the bits of `a op b` in `dtype`.
uint64_t ref_bits(DType t, ReduceOp op, const void* a, const void* b, size_t i) {
  switch (t) {
    case DType::kFloat32: {
      const float r = ref_op(op, static_cast<const float*>(a)[i], static_cast<const float*>(b)[i]);
      return std::bit_cast<uint32_t>(r);
    }
    case DType::kFloat64: {
      const double r = ref_op(op, static_cast<const double*>(a)[i], static_cast<const double*>(b)[i]);
      return std::bit_cast<uint64_t>(r);
    }
    case DType::kInt32:
      return static_cast<uint32_t>(ref_op(op, static_cast<const int32_t*>(a)[i], static_cast<const int32_t*>(b)[i]));
    case DType::kInt64:
      return static_cast<uint64_t>(ref_op(op, static_cast<const int64_t*>(a)[i], static_cast<const int64_t*>(b)[i]));
    case DType::kBFloat16:
      return float_to_bf16(ref_op(op, bf16_to_float(static_cast<const uint16_t*>(a)[i]),
                                  bf16_to_float(static_cast<const uint16_t*>(b)[i])));
    case DType::kFloat16:
      return float_to_fp16(ref_op(op, fp16_to_float(static_cast<const uint16_t*>(a)[i]),
                                  fp16_to_float(static_cast<const uint16_t*>(b)[i])));
    case DType::kUInt8: break;
  }
  return 0;
}

uint64_t bits_at(DType t, const void* p, size_t i) {
  switch (dtype_size(t)) {
    case 2: return static_cast<const uint16_t*>(p)[i];
    case 4: return static_cast<const uint32_t*>(p)[i];
    case 8: return static_cast<const uint64_t*>(p)[i];
  }
  return 0;
}

bool is_nan_bits(DType t, uint64_t bits) {
  switch (t) {
    case DType::kFloat32: return std::isnan(std::bit_cast<float>(static_cast<uint32_t>(bits)));
    case DType::kFloat64: return std::isnan(std::bit_cast<double>(bits));
    case DType::kBFloat16: return std::isnan(bf16_to_float(static_cast<uint16_t>(bits)));
    case DType::kFloat16: return std::isnan(fp16_to_float(static_cast<uint16_t>(bits)));
    default: return false;
  }
}

// Random values with specials mixed in; integers stay small enough that sum and prod never overflow.
void fill(DType t, void* p, size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> real(-1000.0, 1000.0);
  auto special = [&](double v) -> double {
    switch (rng() % 16) {
      case 0: return std::numeric_limits<double>::infinity();
      case 1: return -std::numeric_limits<double>::infinity();
      case 2: return std::numeric_limits<double>::quiet_NaN();
      case 3: return 0.0;
      case 4: return -0.0;
      case 5: return 1e-41;   // float denormal (bf16 denormal too)
      case 6: return 3e-6;    // float16 denormal
      case 7: return 70000.0;  // overflows float16
      default: return v;
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const double v = special(real(rng));
    switch (t) {
      case DType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
      case DType::kFloat64: static_cast<double*>(p)[i] = v; break;
      case DType::kBFloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
      case DType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_fp16(static_cast<float>(v)); break;
      case DType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(rng() % 60001) - 30000; break;
      case DType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(rng() % 2000000001) - 1000000000; break;
      case DType::kUInt8: break;
    }
  }
}

TEST(ReduceKernels, MatchTheScalarDefinitionBitForBit) {
  std::mt19937_64 rng(42);
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16, DType::kInt32, DType::kInt64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin};
  const size_t lengths[] = {1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 65, 511, 512, 513, 1000, 4099};
  enum Form { kThree, kDstIsA, kDstIsB, kAllSame };
  int failures = 0;
  for (DType t : dtypes) {
    const size_t es = dtype_size(t);
    for (ReduceOp op : ops) {
      for (size_t n : lengths) {
        for (size_t misalign : {0, 1}) {
          for (Form form : {kThree, kDstIsA, kDstIsB, kAllSame}) {
            std::vector<unsigned char> A((n + 2) * es), B((n + 2) * es), D((n + 2) * es, 0x5a);
            void* a = A.data() + misalign * es;
            void* b = B.data() + misalign * es;
            fill(t, a, n, rng);
            fill(t, b, n, rng);
            if (form == kAllSame) std::memcpy(b, a, n * es);
            const std::vector<unsigned char> a0 = A, b0 = B;
            void* d = D.data() + misalign * es;
            if (form == kDstIsA) d = a;
            if (form == kDstIsB) d = b;
            if (form == kAllSame) d = b = a;
            reduce_into3(d, a, b, n, t, op);
            const void* ra = a0.data() + misalign * es;
            const void* rb = (form == kAllSame ? a0 : b0).data() + misalign * es;
            for (size_t i = 0; i < n; ++i) {
              const uint64_t want = ref_bits(t, op, ra, rb, i), got = bits_at(t, d, i);
              if (want == got || (is_nan_bits(t, want) && is_nan_bits(t, got))) continue;
              ADD_FAILURE() << fmt::format("{} {} n={} misalign={} form={}: element {} is 0x{:x}, want 0x{:x}",
                                           dtype_name(t), reduce_op_name(op), n, misalign, static_cast<int>(form), i,
                                           got, want);
              if (++failures > 10) return;
              break;
            }
          }
        }
      }
    }
  }
}

TEST(ReduceKernels, ReduceIntoIsDstOpSrcAndZeroLengthIsANoOp) {
  float d[3] = {1, 5, -2}, s[3] = {4, 2, -3};
  reduce_into(d, s, 3, DType::kFloat32, ReduceOp::kMax);
  EXPECT_EQ(d[0], 4);
  EXPECT_EQ(d[1], 5);
  EXPECT_EQ(d[2], -2);
  reduce_into(nullptr, nullptr, 0, DType::kFloat32, ReduceOp::kSum);
}

TEST(ReduceKernels, Uint8HasNoArithmetic) {
  uint8_t d[2] = {}, s[2] = {};
  EXPECT_FALSE(reduce_supported(DType::kUInt8, ReduceOp::kSum));
  EXPECT_TRUE(reduce_supported(DType::kBFloat16, ReduceOp::kProd));
  EXPECT_THROW(reduce_into(d, s, 2, DType::kUInt8, ReduceOp::kSum), InvalidArgument);
}

}  // namespace
}  // namespace trident
