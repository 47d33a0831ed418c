// Test helper: the entries of a device's op table (kernels/device.h) that are null. The tables are written
// with designated initializers, so an entry left out compiles to a null pointer; this finds it by reading the
// table's object representation, every pointer-sized word after the `device` member.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "trident/kernels/device.h"

namespace trident::testing {

// DeviceOps holds `device` and then only function pointers: no padding between or after them.
static_assert(offsetof(kernels::DeviceOps, alloc) % sizeof(void*) == 0);
static_assert((sizeof(kernels::DeviceOps) - offsetof(kernels::DeviceOps, alloc)) % sizeof(void*) == 0,
              "DeviceOps after `device` must be function pointers only");
static_assert(sizeof(void (*)()) == sizeof(uintptr_t));

// Indices (0 = alloc, in declaration order) of the null entries of `ops`; empty when every entry is set.
inline std::vector<size_t> null_op_entries(const kernels::DeviceOps& ops) {
  constexpr size_t kFirst = offsetof(kernels::DeviceOps, alloc);
  constexpr size_t kCount = (sizeof(kernels::DeviceOps) - kFirst) / sizeof(uintptr_t);
  uintptr_t words[kCount];
  std::memcpy(words, reinterpret_cast<const unsigned char*>(&ops) + kFirst, sizeof(words));
  std::vector<size_t> out;
  for (size_t i = 0; i < kCount; ++i)
    if (words[i] == 0) out.push_back(i);
  return out;
}

// The number of entries (function pointers) in a table.
inline constexpr size_t op_table_entries() {
  return (sizeof(kernels::DeviceOps) - offsetof(kernels::DeviceOps, alloc)) / sizeof(uintptr_t);
}

}  // namespace trident::testing
