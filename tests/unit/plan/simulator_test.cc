// The event-driven simulator: schedules, symmetry, bubbles against the closed form, strong scaling on a
// slow network, faults, a 1024-GPU run and the Chrome trace.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/plan/simulator.h"

namespace trident::plan {
namespace {

TEST(Schedule, EveryMicrobatchOnceForwardBeforeBackward) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved}) {
    const int pp = 4, m = 8, v = s == Schedule::kInterleaved ? 2 : 1;
    for (int stage = 0; stage < pp; ++stage) {
      auto a = pipeline_schedule(s, pp, stage, m, v);
      ASSERT_EQ(int(a.size()), 2 * m * v);
      std::set<std::pair<int, int>> fwd, bwd;
      int inflight = 0, peak = 0;
      for (auto& x : a) {
        auto key = std::make_pair(x.mb, x.chunk);
        if (x.fwd) {
          EXPECT_TRUE(fwd.insert(key).second);
          peak = std::max(peak, ++inflight);
        } else {
          EXPECT_TRUE(fwd.count(key)) << "backward before forward";
          EXPECT_TRUE(bwd.insert(key).second);
          --inflight;
        }
      }
      if (s == Schedule::kGPipe) {
        EXPECT_EQ(peak, m);
      }
      if (s == Schedule::k1F1B) {
        EXPECT_EQ(peak, pp - stage);  // the first stage holds P microbatches
      }
    }
  }
}

// A cluster where communication and the optimizer cost nothing measurable, so only compute and the
// schedule's dependencies shape the step.
SimOptions ideal_pipeline(Schedule s, int m, int v) {
  SimOptions o;
  o.train.model.layers = 24, o.train.model.hidden = 1024, o.train.model.heads = 16, o.train.model.vocab = 8;
  o.train.model.seq = 512;
  o.train.global_batch = m;
  o.cluster.gpus = 4, o.cluster.gpus_per_node = 4;
  o.cluster.intra = {"ideal", 1e18, 0};
  o.cluster.nic = {"ideal", 1e18, 0};
  o.cluster.hbm_Bps = 1e18;
  o.layout = Layout{1, 4, 1, 0, 1, m, Recompute::kNone, s, v};
  return o;
}

// The closed-form bubble (P-1)/(m+P-1) reproduced by the simulator: P = 4 -> 75% (m=1), 37.5% (m=5), 9.1% (m=30).
TEST(Simulator, PipelineBubbleMatchesClosedForm) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B}) {
    for (int m : {1, 5, 30}) {
      SimResult r = simulate(ideal_pipeline(s, m, 1));
      const double idle = 1 - r.compute_busy_s / r.step_time_s;
      EXPECT_NEAR(idle, bubble_fraction(4, m), 1e-3) << to_string(s) << " m=" << m;
    }
  }
  // Interleaved with v = 2 virtual stages: (P-1)/(v m + P-1).
  SimResult r = simulate(ideal_pipeline(Schedule::kInterleaved, 8, 2));
  EXPECT_NEAR(1 - r.compute_busy_s / r.step_time_s, bubble_fraction(4, 8, 2), 0.02);
}

TEST(Simulator, SymmetryIsExact) {
  HardwareCatalog cat = HardwareCatalog::builtin();
  struct Case {
    int tp, pp, dp, zero, mbs;
    Schedule s;
    int v;
  };
  for (Case k : {Case{1, 1, 16, 0, 4, Schedule::k1F1B, 1}, Case{2, 2, 4, 1, 8, Schedule::k1F1B, 1},
                 Case{2, 4, 2, 0, 16, Schedule::kInterleaved, 2}, Case{1, 2, 8, 3, 4, Schedule::kGPipe, 1},
                 Case{4, 1, 4, 2, 8, Schedule::k1F1B, 1}}) {
    SimOptions o;
    o.train.model = model_preset("gpt2-350m");
    o.train.global_batch = k.dp * k.mbs;
    o.cluster = make_cluster(cat, "a100-80gb", k.tp * k.pp * k.dp);
    o.layout = Layout{k.tp, k.pp, k.dp, k.zero, 1, k.mbs, Recompute::kNone, k.s, k.v};
    o.steps = 2;
    SimResult sym = simulate(o);
    o.exploit_symmetry = false;
    SimResult full = simulate(o);
    EXPECT_TRUE(sym.used_symmetry);
    EXPECT_EQ(sym.simulated_ranks, k.pp);
    EXPECT_EQ(full.simulated_ranks, k.tp * k.pp * k.dp);
    EXPECT_NEAR(sym.step_time_s, full.step_time_s, 1e-9 * full.step_time_s) << o.layout.str();
    // The simulator and the planner's closed form tell the same story.
    Evaluation e = evaluate(o.train, o.cluster, o.layout);
    EXPECT_NEAR(sym.step_time_s, e.step_time_s, 0.25 * e.step_time_s) << o.layout.str();
  }
}

// Seeds: DDP under strong scaling (fixed global batch) on a slow network: step time falls, then rises as
// communication (2(N-1) ring latency steps per bucket, a fixed per-GPU volume) outgrows the shrinking
// compute. Ring all-reduce as NCCL uses for large buckets; one GPU per node on 100 GbE.
TEST(Simulator, DdpStrongScalingFallsThenRises) {
  SimOptions o;
  o.train.model = model_preset("gpt2-124m");
  o.train.global_batch = 512;
  o.cluster = make_cluster(HardwareCatalog::builtin(), "a100-80gb", 512, 1, "", "", "eth-100g");
  o.layout = Layout{1, 1, 512, 0, 1, 1};
  o.algorithm = Algo::kRing;
  auto pts = scaling_sweep(o, {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}, true);
  ASSERT_EQ(pts.size(), 10u);
  size_t best = 0;
  for (size_t i = 0; i < pts.size(); ++i)
    if (pts[i].result.step_time_s < pts[best].result.step_time_s) best = i;
  EXPECT_GT(best, 0u);
  EXPECT_LT(best, pts.size() - 1);
  for (size_t i = 1; i <= best; ++i) EXPECT_LT(pts[i].result.step_time_s, pts[i - 1].result.step_time_s) << pts[i].gpus;
  for (size_t i = best + 1; i < pts.size(); ++i)
    EXPECT_GT(pts[i].result.step_time_s, pts[i - 1].result.step_time_s) << pts[i].gpus;
  EXPECT_NEAR(pts[0].efficiency, 1.0, 1e-12);
  // Weak scaling keeps the per-rank batch: the global batch grows with DP.
  auto weak = scaling_sweep(o, {8, 64}, false);
  ASSERT_EQ(weak.size(), 2u);
  EXPECT_EQ(weak[1].layout.dp * weak[1].layout.micro_batch * weak[1].layout.microbatches, 64);
}

// 1024 GPUs: symmetric, then with a straggler and a degraded link (every rank simulated).
TEST(Simulator, ThousandGpusWithFaults) {
  SimOptions o;
  o.train.model = model_preset("llama-65b");
  o.train.global_batch = 1024;
  o.cluster = make_cluster(HardwareCatalog::builtin(), "h100-sxm", 1024);
  o.layout = Layout{8, 4, 32, 1, 1, 32};
  SimResult base = simulate(o);
  EXPECT_TRUE(base.used_symmetry);
  EXPECT_GT(base.mfu, 0.2);

  SimOptions s = o;
  s.stragglers = {{77, 1.5}};
  SimResult slow = simulate(s);
  EXPECT_FALSE(slow.used_symmetry);
  EXPECT_EQ(slow.simulated_ranks, 1024);
  EXPECT_GT(slow.step_time_s, 1.2 * base.step_time_s);  // everyone waits for the straggler's stage
  EXPECT_LT(slow.step_time_s, 1.6 * base.step_time_s);

  // The 3 AM failure: one node's InfiniBand at half bandwidth slows a DP-heavy layout.
  SimOptions d;
  d.train.model = model_preset("llama-7b");
  d.train.global_batch = 256;
  d.cluster = make_cluster(HardwareCatalog::builtin(), "h100-sxm", 256, 0, "", "", "ib-hdr");
  d.layout = Layout{1, 1, 256, 1, 1, 1};
  SimResult healthy = simulate(d);
  d.degraded = {{5, 0.5}};
  SimResult degraded = simulate(d);
  EXPECT_GT(degraded.step_time_s, healthy.step_time_s * 1.02);
  EXPECT_LT(degraded.step_time_s, healthy.step_time_s * 2.0);

  EXPECT_THROW(simulate([&] { auto x = o; x.stragglers = {{1024, 2}}; return x; }()), InvalidArgument);
  EXPECT_THROW(parse_degraded("node:1:2", "--degrade-link"), InvalidArgument);
  EXPECT_THROW(parse_straggler("rank:x:2", "--straggler"), InvalidArgument);
  EXPECT_EQ(parse_straggler("rank:3:1.5", "--straggler").rank, 3);
  EXPECT_DOUBLE_EQ(parse_degraded("node:2:0.5", "--degrade-link").factor, 0.5);
}

TEST(Simulator, ChromeTraceSamplesRanks) {
  SimOptions o;
  o.train.model = model_preset("gpt2-350m");
  o.train.global_batch = 32;
  o.cluster = make_cluster(HardwareCatalog::builtin(), "a100-80gb", 128);
  o.layout = Layout{2, 2, 32, 0, 1, 1};
  o.stragglers = {{5, 1.2}};
  o.trace_max_ranks = 16;
  auto path = std::filesystem::temp_directory_path() / ("trident_sim_trace_" + std::to_string(::getpid()) + ".json");
  o.trace_path = path.string();
  SimResult r = simulate(o);
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in);
  std::set<int> pids;
  int complete = 0;
  for (auto& e : j["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), r.step_time_s * 1e6 * (1 + 1e-9));
    }
  }
  EXPECT_LE(pids.size(), 17u);
  EXPECT_GE(pids.size(), 8u);
  EXPECT_TRUE(pids.count(5));  // the straggler is always traced
  EXPECT_GT(complete, 0);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace trident::plan

namespace trident::plan {
namespace {

// Links are shared: GPipe's stage 0 emits all 8 activations at once (compute is free here), so they
// cross one 1 GB/s link together and the last arrives after 8 x 1 MB / 1 GB/s = 8 ms (work conservation),
// not after 1 ms; the gradients come back the same way: the step takes about 16 ms.
TEST(Simulator, ConcurrentTransfersShareALink) {
  SimOptions o;
  o.train.model.layers = 4, o.train.model.hidden = 1024, o.train.model.heads = 16, o.train.model.vocab = 8;
  o.train.model.seq = 512;  // one activation: 512 x 1024 x 2 bytes = 1 MiB
  o.train.global_batch = 8;
  o.cluster.gpus = 2, o.cluster.gpus_per_node = 1, o.cluster.nics_per_node = 1;
  o.cluster.peak_flops = 1e21, o.cluster.hbm_Bps = 1e21;
  o.cluster.intra = {"slow", 1e9, 0};
  o.cluster.nic = {"slow", 1e9, 0};
  o.layout = Layout{1, 2, 1, 0, 1, 8, Recompute::kNone, Schedule::kGPipe};
  SimResult r = simulate(o);
  const double one = 512.0 * 1024 * 2 / 1e9;
  EXPECT_NEAR(r.step_time_s, 16 * one, 0.01 * 16 * one);
}

}  // namespace
}  // namespace trident::plan
