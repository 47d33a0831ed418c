// The planner: the worked TP traffic example (docs/PLANNER.md), the 65B sizing rule, layout validation, the hardware
// catalog, and the `trident plan` CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <unistd.h>
#include <sys/wait.h>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/plan/hardware.h"
#include "trident/plan/planner.h"

namespace trident::plan {
namespace {

std::string run_cli(const std::string& args, int* status) {
  std::string cmd = std::string(TRIDENT_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

// Seeds: hidden 8192, batch 4, sequence 2048, 96 layers -> about 51 GB of TP traffic per step and about
// 0.11 s at 450 GB/s. Convention: Megatron's 2 all-reduces forward + 2 backward per layer, each payload
// b*s*h bf16 values, summed (payload bytes, not ring bytes on the wire), divided by the NVLink 4
// per-direction bandwidth.
// `trident train --device cuda` finds its GPU's catalog entry (peak FLOP/s for MFU, the planner's step) by the
// name CUDA reports; parts whose peak differs from the entry's (H100 PCIe, NVL) and unknown GPUs get none.
TEST(Planner, CudaDeviceNamesMatchCatalogGpus) {
  EXPECT_EQ(gpu_for_device_name("NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)"), "h100-sxm");
  EXPECT_EQ(gpu_for_device_name("NVIDIA H200 (sm_90, 132 SMs, 140 GiB)"), "h200");
  EXPECT_EQ(gpu_for_device_name("NVIDIA A100-SXM4-80GB"), "a100-80gb");
  EXPECT_EQ(gpu_for_device_name("NVIDIA A100-SXM4-40GB"), "a100-40gb");
  EXPECT_EQ(gpu_for_device_name("NVIDIA H100 PCIe"), "");
  EXPECT_EQ(gpu_for_device_name("NVIDIA H100 NVL"), "");
  EXPECT_EQ(gpu_for_device_name("NVIDIA GeForce RTX 4090"), "");
  EXPECT_EQ(gpu_for_device_name("cpu"), "");
  const auto cat = HardwareCatalog::builtin();
  for (const char* g : {"h100-sxm", "h200", "a100-80gb", "a100-40gb"}) EXPECT_TRUE(cat.has_gpu(g)) << g;
}

// The single-GPU evaluation the trainer prints for GPT-2 124M (bf16, B = 16, T = 1024): model FLOPs are
// 6 N per token plus attention's (the planner's count, independent of the GPU: 6 x 124M x 16384 = 12.2
// TFLOP, within 25%), and MFU is those FLOPs over step time and the bf16 peak.
TEST(Planner, SingleGpuGpt2Evaluation) {
  const auto cat = HardwareCatalog::builtin();
  TrainSpec t;
  t.model.layers = 12;
  t.model.hidden = 768;
  t.model.heads = 12;
  t.model.vocab = 50304;
  t.model.seq = 1024;
  t.global_batch = 16;
  t.precision = Precision::kMixed;
  Layout l;
  l.micro_batch = 16;
  const ClusterSpec c = make_cluster(cat, "h100-sxm", 1, 1, "", "", "", Precision::kMixed);
  EXPECT_DOUBLE_EQ(c.peak_flops, 989e12);
  const Evaluation e = evaluate(t, c, l);
  EXPECT_TRUE(e.fits);
  const double six_n = 6.0 * 124e6 * 16 * 1024;
  EXPECT_GT(e.model_flops_per_iter, 0.75 * six_n);
  EXPECT_LT(e.model_flops_per_iter, 1.25 * six_n);
  EXPECT_GT(e.step_time_s, 0);
  EXPECT_NEAR(e.mfu, e.model_flops_per_iter / (e.step_time_s * c.peak_flops), 1e-9);
  EXPECT_NEAR(e.tokens_per_s, 16.0 * 1024 / e.step_time_s, 1e-6 * e.tokens_per_s);
}

TEST(Planner, TensorParallelTrafficExample) {
  ModelSpec m;
  m.layers = 96, m.hidden = 8192, m.heads = 64, m.seq = 2048;
  const double bytes = tp_traffic_bytes(m, 4, 2);
  EXPECT_DOUBLE_EQ(bytes, 4.0 * 96 * 4 * 2048 * 8192 * 2);
  EXPECT_NEAR(bytes / 1e9, 51.5, 0.1);
  EXPECT_NEAR(bytes / 450e9, 0.1145, 0.001);
  // The ring all-reduce at TP 8 actually moves 2 (t-1)/t times the payload per GPU.
  EXPECT_NEAR(bus_bytes(OpKind::kAllReduce, bytes, 8) / bytes, 1.75, 1e-12);
}

TrainSpec llama65() {
  TrainSpec t;
  t.model = model_preset("llama-65b");
  t.global_batch = 512;  // 1M tokens of 2048
  return t;
}

// A worked sizing example: a 65B model on H100s -> TP 8, PP 4, DP 4 = 128 GPUs. Assumptions: global batch 512
// sequences of 2048 tokens, micro-batch 1, mixed-precision Adam, 10% of HBM kept free.
TEST(Planner, Sizing65BOnH100) {
  TrainSpec t = llama65();
  ClusterSpec c = make_cluster(HardwareCatalog::builtin(), "h100-sxm", 128);
  EXPECT_EQ(c.gpus_per_node, 8);
  auto all = enumerate_layouts(t, c);
  Recommendation r = recommend(t, c, all);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.best.layout.tp, 8);
  EXPECT_EQ(r.best.layout.pp, 4);
  EXPECT_EQ(r.best.layout.dp, 4);
  EXPECT_EQ(r.best.layout.zero, 0);
  EXPECT_TRUE(r.best.fits);
  EXPECT_LT(r.best.bubble_fraction, 0.10);
  EXPECT_FALSE(r.reasons.empty());
  // Why not PP 2: params+grads+optimizer alone are 16 B x 65.3 B / 16 = 65 GB, and with the activations it
  // exceeds the 77 GB usable.
  Layout pp2{8, 2, 8, 0, 1, 64, Recompute::kSelective};
  Evaluation e = evaluate(t, c, pp2);
  EXPECT_FALSE(e.fits);
  EXPECT_NEAR(e.memory.params + e.memory.grads + e.memory.optimizer + e.memory.master,
              16 * (40 * model_preset("llama-65b").params_per_layer() + 32000.0 * 8192) / 8, 1e3);
}

TEST(Planner, SmallModelsArePureDataParallel) {
  TrainSpec t;
  t.model = model_preset("gpt2-124m");
  t.global_batch = 64;
  ClusterSpec c = make_cluster(HardwareCatalog::builtin(), "a100-40gb", 8);
  Recommendation r = recommend(t, c, enumerate_layouts(t, c));
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.best.layout.tp, 1);
  EXPECT_EQ(r.best.layout.pp, 1);
  EXPECT_EQ(r.best.layout.dp, 8);
  EXPECT_EQ(r.best.layout.zero, 0);
  // A 7B model does not fit unsharded on 80 GB: ZeRO shards the optimizer state over DP.
  t.model = model_preset("llama-7b");
  t.global_batch = 64;
  c = make_cluster(HardwareCatalog::builtin(), "a100-80gb", 64);
  r = recommend(t, c, enumerate_layouts(t, c));
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.best.layout.tp * r.best.layout.pp, 1);
  EXPECT_GE(r.best.layout.zero, 1);
}

TEST(Planner, EvaluationIsSelfConsistent) {
  TrainSpec t = llama65();
  ClusterSpec c = make_cluster(HardwareCatalog::builtin(), "h100-sxm", 128);
  Layout l{8, 4, 4, 0, 1, 128, Recompute::kNone};
  Evaluation e = evaluate(t, c, l);
  EXPECT_NEAR(e.bubble_fraction, 3.0 / 131, 1e-12);
  EXPECT_NEAR(e.mfu, e.model_flops_per_iter / (e.step_time_s * 128 * 989e12), 1e-12);
  EXPECT_NEAR(e.tokens_per_s, 512.0 * 2048 / e.step_time_s, 1e-6);
  EXPECT_GT(e.mfu, 0.2);
  EXPECT_LT(e.mfu, 0.7);
  // ZeRO-1 shards the optimizer and master copies over DP 4; ZeRO-3 cuts total state by DP.
  l.zero = 1;
  Evaluation z1 = evaluate(t, c, l);
  EXPECT_NEAR(z1.memory.optimizer, e.memory.optimizer / 4, 1);
  EXPECT_LT(z1.memory.total(), e.memory.total());
  bool has_tp = false, has_pp = false;
  for (auto& ci : e.comm) {
    has_tp |= ci.kind == "tp_all_reduce" && ci.link == "nvswitch-h100";
    has_pp |= ci.kind == "pp_send_recv" && ci.link == "ib-ndr";
  }
  EXPECT_TRUE(has_tp);
  EXPECT_TRUE(has_pp);
}

TEST(Planner, BadLayoutsNameTheFlag) {
  TrainSpec t = llama65();
  ClusterSpec c = make_cluster(HardwareCatalog::builtin(), "h100-sxm", 128);
  auto expect_msg = [&](Layout l, const std::string& needle) {
    try {
      evaluate(t, c, l);
      ADD_FAILURE() << "no error for " << l.str();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg(Layout{3, 1, 1, 0, 1, 1}, "--tp 3");
  expect_msg(Layout{3, 1, 1, 0, 1, 1}, "allowed: 1,2,4,8,16,32,64");
  expect_msg(Layout{8, 3, 1, 0, 1, 1}, "--pp 3");
  expect_msg(Layout{8, 4, 2, 0, 1, 256}, "--gpus is 128");
  expect_msg(Layout{8, 4, 4, 5, 1, 128}, "--zero 5");
  expect_msg(Layout{8, 4, 4, 0, 1, 100}, "--microbatches 128");
  EXPECT_THROW(make_cluster(HardwareCatalog::builtin(), "v100", 8), InvalidArgument);
}

// JSON equality with a relative tolerance on numbers (unit conversions round).
bool near_equal(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number())
    return std::abs(a.get<double>() - b.get<double>()) <= 1e-9 * std::max(1.0, std::abs(b.get<double>()));
  if (a.type() != b.type() || a.size() != b.size()) return false;
  if (a.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it)
      if (!b.contains(it.key()) || !near_equal(it.value(), b[it.key()])) return false;
    return true;
  }
  if (a.is_array()) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!near_equal(a[i], b[i])) return false;
    return true;
  }
  return a == b;
}

TEST(Catalog, ShareFilesMatchBuiltinsAndUsersCanAdd) {
  HardwareCatalog builtin = HardwareCatalog::builtin();
  HardwareCatalog loaded = builtin;
  loaded.load_dir(std::string(TRIDENT_SOURCE_DIR) + "/share/trident/hardware", true);
  EXPECT_TRUE(near_equal(loaded.to_json(), builtin.to_json()))
      << "share/trident/hardware/*.json and the compiled-in catalog differ:\n"
      << loaded.to_json().dump(1) << "\nvs\n" << builtin.to_json().dump(1);
  EXPECT_NEAR(builtin.gpu("h100-sxm").peak_bf16_flops, 989e12, 1);
  EXPECT_NEAR(builtin.link("nvlink4").spec.bandwidth_Bps, 450e9, 1);
  EXPECT_NEAR(builtin.link("nvlink4").bidirectional_Bps, 900e9, 1);
  EXPECT_EQ(builtin.node("dgx-h100").gpus_per_node, 8);
  EXPECT_EQ(builtin.host("this-machine").cpu_cores, 2);

  auto dir = std::filesystem::temp_directory_path() / ("trident_plan_cat_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "mine.json") << R"({"gpus": [{"name": "b200", "memory_gib": 180, "peak_bf16_tflops": 2250,
      "hbm_gbps": 8000}], "links": [{"name": "h100-sxm-slow", "bandwidth_gbps": 1}]})";
  HardwareCatalog user = builtin;
  user.load_dir(dir.string(), true);
  EXPECT_NEAR(user.gpu("b200").peak_bf16_flops, 2250e12, 1);
  EXPECT_NEAR(user.link("h100-sxm-slow").bidirectional_Bps, 2e9, 1);
  std::ofstream(dir / "zbad.json") << R"({"gpus": [{"memory_gib": 1}]})";
  HardwareCatalog bad = builtin;
  EXPECT_THROW(bad.load_dir(dir.string(), true), IoError);
  std::filesystem::remove_all(dir);
  EXPECT_THROW(bad.load_dir("/nonexistent/trident", true), IoError);
}

TEST(PlanCli, JsonRecommendationAndErrors) {
  int st = 0;
  std::string out = run_cli("plan --model llama-65b --gpus 128 --global-batch 512 --json", &st);
  ASSERT_EQ(st, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["recommended"]["layout"]["tp"], 8);
  EXPECT_EQ(j["recommended"]["layout"]["pp"], 4);
  EXPECT_EQ(j["recommended"]["layout"]["dp"], 4);
  for (const char* k : {"memory_per_gpu_bytes", "fits", "model_flops_per_iter", "step_time_s", "tflops_per_gpu", "mfu",
                        "comm", "bubble_fraction"})
    EXPECT_TRUE(j["recommended"].contains(k)) << k;

  out = run_cli("plan --model gpt2-124m --gpu a100-40gb --gpus 8 --global-batch 64 --tp 2 --pp 2 --zero 1 "
                "--recompute selective --json", &st);
  ASSERT_EQ(st, 0) << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["layout"]["dp"], 2);
  EXPECT_EQ(j["layout"]["microbatches"], 32);
  EXPECT_EQ(j["fits"], true);

  out = run_cli("plan --model llama-65b --gpus 128 --tp 3", &st);
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("--tp 3"), std::string::npos) << out;
  out = run_cli("plan --model llama-65b --gpus 128 --recompute sometimes", &st);
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("none, selective, full"), std::string::npos) << out;
  out = run_cli("plan --model gpt9", &st);
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("llama-65b"), std::string::npos) << out;
  out = run_cli("plan --gpu this-machine --gpus 2 --model gpt2-124m --global-batch 8", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("recommended"), std::string::npos) << out;
}

}  // namespace
}  // namespace trident::plan
