// The planner's and the simulator's communication times: the native backend's own cost model
// (comm/cost/cost.h, one row per op and algorithm) evaluated on a planned cluster's links.
//
// Pure functions on values: no ownership, no blocking, thread-safe, no timeouts.
//
// A planned group of `world` ranks sits `per_host` consecutive ranks to a host (HostLayout::blocks). Inside
// a host the link is the node's device link (NVLink/NVSwitch, PCIe or shared memory) as one rank sees it;
// across hosts cost.h charges what a host sends, so the inter-host link is the part of the node's network
// this group owns: its per_host ranks' share of the node's NICs (ClusterSpec::inter_per_rank() x
// per_host). gamma, the local reduction pass that does not overlap a transfer, runs at the device's
// memory bandwidth.
#pragma once

#include <string>

#include "trident/comm/collective.h"
#include "trident/comm/cost/cost.h"
#include "trident/comm/types.h"

namespace trident::plan {

// One link class of the hardware catalog: bandwidth per direction (bytes/s) and per-message latency (s).
struct LinkSpec {
  std::string name;
  double bandwidth_Bps = 0;  // per direction, nominal
  double latency_s = 0;      // alpha: per step (message) latency including software overhead
};

// alpha = latency, beta = 1 / bandwidth, gamma = 1 / local_Bps (0: no separate local pass).
LinkCost link_cost(const LinkSpec& link, double local_Bps);

// The links of a group as cost.h reads them.
struct GroupLinks {
  LinkCost intra, inter;
};

struct CommEstimate {
  Algo algo = Algo::kAuto;  // the algorithm the time is for (the cheapest, or the forced one)
  double seconds = 0;       // alpha_s + transfer_s
  double alpha_s = 0;       // the latency terms
  double transfer_s = 0;    // bytes over links and local passes
};

// Time of `op` on `bytes` (as size_bytes (comm/collective.h) counts a call: the buffer for all_reduce, broadcast and reduce,
// the whole gathered / scattered buffer for all_gather, reduce_scatter and all_to_all) over `world` ranks,
// `per_host` to a host. `forced` != kAuto: that algorithm where `op` has it and the world allows it,
// otherwise the cheapest. The native backend's shared-memory window algorithms (shm, cma) are CPU-process
// paths and not candidates. world <= 1 or bytes that move nowhere: zero seconds.
CommEstimate estimate_collective(OpKind op, double bytes, int world, int per_host, const GroupLinks& links,
                                 Algo forced = Algo::kAuto);

// Bytes each rank sends in `op` on a buffer of `bytes` over `world` ranks (nccl-tests' bus convention) are
// the collective's record's: bus_bytes() in comm/collective.h.

}  // namespace trident::plan
