// The algorithm classes. Each is a stateless pattern of point-to-point steps over an AlgoContext (see
// algorithm.h for the contract of run() and the meaning of cost()). One class per .cc file in this folder,
// named after the class; registry.cc lists them all in algorithm_table().
//
// Ownership: none (static functions). Blocking: run() blocks until the collective is complete on this
// rank. Thread-safety: run() may be called concurrently on different contexts. Timeouts: enforced by the
// context, whose wait() throws.
#pragma once

#include "trident/comm/algorithms/algorithm.h"

namespace trident {
// ---- all_reduce
// ring: reduce-scatter then all-gather around a ring, pipelined in chunks; bandwidth-optimal.
struct AllReduceRing {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// rd: log2(n) full-buffer exchanges; latency-optimal for small messages; non-powers of two fold pairs first.
struct AllReduceRecursiveDoubling {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// rh: recursive-halving reduce-scatter + recursive-doubling all-gather (same fold as rd).
struct AllReduceRabenseifner {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// direct: each rank reduces its own block from every peer, then sends it to every peer (one host).
struct AllReduceDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// tree: pipelined binomial reduce to rank 0, then pipelined binomial broadcast.
struct AllReduceTree {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

// ---- broadcast
// tree: pipelined binomial tree from the root.
struct BroadcastTree {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// direct: the root sends to every rank.
struct BroadcastDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// ring: pipelined chain from the root (bandwidth-optimal for large messages).
struct BroadcastRing {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

// ---- reduce
// tree: pipelined binomial reduce to the root; non-roots accumulate in scratch.
struct ReduceTree {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// direct: the root receives and reduces every rank's buffer.
struct ReduceDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

// ---- all_gather
// ring: n-1 steps around a ring, pipelined in chunks.
struct AllGatherRing {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// direct: every rank sends its block to every rank.
struct AllGatherDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// rd: log2(n) doubling exchanges; powers of two only.
struct AllGatherRecursiveDoubling {
  static void run(AlgoContext& ctx, const CollArgs& a);
  static bool applicable(const CollArgs& a, int world);
};

// ---- all_gatherv
// ring: like all_gather ring with per-rank counts (zero counts allowed).
struct AllGatherVRing {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// direct: every rank sends its block to every rank.
struct AllGatherVDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

// ---- reduce_scatter
// ring: n-1 steps, double-buffered in scratch, pipelined in chunks.
struct ReduceScatterRing {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// direct: every rank receives its block from every rank and reduces it.
struct ReduceScatterDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// rh: log2(n) halving exchanges; powers of two only.
struct ReduceScatterRecursiveHalving {
  static void run(AlgoContext& ctx, const CollArgs& a);
  static bool applicable(const CollArgs& a, int world);
};

// ---- gather
// direct: every rank sends to the root.
struct GatherDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// tree: binomial; each rank forwards its subtree's blocks.
struct GatherTree {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

// ---- scatter
// direct: the root sends every rank its block.
struct ScatterDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// tree: binomial; each rank forwards its subtree's blocks.
struct ScatterTree {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

// ---- all_to_all
// pairwise: step k sends to (r+k)%n and receives from (r-k)%n.
struct AllToAllPairwise {
  static void run(AlgoContext& ctx, const CollArgs& a);
};
// direct: all sends and receives posted at once.
struct AllToAllDirect {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

// ---- barrier
// dissemination: ceil(log2 n) rounds of zero-byte messages to (r+2^k)%n.
struct BarrierDissemination {
  static void run(AlgoContext& ctx, const CollArgs& a);
};

}  // namespace trident
