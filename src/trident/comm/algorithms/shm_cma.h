// Single-copy path ("cma"): collectives between the ranks of one host that move bytes straight between
// the ranks' own buffers with Linux cross-memory attach (process_vm_readv / process_vm_writev), with no
// staging copy through shared memory. The group's ShmWindow (transport/shm.h) carries the buffer
// addresses and the phases.
//
// Ownership: stateless functions; the window keeps the phase state and whether CMA works (cma_state).
// Blocking: run() returns when this rank's part is done and no peer touches its buffers any more; waits
// spin briefly, then sleep on the doorbell, with the deadline, the peers' liveness and the abort flag
// checked while asleep (the window's wait). A failed access to a peer's memory becomes PeerDiedError
// when the peer is gone (NetworkError otherwise), on every local rank.
// Thread-safety: the group's executing thread only.
//
// Protocol of every call: (1) each rank writes its buffer addresses into its window slot and publishes;
// after the wait every rank checks the fingerprints (same collective on every rank). The first call of a
// window also probes CMA: each rank reads a token from every peer's memory and publishes whether that
// worked; CMA is used only if it worked between every pair (else every rank takes the fallback, with one
// TRIDENT_DEBUG=comm line). (2) the data movement below. (3) a "done" phase: nobody returns (and lets its
// caller reuse the buffers) while a peer may still read or write them.
//
// all_reduce (n local ranks; block b = block_partition(count, n, b) is reduced by rank b): in chunks of
//   at most chunk_bytes (default 256 KiB, L2-resident), rank b reads block b's chunk of every peer's
//   input into a scratch buffer (one kernel copy), reduces it with its own input into its output, then
//   writes that chunk (still in cache) into every peer's output (one kernel copy). Every block is reduced
//   once, so every rank holds bitwise the same result. Memory traffic per rank per byte of buffer: reads
//   its own input's block (1/n) and the peers' blocks ((n-1)/n): 1; writes its output block (1/n) and the
//   peers' output blocks ((n-1)/n): 1. Minimal: all n inputs must be read once and all n outputs written
//   once, n + n bytes for n ranks. In place works (only rank b touches block b anywhere, and it reads a
//   chunk from every peer before writing it back). Once the call's footprint (2 n bytes) passes a quarter
//   of the last-level cache, when some rank is out of place and its output is not a ShmBuffer, every
//   rank takes the staged "shm" path instead (the kernel writes output lines it does not hold in cache,
//   with a read for ownership each: measured slower than staging; while they stay cached it is faster).
//   Registered buffers (transport/shm_buffer.h): a peer's ShmBuffer is mapped and read/written in place
//   with plain loads and stores instead of the kernel copies (zero copy).
// reduce_scatter: as all_reduce's first half: rank r reads block r of every peer's input, reduces into recv
//   (out of place and out of cache: through a cached buffer, then streamed into recv).
// all_gather: rank r copies its own input into recv block r (with non-temporal stores once the call
//   leaves the cache) and reads every peer's input into block p.
// broadcast: every non-root reads the root's buffer into its own (one copy); past 1 MiB the staged "shm"
//   broadcast instead (measured faster there: the kernel writes lines it does not hold in cache).
// Fallbacks: one rank or count 0: nothing to move; no window (TCP, several hosts, a subcontext): the
// message-based algorithm (all_reduce: as "shm"; reduce_scatter, all_gather: ring; broadcast: tree);
// CMA refused (EPERM/ENOSYS, another pid namespace, TRIDENT_CMA=0): all_reduce takes the staged "shm"
// path on the window, the others their message-based algorithm.
#pragma once

#include "trident/comm/algorithms/algorithm.h"

namespace trident {

struct AllReduceCma {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

struct ReduceScatterCma {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

struct AllGatherCma {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

struct BroadcastCma {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

}  // namespace trident
