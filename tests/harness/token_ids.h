// Token-id sequences in test failures: where two sequences first differ, with the ids there, so a tokenizer
// test against a reference names the position instead of printing two long lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace trident::testing {

inline std::string first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  if (i == a.size() && i == b.size()) return "equal";
  return fmt::format("sizes {} vs {}, first difference at {}: {} vs {}", a.size(), b.size(), i,
                     i < a.size() ? a[i] : -1, i < b.size() ? b[i] : -1);
}

}  // namespace trident::testing
