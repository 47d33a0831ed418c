// Shared-memory fast path ("shm"): collectives that run through the group's ShmWindow (transport/shm.h)
// instead of messages, when every rank of the group is on this host and reached over shared memory.
// Ownership: stateless functions; the window (owned by the group's shm segment) keeps the phase state.
// Blocking: run() returns when this rank's part is done; waits spin briefly, then sleep on the doorbell,
// with the collective's deadline, the peers' liveness and the abort flag checked while asleep.
// Thread-safety: the group's executing thread only. When the context has no window (TCP, several
// hosts, a subcontext), run() falls back to the message-based algorithm named in each struct.
//
// all_reduce:
//   latency path (bytes <= ShmWindow::kSlotBytes): copy the input into this rank's slot, publish one
//   phase, wait for every peer's phase, reduce all slots in rank order into the output (bitwise identical
//   on every rank). One round trip, no "done reading" phase (a slot is rewritten two slot calls later,
//   when every peer has necessarily read it), no syscalls unless a rank must sleep.
//   bandwidth path: rounds of at most stage_bytes() (double-buffered, reused: no allocation, no page
//   faults). Per round each rank copies the blocks it does not own into its staging buffer; the owner of
//   block b reduces its own input block with every peer's staged copy of b into its staging block b and
//   its output; every rank then copies the other reduced blocks from their owners' staging buffers.
//   Bytes moved per rank per byte of buffer (n ranks): copy-in (n-1)/n read and written; reduce reads 1,
//   writes 1/n to staging, then copies that 1/n (cache-hot) to the output; gather (n-1)/n read and written:
//   3 - 2/n read from memory, 2 written (n = 2: 2 + 2). Without registered user buffers this is the
//   minimum: peers cannot read private memory, so each rank must write what others reduce ((n-1)/n) and
//   its reduced block (1/n) into shared memory, write its whole output (1), and read its input (1) and
//   what the others staged for it and reduced for it.
// broadcast: the root's payload through its slot (<= kSlotBytes) or, in rounds, its staging buffers;
//   every other rank copies it out (one copy in, one copy out per receiver).
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
