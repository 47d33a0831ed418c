// The table of every algorithm. An explicit list (not static self-registration, which a static library
// drops when nothing references the object file). Order within an op is the tie-break for equal costs:
// the bandwidth algorithm first.
#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/hierarchical.h"
#include "trident/comm/algorithms/shm_fast_path.h"  // shared-memory fast path
#include "trident/comm/algorithms/shm_cma.h"        // single-copy path (cross-memory attach)
#include "trident/core/error.h"

namespace trident {
namespace {
// Pairs each algorithm with its row of the cost model (comm/cost/cost.cc); an algorithm added without one
// fails the first collective (and the algorithms tests), naming it.
std::vector<AlgorithmInfo> with_costs(std::vector<AlgorithmInfo> table) {
  for (auto& info : table) {
    info.model = find_cost(info.op, info.algo);
    TRIDENT_CHECK(info.model != nullptr, Unsupported, "algorithm {} of {} has no cost: add its row to comm/cost/cost.cc",
                  algo_name(info.algo), op_name(info.op));
  }
  return table;
}
}  // namespace

const std::vector<AlgorithmInfo>& algorithm_table() {
  static const std::vector<AlgorithmInfo> table = with_costs({
      {OpKind::kAllReduce, Algo::kRing, &AllReduceRing::run},
      {OpKind::kAllReduce, Algo::kDirect, &AllReduceDirect::run},
      {OpKind::kAllReduce, Algo::kRecursiveHalving, &AllReduceRabenseifner::run},
      {OpKind::kAllReduce, Algo::kRecursiveDoubling, &AllReduceRecursiveDoubling::run},
      {OpKind::kAllReduce, Algo::kTree, &AllReduceTree::run},
      {OpKind::kAllReduce, Algo::kHierarchical, &AllReduceHierarchical::run},
      {OpKind::kAllReduce, Algo::kShm, &AllReduceShm::run},
      {OpKind::kAllReduce, Algo::kCma, &AllReduceCma::run},

      {OpKind::kBroadcast, Algo::kRing, &BroadcastRing::run},
      {OpKind::kBroadcast, Algo::kTree, &BroadcastTree::run},
      {OpKind::kBroadcast, Algo::kDirect, &BroadcastDirect::run},
      {OpKind::kBroadcast, Algo::kShm, &BroadcastShm::run},
      {OpKind::kBroadcast, Algo::kCma, &BroadcastCma::run},

      {OpKind::kReduce, Algo::kTree, &ReduceTree::run},
      {OpKind::kReduce, Algo::kDirect, &ReduceDirect::run},

      {OpKind::kAllGather, Algo::kRing, &AllGatherRing::run},
      {OpKind::kAllGather, Algo::kDirect, &AllGatherDirect::run},
      {OpKind::kAllGather, Algo::kRecursiveDoubling, &AllGatherRecursiveDoubling::run, &AllGatherRecursiveDoubling::applicable},
      {OpKind::kAllGather, Algo::kHierarchical, &AllGatherHierarchical::run},
      {OpKind::kAllGather, Algo::kCma, &AllGatherCma::run},

      {OpKind::kAllGatherV, Algo::kRing, &AllGatherVRing::run},
      {OpKind::kAllGatherV, Algo::kDirect, &AllGatherVDirect::run},

      {OpKind::kReduceScatter, Algo::kRing, &ReduceScatterRing::run},
      {OpKind::kReduceScatter, Algo::kDirect, &ReduceScatterDirect::run},
      {OpKind::kReduceScatter, Algo::kRecursiveHalving, &ReduceScatterRecursiveHalving::run, &ReduceScatterRecursiveHalving::applicable},
      {OpKind::kReduceScatter, Algo::kHierarchical, &ReduceScatterHierarchical::run},
      {OpKind::kReduceScatter, Algo::kCma, &ReduceScatterCma::run},

      {OpKind::kGather, Algo::kDirect, &GatherDirect::run},
      {OpKind::kGather, Algo::kTree, &GatherTree::run},

      {OpKind::kScatter, Algo::kDirect, &ScatterDirect::run},
      {OpKind::kScatter, Algo::kTree, &ScatterTree::run},

      {OpKind::kAllToAll, Algo::kPairwise, &AllToAllPairwise::run},
      {OpKind::kAllToAll, Algo::kDirect, &AllToAllDirect::run},

      {OpKind::kBarrier, Algo::kDissemination, &BarrierDissemination::run},
  });
  return table;
}

std::vector<const AlgorithmInfo*> algorithms_for(OpKind op) {
  std::vector<const AlgorithmInfo*> out;
  for (const auto& info : algorithm_table())
    if (info.op == op) out.push_back(&info);
  return out;
}

const AlgorithmInfo* find_algorithm(OpKind op, Algo algo) {
  for (const auto& info : algorithm_table())
    if (info.op == op && info.algo == algo) return &info;
  return nullptr;
}

}  // namespace trident
