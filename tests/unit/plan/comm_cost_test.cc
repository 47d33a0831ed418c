// One cost model: the planner's communication times (plan/comm_cost.h) are the native backend's
// (comm/algorithms' predict_seconds over the same cost rows) for every algorithm, size, world, host layout
// and link; the automatic choice is the cheapest the backend would consider; and a few rows against
// closed forms written out here.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "trident/comm/algorithms/algorithm.h"
#include "trident/plan/comm_cost.h"

using namespace trident;
using namespace trident::plan;

namespace {

const LinkCost kIntra{1.5e-6, 1.0 / 6e9, 1.0 / 10e9};
const LinkCost kInter{25e-6, 1.0 / 2e9, 1.0 / 10e9};
const size_t kSizes[] = {0, 1, 7, 4096, (size_t{1} << 20) + 3, size_t{256} << 20};
const int kWorlds[] = {1, 2, 3, 5, 8};

bool window_algo(Algo a) { return a == Algo::kShm || a == Algo::kCma; }

// What the native backend predicts for (info, bytes) on `world` ranks `per_host` to a host.
double backend_seconds(const AlgorithmInfo& info, size_t bytes, int world, int per_host) {
  return predict_seconds(info, bytes, HostLayout::blocks(world, per_host), kIntra, kInter);
}

}  // namespace

TEST(CommCost, PlanAndBackendGiveTheSameTimeForEveryAlgorithm) {
  int compared = 0;
  for (const AlgorithmInfo& info : algorithm_table()) {
    if (window_algo(info.algo)) continue;  // not planner candidates (checked below)
    for (int world : kWorlds)
      for (int per_host : {1, 2, world})
        for (size_t bytes : kSizes) {
          const std::string what = fmt::format("{} {} world {} per_host {} bytes {}", op_name(info.op),
                                               algo_name(info.algo), world, per_host, bytes);
          CollArgs a;
          a.op = info.op;
          const bool runs = !info.applicable || info.applicable(a, world);
          const CommEstimate e = estimate_collective(info.op, double(bytes), world, per_host, {kIntra, kInter}, info.algo);
          if (world == 1) {
            EXPECT_EQ(e.seconds, 0.0) << what;
            EXPECT_EQ(backend_seconds(info, bytes, world, per_host), 0.0) << what;
            continue;
          }
          if (!runs) {
            EXPECT_NE(e.algo, info.algo) << what << ": the planner chose an algorithm that cannot run there";
            continue;
          }
          const double backend = backend_seconds(info, bytes, world, per_host);
          if (!std::isfinite(backend)) continue;
          EXPECT_EQ(e.algo, info.algo) << what;
          EXPECT_DOUBLE_EQ(e.seconds, backend) << what;
          EXPECT_NEAR(e.alpha_s + e.transfer_s, e.seconds, 1e-15 + 1e-12 * e.seconds) << what;
          EXPECT_GE(e.alpha_s, 0.0) << what;
          ++compared;
        }
  }
  EXPECT_GT(compared, 1000);
}

TEST(CommCost, AutoIsTheCheapestMessageAlgorithmTheBackendHas) {
  for (OpKind op : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kBroadcast,
                    OpKind::kReduce, OpKind::kAllToAll, OpKind::kGather, OpKind::kScatter})
    for (int world : kWorlds)
      for (int per_host : {1, 2, world})
        for (size_t bytes : kSizes) {
          if (world == 1) continue;
          double best = std::numeric_limits<double>::infinity();
          CollArgs a;
          a.op = op;
          for (const AlgorithmInfo* info : algorithms_for(op)) {
            if (window_algo(info->algo) || (info->applicable && !info->applicable(a, world))) continue;
            best = std::min(best, backend_seconds(*info, bytes, world, per_host));
          }
          const CommEstimate e = estimate_collective(op, double(bytes), world, per_host, {kIntra, kInter});
          EXPECT_DOUBLE_EQ(e.seconds, best) << op_name(op) << " world " << world << " bytes " << bytes;
          EXPECT_FALSE(window_algo(e.algo));
        }
}

// The rows against their textbook forms, written out independently of comm/cost/cost.cc.
TEST(CommCost, ClosedForms) {
  const GroupLinks one_host{kIntra, kInter};
  for (int n : {2, 3, 5, 8}) {
    const double b = 64 << 20;
    const double f = double(n - 1) / n;
    auto t = [&](OpKind op, Algo a) { return estimate_collective(op, b, n, n, one_host, a).seconds; };
    EXPECT_DOUBLE_EQ(t(OpKind::kAllReduce, Algo::kRing), 2.0 * (n - 1) * kIntra.alpha_s + 2 * f * b * kIntra.beta_s_per_byte);
    EXPECT_DOUBLE_EQ(t(OpKind::kAllGather, Algo::kRing), (n - 1) * kIntra.alpha_s + f * b * kIntra.beta_s_per_byte);
    EXPECT_DOUBLE_EQ(t(OpKind::kReduceScatter, Algo::kRing), (n - 1) * kIntra.alpha_s + f * b * kIntra.beta_s_per_byte);
    // Across hosts (one rank each) a ring's steps wait for the inter-host link.
    EXPECT_DOUBLE_EQ(estimate_collective(OpKind::kAllReduce, b, n, 1, one_host, Algo::kRing).seconds,
                     2.0 * (n - 1) * kInter.alpha_s + 2 * f * b * kInter.beta_s_per_byte);
  }
  // Recursive doubling on 8 ranks: 3 exchanges of the whole buffer, each followed by a local pass.
  const double b = 4096;
  EXPECT_DOUBLE_EQ(estimate_collective(OpKind::kAllReduce, b, 8, 8, one_host, Algo::kRecursiveDoubling).seconds,
                   3 * kIntra.alpha_s + 3 * b * kIntra.beta_s_per_byte + 3 * b * kIntra.gamma_s_per_byte);
  // 8 bytes prefer a latency algorithm, 256 MiB a bandwidth-optimal one (ring, or Rabenseifner's on a power
  // of two: the same bytes in fewer steps).
  EXPECT_NE(estimate_collective(OpKind::kAllReduce, 8, 8, 8, one_host).algo, Algo::kRing);
  const Algo big = estimate_collective(OpKind::kAllReduce, 256 << 20, 8, 8, one_host).algo;
  EXPECT_TRUE(big == Algo::kRing || big == Algo::kRecursiveHalving) << algo_name(big);
  // Two hosts of four: the hierarchical all-reduce beats the flat ring on a slow network for large buffers.
  const CommEstimate hier = estimate_collective(OpKind::kAllReduce, 256 << 20, 8, 4, one_host);
  EXPECT_EQ(hier.algo, Algo::kHierarchical);
  EXPECT_LT(hier.seconds, estimate_collective(OpKind::kAllReduce, 256 << 20, 8, 4, one_host, Algo::kRing).seconds);
}

// The cost rows and the algorithms agree on where a pattern runs; every algorithm has a cost row.
TEST(CommCost, CostRowsMatchTheAlgorithms) {
  EXPECT_EQ(cost_table().size(), algorithm_table().size());
  for (const AlgorithmInfo& info : algorithm_table()) {
    ASSERT_NE(info.model, nullptr) << op_name(info.op) << " " << algo_name(info.algo);
    EXPECT_EQ(info.model, find_cost(info.op, info.algo));
    CollArgs a;
    a.op = info.op;
    for (int world = 1; world <= 9; ++world) {
      const bool runs = !info.applicable || info.applicable(a, world);
      EXPECT_EQ(runs, !info.model->pow2_only || cost::is_pow2(world))
          << op_name(info.op) << " " << algo_name(info.algo) << " world " << world;
    }
  }
}

TEST(CommCost, BytesPerRankFollowNcclTests) {
  const double size = 1e9;
  for (int n : {2, 3, 5, 8}) {
    const double f = double(n - 1) / n;
    EXPECT_DOUBLE_EQ(bus_bytes(OpKind::kAllReduce, size, n), 2 * size * f);
    EXPECT_DOUBLE_EQ(bus_bytes(OpKind::kAllGather, size, n), size * f);
    EXPECT_DOUBLE_EQ(bus_bytes(OpKind::kReduceScatter, size, n), size * f);
    EXPECT_DOUBLE_EQ(bus_bytes(OpKind::kBroadcast, size, n), size);
  }
  EXPECT_EQ(bus_bytes(OpKind::kAllReduce, size, 1), 0);
}
