// Shared-memory fast path ("shm"): collectives that run through the group's ShmWindow (transport/shm.h)
// instead of messages, when every rank of the group is on this host and reached over shared memory.
// Ownership: stateless functions; the window (owned by the group's shm segment) keeps the phase state.
// Blocking: run() returns when this rank's part is done; waits spin briefly, then sleep on the doorbell,
// with the collective's deadline, the peers' liveness and the abort flag checked while asleep.
// Thread-safety: the group's executing thread only. When the context has no window (TCP, several
// hosts, a subcontext), run() falls back to the message-based algorithm named in each struct.
//
// all_reduce leaves bitwise the same result on every rank; it takes the latency path up to
// ShmWindow::kSlotBytes and the staged bandwidth path above, allocating nothing per call.
// docs/ARCHITECTURE.md ("Shared-memory collectives") gives both paths and the bytes each moves.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trident/comm/algorithms/algorithm.h"

namespace trident {

struct AllReduceShm {  // fallback: ring
  static void run(AlgoContext& ctx, const CollArgs& a);
};

struct BroadcastShm {  // small payloads only; fallback: tree
  static bool applicable(const CollArgs& a, int world);
  static void run(AlgoContext& ctx, const CollArgs& a);
};

// Hook for the single-copy path (shm_cma.h): the staged bandwidth path of all_reduce on a window the caller
// already began (ctx.shm_window()); a.send non-null and not partially overlapping a.recv.
void all_reduce_shm_staged(ShmWindow& w, const AlgoContext& ctx, const CollArgs& a);

// Copies n bytes with non-temporal stores (no read-for-ownership of output lines this rank never read);
// the caller orders them (sfence) before publishing. Used by the staged path and by shm_cma.
void shm_stream_copy(uint8_t* dst, const uint8_t* src, size_t n);

}  // namespace trident
