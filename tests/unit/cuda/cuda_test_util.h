// Helpers of the CUDA tests: skip without a GPU, random inputs, device round trips, tolerant comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "trident/cuda/device.h"

namespace trident::cuda::testing {

// Every CUDA test starts with this: without a usable GPU (CI, this build machine) the test is skipped and
// says why.
#define TRIDENT_REQUIRE_GPU()                                                                     \
  do {                                                                                            \
    if (::trident::cuda::device_count() == 0)                                                     \
      GTEST_SKIP() << "machine: needs a CUDA GPU: " << ::trident::cuda::no_device_reason();               \
  } while (0)

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> random_ints(size_t n, uint32_t seed, int lo, int hi_exclusive) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi_exclusive - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

// Checks |got - ref| <= rtol * max(|ref_i|, floor * max|ref|) elementwise: relative error, with a floor at
// a fraction of the array's largest magnitude so that entries that cancel to ~0 are judged on the array's
// scale. Returns the worst ratio |got-ref| / that denominator (printed by the tests).
inline double expect_close(const std::vector<float>& got, const std::vector<float>& ref, double rtol,
                           const std::string& what, double floor = 0.1) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  double max_abs = 0;
  for (float r : ref) max_abs = std::max(max_abs, std::fabs(static_cast<double>(r)));
  double worst = 0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const double denom = std::max({std::fabs(static_cast<double>(ref[i])), floor * max_abs, 1e-30});
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]) / denom;
    if (!(e <= rtol)) ++bad;
    if (!(e <= worst)) {
      worst = e;
      worst_i = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements off by more than " << rtol
                     << " relative; worst " << worst << " at " << worst_i << " (got " << got[worst_i] << ", want "
                     << ref[worst_i] << ")";
  return worst;
}

// A device copy of a host vector.
template <typename T>
DeviceBuffer<T> dev(const std::vector<T>& v) {
  DeviceBuffer<T> b(v.size());
  b.upload(v);
  return b;
}

}  // namespace trident::cuda::testing
