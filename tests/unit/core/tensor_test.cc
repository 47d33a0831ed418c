// Tensor: shapes, views sharing storage, conversions between float dtypes (against the scalar rounding
// functions of core/dtype.h and hand-computed bit patterns), and the errors bad uses get.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "harness/temp_dir.h"
#include "trident/core/tensor.h"

namespace trident {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tensor, ZerosIsAlignedZeroFilledAndShaped) {
  for (auto shape : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {7}, {3, 5}, {2, 0, 4}, {13, 17}}) {
    Tensor t = Tensor::zeros(shape, DType::kFloat32);
    int64_t n = 1;
    for (auto d : shape) n *= d;
    EXPECT_EQ(t.numel(), n);
    EXPECT_EQ(t.nbytes(), static_cast<size_t>(n) * 4);
    EXPECT_EQ(t.shape(), shape);
    if (n > 0) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
    }
  }
  EXPECT_EQ(Tensor::zeros({3, 4}, DType::kBFloat16).nbytes(), 24u);
  EXPECT_EQ(Tensor::zeros({3, 4}, DType::kBFloat16).describe(), "bfloat16[3, 4] cpu");
}

TEST(Tensor, ViewsReshapesAndRowsShareStorage) {
  std::vector<float> buf(12);
  for (int i = 0; i < 12; ++i) buf[i] = static_cast<float>(i);
  Tensor v = Tensor::view(buf.data(), {3, 4});
  Tensor r = v.reshape({2, 6});
  EXPECT_EQ(r.size(0), 2);
  EXPECT_EQ(r.size(-1), 6);
  Tensor rows = v.rows(1, 3);  // rows 1 and 2 of [3, 4]
  EXPECT_EQ(rows.shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(rows.data<float>()[0], 4.0f);
  rows.data<float>()[0] = -1.0f;
  EXPECT_EQ(buf[4], -1.0f);
  EXPECT_EQ(v.rows(3, 3).numel(), 0);
  // An owned tensor stays alive through its views.
  Tensor tail;
  {
    Tensor owned = Tensor::zeros({4, 2});
    owned.data<float>()[7] = 9.0f;
    tail = owned.rows(3, 4);
  }
  EXPECT_EQ(tail.data<float>()[1], 9.0f);
}

TEST(Tensor, ConversionsRoundToNearestEvenLikeTheKernels) {
  // Values that need rounding to bfloat16, ties included, plus specials.
  std::vector<float> src = {1.0f, 1.00390625f /* tie: rounds to even 1.0 */, 1.01171875f /* tie: up to 1.015625 */,
                            -2.5f, 3.14159265f, 1e-30f, 65504.0f, std::numeric_limits<float>::infinity(), 0.0f,
                            -0.0f, 1e20f};
  Tensor f32 = Tensor::view(src.data(), {static_cast<int64_t>(src.size())});
  Tensor b16 = f32.to(DType::kBFloat16);
  Tensor f16 = f32.to(DType::kFloat16);
  Tensor f64 = f32.to(DType::kFloat64);
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(b16.data<uint16_t>()[i], float_to_bf16(src[i])) << i;
    EXPECT_EQ(f16.data<uint16_t>()[i], float_to_fp16(src[i])) << i;
    EXPECT_EQ(f64.data<double>()[i], static_cast<double>(src[i])) << i;
  }
  EXPECT_EQ(b16.data<uint16_t>()[0], 0x3f80);  // 1.0
  EXPECT_EQ(b16.data<uint16_t>()[1], 0x3f80);  // the tie went to even
  EXPECT_EQ(b16.data<uint16_t>()[2], 0x3f82);  // the tie went up to even
  // Back to float32: bfloat16 -> float32 is exact.
  Tensor back = b16.to(DType::kFloat32);
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(back.data<float>()[i], bf16_to_float(float_to_bf16(src[i])));
  // float16 overflow saturates to infinity as _Float16 does; NaN stays NaN.
  float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor n = Tensor::view(&nan, {1}).to(DType::kBFloat16).to(DType::kFloat32);
  EXPECT_TRUE(std::isnan(n.data<float>()[0]));
  EXPECT_TRUE(std::isinf(f16.to(DType::kFloat32).data<float>()[10]));
}

TEST(Tensor, BadUsesAreNamed) {
  Tensor t = Tensor::zeros({2, 3}, DType::kBFloat16);
  EXPECT_CONTAINS(error_of([&] { (void)t.data<float>(); }), "tensor bfloat16[2, 3] cpu accessed as float32");
  EXPECT_CONTAINS(error_of([&] { (void)t.reshape({4, 2}); }), "cannot reshape tensor bfloat16[2, 3] cpu (6 elements)");
  EXPECT_CONTAINS(error_of([&] { (void)t.rows(1, 3); }), "rows [1, 3) are outside [0, 2)");
  EXPECT_CONTAINS(error_of([&] { (void)t.size(2); }), "dimension 2 is out of range");
  EXPECT_CONTAINS(error_of([&] { (void)Tensor::zeros({2, -1}); }), "negative dimension");
  EXPECT_CONTAINS(error_of([&] { (void)Tensor::zeros({2}, DType::kInt32).to(DType::kFloat32); }),
                  "conversions are among float32, float64, bfloat16 and float16 only");
  int dummy = 0;
  Tensor dev = Tensor::view(&dummy, {1}, DType::kInt32, Device::kCUDA);
  EXPECT_CONTAINS(error_of([&] { (void)dev.to(DType::kInt32); }), "runs on CPU tensors only");
  int freed = 0;
  {
    Tensor ext = Tensor::from_external(&dummy, {1}, DType::kInt32, Device::kCPU, [&](void*) { ++freed; });
    Tensor alias = ext;
  }
  EXPECT_EQ(freed, 1);
}

}  // namespace
}  // namespace trident
