// The collective sweep: every collective x algorithm x dtype x reduce op x count (0, 1, 7, 1023 and
// 1M+3) x root on one process group, each element checked against a reference the rank computes
// independently, in closed form, from seeded small-integer inputs (exact in any order). Failures throw
// (through testing::rank_fail) naming the collective, algorithm, dtype, op, count, root and element.
// Shared by the native backend's tests (shm, tcp) and the MPI backend's (under mpirun).
#pragma once

#include "trident/comm/process_group.h"

namespace trident::testing {

struct SweepOptions {
  bool all_algorithms = true;  // also force each algorithm by name (backends without them: false)
  bool large = true;           // include the 1M+3-element runs
  bool shared_buffers = false;  // every buffer from pg.alloc_shared() (registered memory) where the group has it
};

// True in the sanitizer builds of scripts/test.sh. They run the per-world sweeps without the 1M+3-element
// runs (many times slower there, and the same code as 1023 elements with more chunks); the small-buffer
// sweep keeps them, as it wraps the shared-memory ring and crosses chunk boundaries many times per message.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

void run_collective_sweep(ProcessGroup& pg, const SweepOptions& opts = {});

}  // namespace trident::testing
