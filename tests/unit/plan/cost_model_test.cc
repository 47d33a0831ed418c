// The collective cost model against the seeds' communication table and closed forms.
#include <gtest/gtest.h>

#include "trident/plan/cost_model.h"

namespace trident::plan {
namespace {

TEST(CostModel, BytesPerRankMatchSeedTable) {
  const double size = 1e9;
  for (int n : {2, 3, 8, 64, 1024}) {
    const double f = double(n - 1) / n;
    EXPECT_DOUBLE_EQ(bytes_per_rank(Collective::kAllReduce, size, n), 2 * size * f);
    EXPECT_DOUBLE_EQ(bytes_per_rank(Collective::kAllGather, size, n), size * f);
    EXPECT_DOUBLE_EQ(bytes_per_rank(Collective::kReduceScatter, size, n), size * f);
    EXPECT_DOUBLE_EQ(bytes_per_rank(Collective::kBroadcast, size, n), size);
  }
  EXPECT_EQ(bytes_per_rank(Collective::kAllReduce, size, 1), 0);
}

TEST(CostModel, RingAlphaBetaTerms) {
  LinkSpec link{"test", 10e9, 5e-6};
  // Ring all-reduce: 2(p-1) steps of latency, 2(p-1)/p bytes per byte of buffer.
  CollectiveCost c = collective_cost(Collective::kAllReduce, Algorithm::kRing, 8, link);
  EXPECT_DOUBLE_EQ(c.alpha_s, 14 * 5e-6);
  EXPECT_DOUBLE_EQ(c.beta_s_per_byte, 2.0 * 7 / 8 / 10e9);
  // All-gather and reduce-scatter: half of that.
  c = collective_cost(Collective::kAllGather, Algorithm::kRing, 8, link);
  EXPECT_DOUBLE_EQ(c.alpha_s, 7 * 5e-6);
  EXPECT_DOUBLE_EQ(c.beta_s_per_byte, 7.0 / 8 / 10e9);
  // Recursive doubling all-reduce: log2 p rounds of the full buffer.
  c = collective_cost(Collective::kAllReduce, Algorithm::kRecursiveDoubling, 8, link);
  EXPECT_DOUBLE_EQ(c.alpha_s, 3 * 5e-6);
  EXPECT_DOUBLE_EQ(c.beta_s_per_byte, 3 / 10e9);
  // Non-power-of-two rounds up.
  c = collective_cost(Collective::kBroadcast, Algorithm::kBinomialTree, 5, link);
  EXPECT_DOUBLE_EQ(c.alpha_s, 3 * 5e-6);
  // Rabenseifner: ring bandwidth with log latency.
  c = collective_cost(Collective::kAllReduce, Algorithm::kHalvingDoubling, 16, link);
  EXPECT_DOUBLE_EQ(c.alpha_s, 8 * 5e-6);
  EXPECT_DOUBLE_EQ(c.beta_s_per_byte, 2.0 * 15 / 16 / 10e9);
  EXPECT_DOUBLE_EQ(collective_time(Collective::kAllReduce, Algorithm::kRing, 1000, 1, link), 0);
}

TEST(CostModel, AutoPicksLatencyOptimalForSmallAndBandwidthOptimalForLarge) {
  LinkSpec link{"test", 10e9, 10e-6};
  // 8 bytes over 64 ranks: latency dominates, a log-depth algorithm wins over the ring.
  Algorithm small = choose_algorithm(Collective::kAllReduce, 8, 64, link);
  EXPECT_NE(small, Algorithm::kRing);
  EXPECT_LT(collective_time(Collective::kAllReduce, small, 8, 64, link),
            collective_time(Collective::kAllReduce, Algorithm::kRing, 8, 64, link));
  // 1 GB over 4 ranks: recursive doubling (log p x n) loses to the bandwidth-optimal ones.
  Algorithm big = choose_algorithm(Collective::kAllReduce, 1e9, 4, link);
  EXPECT_NE(big, Algorithm::kRecursiveDoubling);
  EXPECT_NE(big, Algorithm::kBinomialTree);
  EXPECT_FALSE(supports(Collective::kAllGather, Algorithm::kTree));
  EXPECT_TRUE(std::isinf(collective_time(Collective::kAllGather, Algorithm::kTree, 100, 4, link)));
  Algorithm a;
  EXPECT_TRUE(parse_algorithm("halving_doubling", &a));
  EXPECT_EQ(a, Algorithm::kHalvingDoubling);
  EXPECT_FALSE(parse_algorithm("bogus", &a));
}

// Seeds: the 175B-parameter model's float32 gradients all-reduced over 25 GB/s take about 55 s
// (2 x 700 GB x (N-1)/N / 25 GB/s -> 56 s for large N).
TEST(CostModel, Gpt3GradientAllReduceAt25GBps) {
  LinkSpec link{"25GBps", 25e9, 0};
  const double bytes = 175e9 * 4;
  const double t = collective_time(Collective::kAllReduce, Algorithm::kRing, size_t(bytes), 1024, link);
  EXPECT_NEAR(t, 2 * 700e9 * 1023.0 / 1024 / 25e9, 1e-6);
  EXPECT_GT(t, 54.0);
  EXPECT_LT(t, 57.0);
}

TEST(CostModel, HierarchicalBeatsFlatRingOnSlowInterNode) {
  Topology topo{{"nvl", 300e9, 2e-6}, {"ib", 25e9, 5e-6}, 8};
  const double bytes = 1e9;
  const double flat = collective_time(Collective::kAllReduce, Algorithm::kRing, size_t(bytes), 64, topo);
  const double hier = collective_time(Collective::kAllReduce, Algorithm::kHierarchical, size_t(bytes), 64, topo);
  // Flat ring at the NIC speed; hierarchical: intra RS + inter AR on 1/8 + intra AG.
  EXPECT_NEAR(flat, 2 * bytes * 63 / 64 / 25e9 + 126 * 5e-6, 1e-9);
  const double expect_hier = bytes * 7 / 8 / 300e9 * 2 + 14 * 2e-6 +
                             collective_time(Collective::kAllReduce, Algorithm::kAuto, size_t(bytes / 8), 8, topo.inter);
  EXPECT_NEAR(hier, expect_hier, 1e-9);
  EXPECT_LT(hier, flat);
  EXPECT_LE(collective_time(Collective::kAllReduce, Algorithm::kAuto, size_t(bytes), 64, topo), hier);
  // Within one node the topology uses the intra link.
  EXPECT_NEAR(collective_time(Collective::kAllGather, Algorithm::kRing, size_t(bytes), 8, topo),
              bytes * 7 / 8 / 300e9 + 7 * 2e-6, 1e-12);
}

}  // namespace
}  // namespace trident::plan
