// Vocabulary of the communication layer: collective kinds, reduction ops, algorithm names, and the
// description of one collective call (CollArgs). Below comm/ a buffer is (pointer, count, dtype).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trident/core/dtype.h"

namespace trident {

enum class ReduceOp : uint8_t { kSum = 0, kAvg, kMax, kMin, kProd };
const char* reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view name);  // sum, avg, max, min, prod

enum class OpKind : uint8_t {
  kBroadcast = 0,
  kReduce,
  kAllReduce,
  kGather,
  kScatter,
  kAllGather,
  kAllGatherV,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kSend,
  kRecv,
};
inline constexpr int kNumOpKinds = 12;
const char* op_name(OpKind op);  // "all_reduce", ...
OpKind parse_op(std::string_view name);

// Algorithm names; kAuto lets the backend choose by cost (STYLE.md #3: selection is data).
enum class Algo : uint8_t {
  kAuto = 0,
  kRing,               // "ring": reduce-scatter + all-gather around a ring; ring all-gather/reduce-scatter
  kRecursiveDoubling,  // "rd": recursive doubling (latency-optimal all-reduce / all-gather)
  kDirect,             // "direct": every rank talks to every rank in one step (single host)
  kTree,               // "tree": binomial tree (broadcast, reduce; all-reduce = reduce + broadcast)
  kDissemination,      // "dissemination": barrier
  kPairwise,           // "pairwise": all-to-all by pairwise exchange
  kRecursiveHalving,   // "rh": recursive halving reduce-scatter / Rabenseifner all-reduce
  kHierarchical,       // "hier": inside each host, across hosts, inside again
  kShm,                // "shm": shared-memory window (one host): flags + slots, or staged direct reduction
  kCma,                // "cma": single copy between the ranks' own buffers (Linux cross-memory attach, one host)
};
inline constexpr int kNumAlgos = 11;
const char* algo_name(Algo a);
Algo parse_algo(std::string_view name);  // throws InvalidArgument listing the names

// One collective as the backend and the algorithms see it. Buffer conventions (count is per rank):
//   broadcast      recv[count] in place (root's data in recv at root)
//   reduce         send[count] -> recv[count] at root (recv unused elsewhere)
//   all_reduce     recv[count] in place (the process group copies send into recv first)
//   gather         send[count] -> recv[count*size] at root
//   scatter        send[count*size] at root -> recv[count]
//   all_gather     send[count] -> recv[count*size]
//   all_gatherv    send[counts[rank]] -> recv[sum(counts)], rank r's block at offset sum(counts[<r])
//   reduce_scatter send[count*size] -> recv[count]
//   all_to_all     send[count*size] -> recv[count*size]; block j of send goes to rank j
// Algorithms see ReduceOp::kAvg as kSum; the process group divides by size afterwards.
struct CollArgs {
  OpKind op = OpKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  int root = 0;
  const std::vector<size_t>* counts = nullptr;  // all_gatherv only
  int peer = -1;                                // send/recv only
  uint32_t tag = 0;                             // send/recv only
  uint64_t record = 0;                          // the call's flight-recorder id (ProcessGroup sets it; 0: none)
};

// "all_reduce(count=7, float32, sum)" — used in errors and logs; written from the collective's record
// (comm/collective.h).
std::string describe(const CollArgs& a);
// The call a collective's fingerprint (as the backends exchange it) stands for, without buffers: what
// describe() prints for another rank's call in a mismatch error.
CollArgs fingerprint_args(int op, int dtype, int redop, int root, uint64_t count);

using Seconds = std::chrono::duration<double>;

// Transfer counters of one group on this rank (ProcessGroup::traffic): cumulative since the group was
// created. For live health checks (train/health.h), logs and tests.
struct PeerTraffic {
  int global_rank = -1;
  std::string host;              // the peer's host identity
  bool tcp = false;              // reached over TCP (else shared memory, or no channel)
  uint64_t tx_bytes = 0;         // payload bytes sent to the peer
  uint64_t rx_bytes = 0;         // payload bytes received from it
  // Of rx_bytes, those of messages of at least kTimedBytes that this rank was already waiting for when they
  // arrived (a buffered message would read at memory speed), and their time from header to last byte.
  uint64_t rx_timed_bytes = 0;
  uint64_t rx_busy_ns = 0;
  uint64_t rx_wait_ns = 0;       // time the receives of those messages waited for their header
  // TCP only, from the kernel (TCP_INFO of the connection): bytes the peer acknowledged, and the time the
  // connection had unacknowledged or unsent data, less the time the peer's receive window was full. Their
  // ratio is the bandwidth the link gave while it was busy, whenever either process ran: data that queues
  // in the kernel while a rank is descheduled or computing counts at the pace the network carried it.
  uint64_t tx_acked_bytes = 0;
  uint64_t tx_busy_ns = 0;
  static constexpr uint64_t kTimedBytes = 16 << 10;  // smaller messages measure latency, not bandwidth
};
struct GroupTraffic {
  std::vector<PeerTraffic> peers;  // by group rank; this rank's own entry counts nothing
  uint64_t collectives = 0;        // collectives completed
  // The last (up to kRecent) collectives: sequence number and time from entering to leaving it on this rank,
  // from the coarse monotonic clock (a few ms resolution). A rank that arrives last at a collective spends
  // the least time in it: comparing ranks' times names a straggler without synchronized clocks.
  struct Collective {
    uint64_t seq = 0;
    uint64_t ns = 0;
  };
  std::vector<Collective> recent;
  static constexpr int kRecent = 64;
};

}  // namespace trident
