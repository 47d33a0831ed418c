// For test binaries that allocate and free multi-megabyte buffers case after case (the collective sweeps):
// glibc maps each such buffer fresh from the kernel and returns it on free, so most of a sweep's CPU went to
// page faults, zeroing and munmap. Measured on the in-process algorithm sweep (reduce_*, 2-core AMD EPYC):
// 28.8 s of CPU (17.2 user + 11.6 system) before, 12.3 s after. Forked ranks inherit the setting.
// Use: `const bool kKeepFreedMemory = trident::testing::keep_freed_memory();` at namespace scope.
#pragma once

#include <malloc.h>

namespace trident::testing {

inline bool keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // buffers below 32 MiB come from the heap (glibc's largest threshold)
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and freed heap memory stays in the process for the next case
  return true;
}

}  // namespace trident::testing
