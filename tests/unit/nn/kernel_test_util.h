// What the kernel tests of this folder share: the ISA levels this machine runs, the relative error of a
// float32 result against a float64 reference, and a bitwise comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "reference.h"
#include "trident/kernels/cpu/isa.h"

namespace kernel_test {

// The levels this machine runs, lowest first.
inline std::vector<trident::kernels::cpu::Isa> levels() {
  std::vector<trident::kernels::cpu::Isa> out;
  for (int i = 0; i <= static_cast<int>(trident::kernels::cpu::machine_isa()); ++i)
    out.push_back(static_cast<trident::kernels::cpu::Isa>(i));
  return out;
}

// max |got - want| / max(max |want|, floor).
inline double rel_err(const std::vector<float>& got, const ref::Vec& want, double floor = 1e-30) {
  double num = 0, den = floor;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

inline ref::Vec to_double(const std::vector<float>& v) { return ref::Vec(v.begin(), v.end()); }

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace kernel_test
