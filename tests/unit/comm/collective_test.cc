// The collectives' records (comm/collective.h): the buffers each op reads and writes at the root and
// elsewhere, nccl-tests' size and bus factors, and how a call is described.
#include <gtest/gtest.h>

#include <vector>

#include "trident/comm/collective.h"
#include "trident/core/error.h"

namespace trident {
namespace {

CollArgs make_call(OpKind op, size_t count, int root = 0) {
  CollArgs a;
  a.op = op;
  a.count = count;
  a.dtype = DType::kFloat32;
  a.root = root;
  return a;
}

TEST(Collective, EveryOpHasItsRecordAndName) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto op = static_cast<OpKind>(i);
    EXPECT_EQ(collective_info(op).op, op);
    EXPECT_EQ(parse_op(collective_info(op).name), op);
  }
  EXPECT_STREQ(op_name(OpKind::kReduceScatter), "reduce_scatter");
  EXPECT_THROW(collective_info(static_cast<OpKind>(kNumOpKinds)), InvalidArgument);
}

TEST(Collective, RootReductionAndPeerFlags) {
  for (OpKind op : {OpKind::kBroadcast, OpKind::kReduce, OpKind::kGather, OpKind::kScatter})
    EXPECT_TRUE(collective_info(op).rooted) << op_name(op);
  for (OpKind op : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kAllGatherV, OpKind::kReduceScatter,
                    OpKind::kAllToAll, OpKind::kBarrier, OpKind::kSend, OpKind::kRecv})
    EXPECT_FALSE(collective_info(op).rooted) << op_name(op);
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto op = static_cast<OpKind>(i);
    const bool reduces = op == OpKind::kReduce || op == OpKind::kAllReduce || op == OpKind::kReduceScatter;
    EXPECT_EQ(collective_info(op).reduces, reduces) << op_name(op);
    EXPECT_EQ(collective_info(op).point_to_point, op == OpKind::kSend || op == OpKind::kRecv) << op_name(op);
  }
}

// Bytes of this rank's send and receive buffers, 7 float32 elements per rank on 3 ranks, root 1.
TEST(Collective, BufferBytesAtTheRootAndElsewhere) {
  const size_t n = 7 * 4, all = 3 * n;
  struct Row {
    OpKind op;
    size_t send_root, recv_root, send_other, recv_other;
  };
  const Row rows[] = {
      {OpKind::kBroadcast, n, 0, 0, n},      {OpKind::kReduce, n, n, n, 0},
      {OpKind::kAllReduce, n, n, n, n},      {OpKind::kGather, n, all, n, 0},
      {OpKind::kScatter, all, n, 0, n},      {OpKind::kAllGather, n, all, n, all},
      {OpKind::kReduceScatter, all, n, all, n}, {OpKind::kAllToAll, all, all, all, all},
      {OpKind::kBarrier, 0, 0, 0, 0},        {OpKind::kSend, n, 0, n, 0},
      {OpKind::kRecv, 0, n, 0, n},
  };
  for (const Row& r : rows) {
    const CollArgs a = make_call(r.op, 7, 1);
    const BufferBytes at_root = buffer_bytes(a, 1, 3), other = buffer_bytes(a, 2, 3);
    EXPECT_EQ(at_root.send, r.send_root) << op_name(r.op);
    EXPECT_EQ(at_root.recv, r.recv_root) << op_name(r.op);
    EXPECT_EQ(other.send, r.send_other) << op_name(r.op);
    EXPECT_EQ(other.recv, r.recv_other) << op_name(r.op);
  }
  // all_gatherv: this rank's own count in, the sum out.
  std::vector<size_t> counts = {1, 0, 5};
  CollArgs v = make_call(OpKind::kAllGatherV, 0);
  v.counts = &counts;
  EXPECT_EQ(buffer_bytes(v, 0, 3).send, 4u);
  EXPECT_EQ(buffer_bytes(v, 1, 3).send, 0u);
  EXPECT_EQ(buffer_bytes(v, 2, 3).recv, 24u);
  EXPECT_EQ(size_bytes(v, 3), 24u);
}

TEST(Collective, SizeAndBusBytesFollowNcclTests) {
  const int n = 4;
  EXPECT_EQ(size_bytes(make_call(OpKind::kAllReduce, 10), n), 40u);
  EXPECT_EQ(size_bytes(make_call(OpKind::kBroadcast, 10), n), 40u);
  EXPECT_EQ(size_bytes(make_call(OpKind::kAllGather, 10), n), 160u);
  EXPECT_EQ(size_bytes(make_call(OpKind::kReduceScatter, 10), n), 160u);
  EXPECT_EQ(size_bytes(make_call(OpKind::kGather, 10), n), 160u);
  EXPECT_EQ(size_bytes(make_call(OpKind::kBarrier, 10), n), 0u);
  EXPECT_EQ(size_elems(OpKind::kAllToAll, 10, n), 40u);
  EXPECT_EQ(size_elems(OpKind::kReduce, 10, n), 10u);
  for (int w : {1, 2, 3, 8}) {
    EXPECT_DOUBLE_EQ(bus_factor(OpKind::kAllReduce, w), 2.0 * (w - 1) / w);
    for (OpKind op : {OpKind::kAllGather, OpKind::kAllGatherV, OpKind::kReduceScatter, OpKind::kAllToAll,
                      OpKind::kGather, OpKind::kScatter})
      EXPECT_DOUBLE_EQ(bus_factor(op, w), (w - 1.0) / w) << op_name(op);
    EXPECT_DOUBLE_EQ(bus_factor(OpKind::kBroadcast, w), 1.0);
    EXPECT_DOUBLE_EQ(bus_factor(OpKind::kReduce, w), 1.0);
    EXPECT_DOUBLE_EQ(bus_factor(OpKind::kBarrier, w), 0.0);
  }
  // Integral byte counts stay exact (DataParallel's accounting compares them with ==).
  EXPECT_EQ(bus_bytes(OpKind::kReduceScatter, 3.0 * 1000 * 4, 3), 2.0 * 1000 * 4);
  EXPECT_EQ(bus_bytes(OpKind::kAllReduce, 3.0 * 1000 * 4, 3), 4.0 * 1000 * 4);
  EXPECT_EQ(bus_bytes(OpKind::kBroadcast, 100.0, 2), 100.0);
  EXPECT_EQ(bus_bytes(OpKind::kAllReduce, 100.0, 1), 0.0);  // one rank moves nothing
}

TEST(Collective, DescribeNamesWhatTheOpTakes) {
  CollArgs a = make_call(OpKind::kAllReduce, 7);
  a.redop = ReduceOp::kMax;
  EXPECT_EQ(describe(a), "all_reduce(count=7, float32, max)");
  a.op = OpKind::kReduce;
  a.root = 2;
  EXPECT_EQ(describe(a), "reduce(count=7, float32, max, root=2)");
  a.op = OpKind::kBroadcast;
  EXPECT_EQ(describe(a), "broadcast(count=7, float32, root=2)");
  a.op = OpKind::kAllGather;
  EXPECT_EQ(describe(a), "all_gather(count=7, float32)");
  a.op = OpKind::kSend;
  a.peer = 3;
  a.tag = 9;
  EXPECT_EQ(describe(a), "send(count=7, float32, peer=3, tag=9)");
  a.op = OpKind::kBarrier;
  EXPECT_EQ(describe(a), "barrier()");
  // A fingerprint from a misbehaving peer may name no op; describing it must not throw.
  EXPECT_EQ(describe(fingerprint_args(200, 0, 0, 0, 5)), "op 200(count=5, float32)");
}

}  // namespace
}  // namespace trident
