// What the kernel tests of this folder share: the ISA levels this machine runs, the relative error of a
// float32 result against a float64 reference, and a bitwise comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "reference.h"
#include "trident/kernels/cpu/isa.h"

namespace kernel_test {

// The levels this CPU lacks, lowest first ("" when it runs them all).
inline std::string levels_not_run() {
  namespace kc = trident::kernels::cpu;
  std::string out;
  for (int i = static_cast<int>(kc::machine_isa()) + 1; i <= static_cast<int>(kc::Isa::kAmx); ++i)
    out += std::string(out.empty() ? "" : ", ") + kc::isa_name(static_cast<kc::Isa>(i));
  return out;
}

// The levels this machine runs, lowest first. The first call says in the test output which levels this CPU
// cannot run, so a test that loops over these does not pass silently on less than every level (each level
// is also a sub-test of its own, IsaLevel.RunsOnThisCpu, skipped where the CPU lacks it).
inline std::vector<trident::kernels::cpu::Isa> levels() {
  namespace kc = trident::kernels::cpu;
  static const bool reported = [] {
    const std::string missing = levels_not_run();
    if (!missing.empty())
      std::printf("ISA levels not run on this CPU (their kernels are untested here): %s (CPU features: %s)\n",
                  missing.c_str(), kc::cpu_features().c_str());
    return true;
  }();
  (void)reported;
  std::vector<kc::Isa> out;
  for (int i = 0; i <= static_cast<int>(kc::machine_isa()); ++i) out.push_back(static_cast<kc::Isa>(i));
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
