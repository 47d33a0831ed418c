// Integers read from JSON that came from a file or a user, checked before they are converted. nlohmann's
// get<T> casts a float such as 1e300, or an integer outside T's range, with undefined behaviour; callers
// here get false instead and name the field in their own error.
// Thread-safety: pure functions. No blocking.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident::json_int {

// *out = v where v is a JSON integer that T holds exactly; false otherwise (floats, strings, out of range).
template <class T>
bool to_int(const nlohmann::json& v, T* out) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= 8);
  using L = std::numeric_limits<T>;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(L::max())) return false;
    *out = static_cast<T>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  const int64_t x = v.get<int64_t>();
  if constexpr (std::is_signed_v<T>) {
    if (x < static_cast<int64_t>(L::min()) || x > static_cast<int64_t>(L::max())) return false;
  } else {
    if (x < 0 || static_cast<uint64_t>(x) > static_cast<uint64_t>(L::max())) return false;
  }
  *out = static_cast<T>(x);
  return true;
}

// The same for every element of an array; false if v is not an array or any element fails.
template <class T>
bool to_ints(const nlohmann::json& v, std::vector<T>* out) {
  if (!v.is_array()) return false;
  out->assign(v.size(), T{});
  for (size_t i = 0; i < v.size(); ++i)
    if (!to_int(v[i], &(*out)[i])) return false;
  return true;
}

}  // namespace trident::json_int
