#include "trident/comm/types.h"

#include "trident/comm/collective.h"

#include "trident/core/error.h"

namespace trident {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view n) {
  if (n == "sum") return ReduceOp::kSum;
  if (n == "avg" || n == "mean") return ReduceOp::kAvg;
  if (n == "max") return ReduceOp::kMax;
  if (n == "min") return ReduceOp::kMin;
  if (n == "prod" || n == "product") return ReduceOp::kProd;
  TRIDENT_THROW(InvalidArgument, "unknown reduce op '{}'; use sum, avg, max, min or prod", n);
}

// The names live in the collectives' records (comm/collective.cc).
const char* op_name(OpKind op) {
  auto i = static_cast<int>(op);
  return i < kNumOpKinds ? collective_info(op).name : "?";
}

OpKind parse_op(std::string_view n) {
  for (int i = 0; i < kNumOpKinds; ++i)
    if (n == collective_info(static_cast<OpKind>(i)).name) return static_cast<OpKind>(i);
  if (n == "allreduce") return OpKind::kAllReduce;
  if (n == "allgather") return OpKind::kAllGather;
  if (n == "reducescatter") return OpKind::kReduceScatter;
  if (n == "alltoall") return OpKind::kAllToAll;
  if (n == "bcast") return OpKind::kBroadcast;
  TRIDENT_THROW(InvalidArgument,
                "unknown collective '{}'; use broadcast, reduce, all_reduce, gather, scatter, all_gather, "
                "all_gatherv, reduce_scatter, all_to_all, barrier, send or recv",
                n);
}

static const char* const kAlgoNames[kNumAlgos] = {"auto", "ring",          "rd",       "direct", "tree",
                                                  "dissemination", "pairwise", "rh", "hier", "shm", "cma"};

const char* algo_name(Algo a) {
  auto i = static_cast<int>(a);
  return i < kNumAlgos ? kAlgoNames[i] : "?";
}

Algo parse_algo(std::string_view n) {
  for (int i = 0; i < kNumAlgos; ++i)
    if (n == kAlgoNames[i]) return static_cast<Algo>(i);
  if (n == "recursive_doubling") return Algo::kRecursiveDoubling;
  if (n == "recursive_halving" || n == "rabenseifner" || n == "halving_doubling") return Algo::kRecursiveHalving;
  if (n == "binomial") return Algo::kTree;
  if (n == "hierarchical") return Algo::kHierarchical;
  TRIDENT_THROW(InvalidArgument,
                "unknown algorithm '{}'; use auto, ring, rd, direct, tree, dissemination, pairwise, rh, hier, shm or cma", n);
}

CollArgs fingerprint_args(int op, int dtype, int redop, int root, uint64_t count) {
  CollArgs a;
  a.op = static_cast<OpKind>(op);
  a.dtype = static_cast<DType>(dtype);
  a.redop = static_cast<ReduceOp>(redop);
  a.root = root;
  a.count = count;
  return a;
}

}  // namespace trident
