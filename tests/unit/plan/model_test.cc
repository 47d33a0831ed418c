// Parameter counts, FLOPs, ZeRO memory, activation memory and bubble formulas against worked figures
// (docs/PLANNER.md, "Worked figures") and published model sizes.
#include <gtest/gtest.h>

#include "trident/core/error.h"
#include "trident/plan/model.h"

namespace trident::plan {
namespace {

TEST(Model, PresetParameterCountsMatchPublishedSizes) {
  EXPECT_EQ(model_preset("gpt2-124m").total_params(), 124439808.0);  // nanoGPT's count
  EXPECT_EQ(model_preset("llama-7b").total_params(), 6738415616.0);   // Hugging Face LLaMA-7B
  EXPECT_EQ(model_preset("llama-13b").total_params(), 13015864320.0);
  EXPECT_EQ(model_preset("llama-70b").total_params(), 68976648192.0);
  EXPECT_NEAR(model_preset("llama-65b").total_params() / 1e9, 65.3, 0.1);
  EXPECT_NEAR(model_preset("gpt3-175b").total_params() / 1e9, 175.0, 1.0);
  EXPECT_NEAR(model_preset("gpt2-1.5b").total_params() / 1e9, 1.56, 0.01);
  EXPECT_THROW(model_preset("gpt5"), InvalidArgument);
}

TEST(Model, FlopsPerIteration) {
  ModelSpec m = model_preset("gpt2-124m");
  // 6 N per token over the matmul parameters (layers + LM head) + 12 L h s attention.
  const double n = 12.0 * (12 * 768.0 * 768 + 13 * 768) + 50257.0 * 768;
  EXPECT_DOUBLE_EQ(model_flops_per_iteration(m, 1), 6 * n + 12.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(model_flops_per_iteration(m, 1000), 1000 * model_flops_per_iteration(m, 1));
  EXPECT_DOUBLE_EQ(hardware_flops_per_iteration(m, 7, Recompute::kNone), model_flops_per_iteration(m, 7));
  // Full recomputation adds one forward: 8N instead of 6N for a large model.
  ModelSpec g = model_preset("gpt3-175b");
  const double ratio = hardware_flops_per_iteration(g, 1, Recompute::kFull) / model_flops_per_iteration(g, 1);
  EXPECT_GT(ratio, 1.32);
  EXPECT_LT(ratio, 1.34);
  EXPECT_GT(hardware_flops_per_iteration(g, 1, Recompute::kSelective), model_flops_per_iteration(g, 1));
  EXPECT_LT(hardware_flops_per_iteration(g, 1, Recompute::kSelective), hardware_flops_per_iteration(g, 1, Recompute::kFull));
}

// Seeds / ZeRO paper: mixed-precision Adam, K = 12: 16 psi; 4 psi + 12 psi/N; 2 psi + 14 psi/N; 16 psi/N.
TEST(Model, ZeroMemoryTable) {
  const double psi = 7.5e9;
  for (int n : {1, 8, 64, 1024}) {
    EXPECT_DOUBLE_EQ(model_state_bytes(psi, n, 0, Precision::kMixed).total(), 16 * psi);
    EXPECT_NEAR(model_state_bytes(psi, n, 1, Precision::kMixed).total(), 4 * psi + 12 * psi / n, 1);
    EXPECT_NEAR(model_state_bytes(psi, n, 2, Precision::kMixed).total(), 2 * psi + 14 * psi / n, 1);
    EXPECT_NEAR(model_state_bytes(psi, n, 3, Precision::kMixed).total(), 16 * psi / n, 1);
  }
  // The paper's worked example: 7.5B parameters on 64 GPUs -> 120, 31.4, 16.6, 1.9 GB.
  EXPECT_NEAR(model_state_bytes(psi, 64, 0, Precision::kMixed).total() / 1e9, 120, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 64, 1, Precision::kMixed).total() / 1e9, 31.4, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 64, 2, Precision::kMixed).total() / 1e9, 16.6, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 64, 3, Precision::kMixed).total() / 1e9, 1.875, 0.001);
  // fp32 Adam: 4 (params) + 4 (grads) + 8 (m, v), no master copy.
  MemoryBreakdown f = model_state_bytes(psi, 4, 0, Precision::kFp32);
  EXPECT_DOUBLE_EQ(f.params, 4 * psi);
  EXPECT_DOUBLE_EQ(f.optimizer, 8 * psi);
  EXPECT_DOUBLE_EQ(f.master, 0);
  EXPECT_NEAR(model_state_bytes(psi, 4, 1, Precision::kFp32).total(), 8 * psi + 8 * psi / 4, 1);
}

// Optimizer offload (ZeRO-Offload): the Adam moments and the master weights leave the device for the host,
// sharded as ZeRO shards them; parameters and gradients stay. Counted by hand per stage.
TEST(Model, OffloadMovesEachRanksOptimizerShardToTheHost) {
  const double psi = 7.5e9;
  for (int n : {1, 3, 64}) {
    for (int z = 0; z <= 3; ++z) {
      SCOPED_TRACE("N " + std::to_string(n) + " ZeRO-" + std::to_string(z));
      const double shard = z >= 1 ? 1.0 / n : 1.0;  // of the optimizer state and master weights
      const MemoryBreakdown on = model_state_bytes(psi, n, z, Precision::kMixed, true);
      const MemoryBreakdown off = model_state_bytes(psi, n, z, Precision::kMixed);
      EXPECT_DOUBLE_EQ(on.host_optimizer, 8 * psi * shard);
      EXPECT_DOUBLE_EQ(on.host_master, 4 * psi * shard);
      EXPECT_DOUBLE_EQ(on.host_total(), 12 * psi * shard);
      EXPECT_EQ(on.optimizer, 0);
      EXPECT_EQ(on.master, 0);
      EXPECT_DOUBLE_EQ(on.params, 2 * psi / (z >= 3 ? n : 1));
      EXPECT_DOUBLE_EQ(on.grads, 2 * psi / (z >= 2 ? n : 1));
      EXPECT_DOUBLE_EQ(on.total() + on.host_total(), off.total());
      EXPECT_EQ(off.host_total(), 0);
      // float32: the parameters are their own master and stay; only m and v move.
      const MemoryBreakdown f = model_state_bytes(psi, n, z, Precision::kFp32, true);
      EXPECT_DOUBLE_EQ(f.host_optimizer, 8 * psi * shard);
      EXPECT_EQ(f.host_master, 0);
      EXPECT_DOUBLE_EQ(f.params, 4 * psi / (z >= 3 ? n : 1));
    }
  }
}

// Korthikanti et al. 2022, Table 2, for GPT-3 175B shapes (s = 2048, b = 1, h = 12288, a = 96).
TEST(Model, ActivationMemoryKorthikanti) {
  ModelSpec m = model_preset("gpt3-175b");
  const double sbh = 2048.0 * 1 * 12288;
  const double as_h = 5.0 * 96 * 2048 / 12288;  // 5as/h = 80
  ActivationConfig c;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, c), sbh * (34 + as_h));
  c.tp = 8;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, c), sbh * (10 + 24.0 / 8 + as_h / 8));
  c.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, c), sbh * (34.0 / 8 + as_h / 8));
  c.recompute = Recompute::kSelective;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, c), sbh * 34.0 / 8);
  c.sequence_parallel = false;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, c), sbh * (10 + 24.0 / 8));
  c.recompute = Recompute::kFull;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, c), 2 * sbh);
  c.precision = Precision::kFp32;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, c), 4 * sbh);
  c.precision = Precision::kMixed;
  c.micro_batch = 4;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, c), 8 * sbh);
  // In-flight microbatches on the first stage.
  EXPECT_EQ(inflight_microbatches(Schedule::k1F1B, 4, 32, 1), 4);
  EXPECT_EQ(inflight_microbatches(Schedule::k1F1B, 4, 2, 1), 2);
  EXPECT_EQ(inflight_microbatches(Schedule::kGPipe, 4, 32, 1), 32);
  EXPECT_DOUBLE_EQ(inflight_microbatches(Schedule::kInterleaved, 4, 32, 2), 4 * (1 + 3.0 / 8));
  EXPECT_EQ(inflight_microbatches(Schedule::k1F1B, 1, 32, 1), 1);
}

// Seeds: P = 4 -> 75% at m = 1, 37.5% at m = 5, 9.1% at m = 30, as (P-1)/(m+P-1).
TEST(Model, BubbleFigures) {
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 1), 0.75);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 5), 0.375);
  EXPECT_NEAR(bubble_fraction(4, 30), 0.0909, 0.0001);
  EXPECT_DOUBLE_EQ(bubble_over_ideal(4, 30), 0.1);
  EXPECT_DOUBLE_EQ(bubble_over_ideal(4, 12, 2), 3.0 / 24);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 12, 2), 3.0 / 27);
  EXPECT_EQ(bubble_fraction(1, 3), 0);
}

}  // namespace
}  // namespace trident::plan
