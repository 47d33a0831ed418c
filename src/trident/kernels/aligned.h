// 64-byte aligned float storage for activations and flat parameter buffers (cache-line and AVX-512
// aligned). Ownership: the vector owns its memory. Not thread-safe; no blocking.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace trident::kernels {

inline constexpr size_t kAlignment = 64;

template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlignment))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(kAlignment)); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
};

using AlignedFloats = std::vector<float, AlignedAllocator<float>>;

// Rounds n elements of float up to a whole number of 64-byte lines.
inline size_t align_floats(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace trident::kernels
