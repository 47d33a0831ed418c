// Alpha-beta cost model of collectives: the ONE model that the comm backend uses to choose an algorithm
// and that `trident plan` / `trident simulate` use to predict step times (STYLE.md #2, #3).
//
// Header-only and dependency-free (standard library only), so any layer may include it without a link
// dependency. Every function is pure: no ownership, no blocking, thread-safe, no timeouts.
//
// Model (Hockney / Thakur-Rabenseifner-Gropp 2005; NCCL's ncclTopoGetAlgoTime `lat*steps + bytes/bw`):
//   time(bytes) = alpha_s + beta_s_per_byte * bytes
// where `bytes` is the size of the full buffer (the all-reduce/broadcast input; for all-gather the
// OUTPUT size, for reduce-scatter the INPUT size: n = p * shard), `alpha_s` = (latency steps) x link
// latency and `beta_s_per_byte` = (bytes each rank sends per byte of buffer) / link bandwidth.
// Per-rank volumes (bytes each rank sends per byte of buffer, as nccl-tests' busbw factors): all-reduce 2 n (p-1)/p, all-gather and reduce-scatter n (p-1)/p,
// broadcast n (pipelined chain or tree), reduce n.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace trident::plan {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kAllToAll, kSendRecv };

enum class Algorithm {
  kAuto,               // the cheapest supported algorithm by this model
  kRing,               // ring (pipelined chain for broadcast/reduce)
  kTree,               // double binary tree, pipelined (NCCL's tree): latency ~log p, bandwidth ~n
  kBinomialTree,       // binomial tree, not pipelined: log p rounds of the whole buffer
  kRecursiveDoubling,  // recursive doubling (all-reduce: log p rounds of n; all-gather: doubling sizes)
  kHalvingDoubling,    // Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather
  kDirect,             // every rank talks to every other (all-to-all, pairwise exchange)
  kHierarchical,       // intra-node reduce-scatter, inter-node collective on 1/g of the data, intra all-gather
};

// One link class: bandwidth per direction (bytes/s) and per-message latency (s).
struct LinkSpec {
  std::string name;
  double bandwidth_Bps = 0;  // per direction, nominal
  double latency_s = 0;      // alpha: per step (message) latency including software overhead
};

// Two-level topology: `gpus_per_node` ranks per node joined by `intra`, nodes joined by `inter`.
// `inter` bandwidth is PER RANK (a node's NIC bandwidth divided among the ranks that share it).
struct Topology {
  LinkSpec intra;
  LinkSpec inter;
  int gpus_per_node = 1;
};

// time(bytes) = alpha_s + beta_s_per_byte * bytes.
struct CollectiveCost {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  double time(double bytes) const { return alpha_s + beta_s_per_byte * bytes; }
};

inline const char* to_string(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kAllToAll: return "all_to_all";
    case Collective::kSendRecv: return "send_recv";
  }
  return "?";
}

inline const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kBinomialTree: return "binomial";
    case Algorithm::kRecursiveDoubling: return "recursive_doubling";
    case Algorithm::kHalvingDoubling: return "halving_doubling";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kHierarchical: return "hierarchical";
  }
  return "?";
}

// Parses the names printed by to_string(Algorithm); returns false when unknown.
inline bool parse_algorithm(std::string_view s, Algorithm* out) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kBinomialTree,
                      Algorithm::kRecursiveDoubling, Algorithm::kHalvingDoubling, Algorithm::kDirect,
                      Algorithm::kHierarchical}) {
    if (s == to_string(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

inline int ceil_log2(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

// Bytes each rank sends per collective on a buffer of `bytes` over `world` ranks (bandwidth-optimal
// algorithms; the seeds' "communication per GPU" table).
inline double bytes_per_rank(Collective op, double bytes, int world) {
  if (world <= 1) return 0;
  const double f = double(world - 1) / world;
  switch (op) {
    case Collective::kAllReduce: return 2 * bytes * f;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll: return bytes * f;
    case Collective::kBroadcast:
    case Collective::kReduce:
    case Collective::kSendRecv: return bytes;
  }
  return 0;
}

// Whether `algo` implements `op` in this model (kAuto and kHierarchical cover every collective).
inline bool supports(Collective op, Algorithm algo) {
  switch (algo) {
    case Algorithm::kAuto:
    case Algorithm::kRing: return op != Collective::kAllToAll && op != Collective::kSendRecv;
    case Algorithm::kTree: return op == Collective::kAllReduce || op == Collective::kBroadcast || op == Collective::kReduce;
    case Algorithm::kBinomialTree: return op == Collective::kAllReduce || op == Collective::kBroadcast || op == Collective::kReduce;
    case Algorithm::kRecursiveDoubling:
      return op == Collective::kAllReduce || op == Collective::kAllGather;
    case Algorithm::kHalvingDoubling: return op == Collective::kAllReduce || op == Collective::kReduceScatter;
    case Algorithm::kDirect:
      return op == Collective::kAllToAll || op == Collective::kAllGather || op == Collective::kReduceScatter ||
             op == Collective::kSendRecv;
    case Algorithm::kHierarchical:
      return op == Collective::kAllReduce || op == Collective::kAllGather || op == Collective::kReduceScatter ||
             op == Collective::kBroadcast;
  }
  return false;
}

// Latency steps and bytes-sent factor of a flat algorithm on `world` ranks; kAuto and kHierarchical are
// resolved by the callers below. Returns {steps, factor} with time = steps*alpha + factor*bytes/bw.
struct AlgoShape {
  double steps = 0;
  double factor = 0;
};

inline AlgoShape algo_shape(Collective op, Algorithm algo, int world) {
  const int p = world;
  if (p <= 1) return {0, 0};
  const double f = double(p - 1) / p;
  const int lg = ceil_log2(p);
  if (op == Collective::kSendRecv) return {1, 1};
  switch (algo) {
    case Algorithm::kRing:
      switch (op) {
        case Collective::kAllReduce: return {2.0 * (p - 1), 2 * f};
        case Collective::kAllGather:
        case Collective::kReduceScatter: return {double(p - 1), f};
        case Collective::kBroadcast:
        case Collective::kReduce: return {double(p - 1), 1};  // pipelined chain: fill latency + n/bw
        default: break;
      }
      break;
    case Algorithm::kTree:  // double binary tree, pipelined: up then down, each tree carries n/2
      switch (op) {
        case Collective::kAllReduce: return {2.0 * lg, 2};
        case Collective::kBroadcast:
        case Collective::kReduce: return {double(lg), 1};
        default: break;
      }
      break;
    case Algorithm::kBinomialTree:
      switch (op) {
        case Collective::kAllReduce: return {2.0 * lg, 2.0 * lg};
        case Collective::kBroadcast:
        case Collective::kReduce: return {double(lg), double(lg)};
        default: break;
      }
      break;
    case Algorithm::kRecursiveDoubling:
      switch (op) {
        case Collective::kAllReduce: return {double(lg), double(lg)};
        case Collective::kAllGather: return {double(lg), f};
        default: break;
      }
      break;
    case Algorithm::kHalvingDoubling:
      switch (op) {
        case Collective::kAllReduce: return {2.0 * lg, 2 * f};
        case Collective::kReduceScatter: return {double(lg), f};
        default: break;
      }
      break;
    case Algorithm::kDirect:
      switch (op) {
        case Collective::kAllToAll:
        case Collective::kAllGather:
        case Collective::kReduceScatter: return {double(p - 1), f};
        default: break;
      }
      break;
    default: break;
  }
  return {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
}

// Cost of a flat (single link class) algorithm. kAuto picks the cheapest for `bytes_hint`.
// Unsupported (op, algo) pairs cost infinity.
inline CollectiveCost collective_cost(Collective op, Algorithm algo, int world, const LinkSpec& link,
                                      double bytes_hint = 0);

inline Algorithm choose_algorithm(Collective op, double bytes, int world, const LinkSpec& link) {
  if (op == Collective::kSendRecv) return Algorithm::kDirect;
  if (op == Collective::kAllToAll) return Algorithm::kDirect;
  Algorithm best = Algorithm::kRing;
  double best_t = std::numeric_limits<double>::infinity();
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kBinomialTree, Algorithm::kRecursiveDoubling,
                      Algorithm::kHalvingDoubling, Algorithm::kDirect}) {
    if (!supports(op, a)) continue;
    double t = collective_cost(op, a, world, link).time(bytes);
    if (t < best_t) {
      best_t = t;
      best = a;
    }
  }
  return best;
}

inline CollectiveCost collective_cost(Collective op, Algorithm algo, int world, const LinkSpec& link,
                                      double bytes_hint) {
  if (world <= 1) return {0, 0};
  if (algo == Algorithm::kAuto) algo = choose_algorithm(op, bytes_hint, world, link);
  if (algo == Algorithm::kHierarchical) algo = Algorithm::kRing;  // one level: hierarchical is a ring
  AlgoShape s = algo_shape(op, algo, world);
  return {s.steps * link.latency_s, s.factor / link.bandwidth_Bps};
}

// The function the backend calls: predicted seconds of `op` with `algo` on `bytes` over `world` ranks
// all joined by `link`.
inline double collective_time(Collective op, Algorithm algo, size_t bytes, int world, const LinkSpec& link) {
  return collective_cost(op, algo, world, link, double(bytes)).time(double(bytes));
}

// On a two-level topology. `world` ranks laid out `gpus_per_node` per node (world <= gpus_per_node stays
// inside one node). Flat algorithms over several nodes run at the inter-node (bottleneck) link's speed;
// kHierarchical composes intra reduce-scatter + inter op on bytes/g + intra all-gather (NCCL's
// "CollNet/NVLS-like" two-level scheme, and Horovod's hierarchical all-reduce).
inline CollectiveCost collective_cost(Collective op, Algorithm algo, int world, const Topology& topo,
                                      double bytes_hint = 0) {
  if (world <= 1) return {0, 0};
  const int g = std::max(1, std::min(topo.gpus_per_node, world));
  const int nodes = (world + g - 1) / g;
  if (nodes <= 1) return collective_cost(op, algo == Algorithm::kHierarchical ? Algorithm::kAuto : algo, world,
                                         topo.intra, bytes_hint);
  auto hier = [&]() -> CollectiveCost {
    CollectiveCost c;
    auto add = [&](CollectiveCost x, double scale) {
      c.alpha_s += x.alpha_s;
      c.beta_s_per_byte += x.beta_s_per_byte * scale;
    };
    const double shard = 1.0 / g;
    switch (op) {
      case Collective::kAllReduce:
        add(collective_cost(Collective::kReduceScatter, Algorithm::kRing, g, topo.intra), 1);
        add(collective_cost(Collective::kAllReduce, Algorithm::kAuto, nodes, topo.inter, bytes_hint * shard), shard);
        add(collective_cost(Collective::kAllGather, Algorithm::kRing, g, topo.intra), 1);
        break;
      case Collective::kAllGather:  // inter all-gather of node shards, then intra all-gather
        add(collective_cost(Collective::kAllGather, Algorithm::kRing, nodes, topo.inter), shard);
        add(collective_cost(Collective::kAllGather, Algorithm::kRing, g, topo.intra), 1);
        break;
      case Collective::kReduceScatter:
        add(collective_cost(Collective::kReduceScatter, Algorithm::kRing, g, topo.intra), 1);
        add(collective_cost(Collective::kReduceScatter, Algorithm::kRing, nodes, topo.inter), shard);
        break;
      case Collective::kBroadcast:  // inter broadcast (scattered over the node's g NICs), intra broadcast
        add(collective_cost(Collective::kBroadcast, Algorithm::kAuto, nodes, topo.inter, bytes_hint * shard), shard);
        add(collective_cost(Collective::kAllGather, Algorithm::kRing, g, topo.intra), 1);
        break;
      default: return {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    }
    return c;
  };
  if (algo == Algorithm::kHierarchical) return hier();
  if (algo == Algorithm::kAuto) {
    CollectiveCost best = hier();
    for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kBinomialTree, Algorithm::kRecursiveDoubling,
                        Algorithm::kHalvingDoubling, Algorithm::kDirect}) {
      if (!supports(op, a)) continue;
      CollectiveCost c = collective_cost(op, a, world, topo.inter);
      if (c.time(bytes_hint) < best.time(bytes_hint)) best = c;
    }
    return best;
  }
  return collective_cost(op, algo, world, topo.inter);
}

inline double collective_time(Collective op, Algorithm algo, size_t bytes, int world, const Topology& topo) {
  return collective_cost(op, algo, world, topo, double(bytes)).time(double(bytes));
}

// Which algorithm kAuto resolves to on a topology (kHierarchical when the composed scheme wins).
inline Algorithm choose_algorithm(Collective op, double bytes, int world, const Topology& topo) {
  const int g = std::max(1, std::min(topo.gpus_per_node, world));
  if ((world + g - 1) / g <= 1) return choose_algorithm(op, bytes, world, topo.intra);
  Algorithm best = Algorithm::kHierarchical;
  double best_t = supports(op, best) ? collective_cost(op, best, world, topo).time(bytes)
                                     : std::numeric_limits<double>::infinity();
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kBinomialTree, Algorithm::kRecursiveDoubling,
                      Algorithm::kHalvingDoubling, Algorithm::kDirect}) {
    if (!supports(op, a)) continue;
    double t = collective_cost(op, a, world, topo.inter).time(bytes);
    if (t < best_t) {
      best_t = t;
      best = a;
    }
  }
  return best;
}

}  // namespace trident::plan
