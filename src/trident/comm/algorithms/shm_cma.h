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
// Every call publishes buffer addresses in the window, checks the fingerprints, moves the data, then
// waits in a "done" phase so no rank reuses its buffers while a peer may still touch them; all_reduce
// leaves bitwise the same result on every rank, in place or not. docs/ARCHITECTURE.md ("Single-copy
// collectives") gives each op's data movement and when it hands over to the staged "shm" path.
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
