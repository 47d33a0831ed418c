// The table of every algorithm. An explicit list (not static self-registration, which a static library
// drops when nothing references the object file). Order within an op is the tie-break for equal costs:
// the bandwidth algorithm first.
#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/hierarchical.h"
#include "trident/comm/algorithms/shm_fast_path.h"  // shared-memory fast path
#include "trident/comm/algorithms/shm_cma.h"        // single-copy path (cross-memory attach)

namespace trident {

const std::vector<AlgorithmInfo>& algorithm_table() {
  static const std::vector<AlgorithmInfo> table = {
      {OpKind::kAllReduce, Algo::kRing, &AllReduceRing::cost, &AllReduceRing::run},
      {OpKind::kAllReduce, Algo::kDirect, &AllReduceDirect::cost, &AllReduceDirect::run},
      {OpKind::kAllReduce, Algo::kRecursiveHalving, &AllReduceRabenseifner::cost, &AllReduceRabenseifner::run},
      {OpKind::kAllReduce, Algo::kRecursiveDoubling, &AllReduceRecursiveDoubling::cost, &AllReduceRecursiveDoubling::run},
      {OpKind::kAllReduce, Algo::kTree, &AllReduceTree::cost, &AllReduceTree::run},
      {OpKind::kAllReduce, Algo::kHierarchical, &AllReduceHierarchical::cost, &AllReduceHierarchical::run, nullptr,
       &AllReduceHierarchical::topo_cost},
      {OpKind::kAllReduce, Algo::kShm, &AllReduceShm::cost, &AllReduceShm::run, nullptr, &AllReduceShm::topo_cost},
      {OpKind::kAllReduce, Algo::kCma, &AllReduceCma::cost, &AllReduceCma::run, nullptr, &AllReduceCma::topo_cost},

      {OpKind::kBroadcast, Algo::kRing, &BroadcastRing::cost, &BroadcastRing::run},
      {OpKind::kBroadcast, Algo::kTree, &BroadcastTree::cost, &BroadcastTree::run},
      {OpKind::kBroadcast, Algo::kDirect, &BroadcastDirect::cost, &BroadcastDirect::run},
      {OpKind::kBroadcast, Algo::kShm, &BroadcastShm::cost, &BroadcastShm::run, nullptr, &BroadcastShm::topo_cost},
      {OpKind::kBroadcast, Algo::kCma, &BroadcastCma::cost, &BroadcastCma::run, nullptr, &BroadcastCma::topo_cost},

      {OpKind::kReduce, Algo::kTree, &ReduceTree::cost, &ReduceTree::run},
      {OpKind::kReduce, Algo::kDirect, &ReduceDirect::cost, &ReduceDirect::run},

      {OpKind::kAllGather, Algo::kRing, &AllGatherRing::cost, &AllGatherRing::run},
      {OpKind::kAllGather, Algo::kDirect, &AllGatherDirect::cost, &AllGatherDirect::run},
      {OpKind::kAllGather, Algo::kRecursiveDoubling, &AllGatherRecursiveDoubling::cost,
       &AllGatherRecursiveDoubling::run, &AllGatherRecursiveDoubling::applicable},
      {OpKind::kAllGather, Algo::kHierarchical, &AllGatherHierarchical::cost, &AllGatherHierarchical::run, nullptr,
       &AllGatherHierarchical::topo_cost},
      {OpKind::kAllGather, Algo::kCma, &AllGatherCma::cost, &AllGatherCma::run, nullptr, &AllGatherCma::topo_cost},

      {OpKind::kAllGatherV, Algo::kRing, &AllGatherVRing::cost, &AllGatherVRing::run},
      {OpKind::kAllGatherV, Algo::kDirect, &AllGatherVDirect::cost, &AllGatherVDirect::run},

      {OpKind::kReduceScatter, Algo::kRing, &ReduceScatterRing::cost, &ReduceScatterRing::run},
      {OpKind::kReduceScatter, Algo::kDirect, &ReduceScatterDirect::cost, &ReduceScatterDirect::run},
      {OpKind::kReduceScatter, Algo::kRecursiveHalving, &ReduceScatterRecursiveHalving::cost,
       &ReduceScatterRecursiveHalving::run, &ReduceScatterRecursiveHalving::applicable},
      {OpKind::kReduceScatter, Algo::kHierarchical, &ReduceScatterHierarchical::cost, &ReduceScatterHierarchical::run,
       nullptr, &ReduceScatterHierarchical::topo_cost},
      {OpKind::kReduceScatter, Algo::kCma, &ReduceScatterCma::cost, &ReduceScatterCma::run, nullptr,
       &ReduceScatterCma::topo_cost},

      {OpKind::kGather, Algo::kDirect, &GatherDirect::cost, &GatherDirect::run},
      {OpKind::kGather, Algo::kTree, &GatherTree::cost, &GatherTree::run},

      {OpKind::kScatter, Algo::kDirect, &ScatterDirect::cost, &ScatterDirect::run},
      {OpKind::kScatter, Algo::kTree, &ScatterTree::cost, &ScatterTree::run},

      {OpKind::kAllToAll, Algo::kPairwise, &AllToAllPairwise::cost, &AllToAllPairwise::run},
      {OpKind::kAllToAll, Algo::kDirect, &AllToAllDirect::cost, &AllToAllDirect::run},

      {OpKind::kBarrier, Algo::kDissemination, &BarrierDissemination::cost, &BarrierDissemination::run},
  };
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
