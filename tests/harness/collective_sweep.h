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

void run_collective_sweep(ProcessGroup& pg, const SweepOptions& opts = {});

}  // namespace trident::testing
