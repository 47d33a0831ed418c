// One record per collective (nccl-tests' struct testColl): what a call of each OpKind moves, from which
// buffers, with what bus factor, whether it takes a root, a reduction or a peer, and how a call is written
// in errors and logs. Validation and staging (comm/process_group.cc), the flight recorder, the cost model's
// users (the native backend and plan/comm_cost), the MPI and NCCL backends, the benchmark and the parallel
// layers' byte accounting read these facts here; none of them switches on the op for them.
// Pure data and pure functions: no ownership, no blocking, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trident/comm/types.h"

namespace trident {

// How many elements one side of a call spans, in the terms of CollArgs (count is per rank).
enum class Extent : uint8_t {
  kNone = 0,         // the side is not used
  kCount,            // count
  kCountTimesWorld,  // count x world: one block per rank
  kOwnCount,         // counts[rank] (all_gatherv's contribution)
  kTotalCount,       // sum(counts) (all_gatherv's result)
};

// busbw / algbw (nccl-tests' factors): what each rank must move per byte of the call's size, at the least.
enum class BusFactor : uint8_t {
  kNone = 0,          // barrier: no payload
  kOne,               // broadcast, reduce, send, recv: the whole size crosses one link
  kOneRankShort,      // (n-1)/n: all_gather(v), reduce_scatter, all_to_all, gather, scatter
  kTwiceOneRankShort, // 2(n-1)/n: all_reduce (a reduce-scatter then an all-gather)
};

struct CollectiveInfo {
  OpKind op;
  const char* name;     // "all_reduce": op_name(), parse_op(), describe(), the flight recorder's dumps
  bool rooted;          // takes a root rank (CollArgs::root)
  bool reduces;         // combines values with a ReduceOp (CollArgs::redop)
  bool point_to_point;  // send/recv: a peer and a tag, and no collective sequence number
  bool in_place;        // the call's one buffer is CollArgs::recv (all_reduce copies send into it first)
  // This rank's send and receive buffers: the elements the call reads from send and writes to recv, at the
  // root and elsewhere (equal for an unrooted op). A broadcast reads its buffer at the root and writes it
  // elsewhere, so its root's side is `send` even though the buffer is CollArgs::recv (in_place).
  Extent send_at_root, recv_at_root, send_elsewhere, recv_elsewhere;
  Extent size;  // nccl-tests' size of a call: the larger of the call's whole input and output
  BusFactor bus;
};

// The record of `op`. The table is indexed by OpKind and written with designated initializers, checked
// entry by entry against its index at compile time.
// Throws InvalidArgument for a value outside OpKind.
const CollectiveInfo& collective_info(OpKind op);

// Elements `e` spans in call `a` on `rank` of `world` ranks (kOwnCount / kTotalCount read a.counts).
size_t extent_elems(Extent e, const CollArgs& a, int rank, int world);

// Bytes of this rank's send and receive buffers in call `a` (0 for a buffer this rank does not pass or
// whose contents do not matter).
struct BufferBytes {
  size_t send = 0, recv = 0;
};
BufferBytes buffer_bytes(const CollArgs& a, int rank, int world);

// nccl-tests' size of call `a` in bytes: count x element size for broadcast, reduce, all_reduce, send and
// recv; the whole gathered or scattered buffer (count x world, or sum(counts)) for gather, scatter,
// all_gather(v), reduce_scatter and all_to_all; 0 for a barrier. The same on every rank. This is the
// `bytes` of the cost model's rows (comm/cost/cost.h) and of the benchmark's algbw.
size_t size_bytes(const CollArgs& a, int world);
// The same from a per-rank element count alone (every rank contributing `count`; all_gatherv as all_gather).
size_t size_elems(OpKind op, size_t count, int world);

// busbw / algbw for `op` on `world` ranks (nccl-tests: all_reduce 2(n-1)/n; all_gather(v), reduce_scatter,
// all_to_all, gather, scatter (n-1)/n; broadcast, reduce, send, recv 1; barrier 0).
double bus_factor(OpKind op, int world);
// Bytes each rank moves for a call of `size_bytes` under that convention; 0 on one rank (nothing moves).
double bus_bytes(OpKind op, double size_bytes, int world);

}  // namespace trident
