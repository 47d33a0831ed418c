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

// The elementwise kernels' traffic, counted by hand for a GPT layer without biases at C = 1, F = 4, three
// heads' q/k/v columns Q = 3, float32 activations (4 bytes) and no operand copies: forward ln1 2, qkv out 3,
// attention out 1, proj out 1, residual 3, ln2 2, fc out 4, GELU 12, proj2 out 1, residual 3 = 32 elements;
// backward proj2 dinp 4, GELU product 12, fc dinp 1, ln2 5 + residual 3, proj dinp 1, attention dqkv 3 +
// dout 1, qkv dinp 1, ln1 5 + residual 3 = 39. bf16 operand copies (2 bytes) add 6 bytes per element each
// GEMM and attention call rounds.
TEST(Planner, ElementwiseTrafficCountedByHand) {
  ModelSpec m;
  m.hidden = 1;
  m.heads = 1;
  m.ffn_hidden = 4;
  m.bias = false;
  const TokenTraffic f32 = layer_traffic_per_token(m, 1, 4, 0);
  EXPECT_DOUBLE_EQ(f32.forward, 32 * 4);
  EXPECT_DOUBLE_EQ(f32.backward, 39 * 4);
  // Rounded copies: forward qkv 1 + attention 3 + proj 1 + fc 1 + proj2 4 = 10 elements; backward 2 per
  // linear (dout and input) plus attention's q/k/v and dout: (1+4) + (4+1) + (1+1) + (3+1) + (3+1) = 20.
  const TokenTraffic b16 = layer_traffic_per_token(m, 1, 4, 2);
  EXPECT_DOUBLE_EQ(b16.forward - f32.forward, 10 * 6);
  EXPECT_DOUBLE_EQ(b16.backward - f32.backward, 20 * 6);
  // Tensor parallelism splits the column-parallel widths only.
  m.hidden = 8;
  m.heads = 2;
  m.ffn_hidden = 32;
  EXPECT_LT(layer_traffic_per_token(m, 2, 4, 2).forward, layer_traffic_per_token(m, 1, 4, 2).forward);
  // Softmax + cross-entropy: the logits written, then three passes and the gradient in place.
  m.vocab = 100;
  EXPECT_DOUBLE_EQ(head_traffic_per_token(m, 1, 4, 0).forward, 2 * 8 * 4 + 5 * 100 * 4);
}

// The step the planner predicts for trident's own CUDA kernels (float32 activations, bf16 GEMM operands)
// against what `trident train --device cuda --dtype bfloat16` measured on an H200 on 2026-11-28
// (docs/PERFORMANCE.md, "GPU"): within 20% for each model, where the model of GEMM FLOPs alone predicted
// 0.30-0.51 of the measured step.
TEST(Planner, PredictsTheMeasuredH200Steps) {
  const auto cat = HardwareCatalog::builtin();
  const ClusterSpec c = make_cluster(cat, "h200", 1, 1, "", "", "", Precision::kMixed);
  struct Run {
    const char* model;
    int vocab, seq, batch;
    double measured_s;
  };
  for (const Run& r : {Run{"gpt2", 50304, 1024, 16, 69.9e-3}, Run{"tinyllama-1.1b", 50304, 1024, 4, 108.0e-3},
                       Run{"llama3.2-1b", 128256, 2048, 4, 204.9e-3}}) {
    TrainSpec t;
    t.model = model_preset(r.model);
    t.model.vocab = r.vocab;  // GPT-2's tokenizer, padded (to 128,256 for the Llama 3 shape)
    t.model.seq = r.seq;
    t.global_batch = r.batch;
    t.precision = Precision::kMixed;
    t.activation_bytes = 4;
    t.operand_copy_bytes = 2;
    Layout l;
    l.micro_batch = r.batch;
    const Evaluation e = evaluate(t, c, l);
    const ComputeTime ct = compute_time(t, c, l, t.model.layers, true);
    EXPECT_NEAR(ct.forward_s + ct.backward_s, ct.gemm_s + ct.attention_s + ct.elementwise_s, 1e-12);
    std::printf("%s: predicted %.1f ms (GEMMs %.1f, attention %.1f, elementwise %.1f), measured %.1f: %.2f\n", r.model,
                e.step_time_s * 1e3, ct.gemm_s * 1e3, ct.attention_s * 1e3, ct.elementwise_s * 1e3, r.measured_s * 1e3,
                e.step_time_s / r.measured_s);
    EXPECT_GT(e.step_time_s, 0.8 * r.measured_s) << r.model;
    EXPECT_LT(e.step_time_s, 1.2 * r.measured_s) << r.model;
  }
}

// llama3-8b in mixed precision on one H200 (141 GB, 10% headroom: 126.9 GB usable), micro-batch 1 of 8192
// tokens with full recomputation, counted by hand: without offload it does not fit, with it it does, and the
// host then holds the 12 bytes per parameter of master weights and moments.
TEST(Planner, Llama3_8bOnOneH200FitsOnlyWithOffload) {
  const double L = 32, h = 4096, kv_width = 8 * 128, ffn = 14336, V = 128256, s = 8192;
  const double psi = L * (2 * h * h + 2 * h * kv_width + 3 * h * ffn + 2 * h) + 2 * V * h + h;  // untied, final norm
  ASSERT_EQ(psi, 8030261248.0);
  const double activations = L * 2 * s * h + 4 * s * V;  // each layer's input (bf16) + float32 logits
  const double usable = 0.9 * 141e9;
  TrainSpec t;
  t.model = model_preset("llama3-8b");
  t.global_batch = 1;
  const ClusterSpec c = make_cluster(HardwareCatalog::builtin(), "h200", 1, 1);
  Layout l;
  l.recompute = Recompute::kFull;
  const MemoryCheck without = check_memory(t, c, l);
  EXPECT_DOUBLE_EQ(without.needed_bytes, 16 * psi + activations);
  EXPECT_DOUBLE_EQ(without.usable_bytes, usable);
  EXPECT_GT(without.needed_bytes, usable);
  EXPECT_FALSE(without.fits);
  EXPECT_EQ(without.host_bytes, 0);
  EXPECT_NE(without.advice.find("--offload optimizer"), std::string::npos) << without.advice;
  l.offload = true;
  const MemoryCheck with = check_memory(t, c, l);
  EXPECT_DOUBLE_EQ(with.needed_bytes, 4 * psi + activations);
  EXPECT_DOUBLE_EQ(with.host_bytes, 12 * psi);
  EXPECT_TRUE(with.fits);
  std::printf("llama3-8b bf16 on one H200 (mb 1 x 8192, full recompute): device %.2f GB without offload, %.2f GB with "
              "(host %.2f GB); %.2f GB usable\n",
              without.needed_bytes / 1e9, with.needed_bytes / 1e9, with.host_bytes / 1e9, usable / 1e9);
  // The same in evaluate() (one arithmetic) and in its JSON: the device and the host separately.
  const Evaluation e = evaluate(t, c, l);
  EXPECT_DOUBLE_EQ(e.memory.total(), with.needed_bytes);
  const auto j = e.to_json();
  EXPECT_DOUBLE_EQ(j["memory_per_gpu_bytes"].get<double>(), 4 * psi + activations);
  EXPECT_DOUBLE_EQ(j["host_memory_per_gpu_bytes"].get<double>(), 12 * psi);
  EXPECT_EQ(j["layout"]["offload"], true);
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
  EXPECT_DOUBLE_EQ(user.gpu("b200").attention_bwd_efficiency, GpuSpec{}.attention_bwd_efficiency);
  std::ofstream(dir / "zbad.json") << R"({"gpus": [{"memory_gib": 1}]})";
  HardwareCatalog bad = builtin;
  EXPECT_THROW(bad.load_dir(dir.string(), true), IoError);
  // An efficiency is a fraction of a peak: a percentage written as 18 is refused by name.
  std::filesystem::remove(dir / "zbad.json");
  std::ofstream(dir / "zbad.json") << R"({"gpus": [{"name": "h200", "attention_fwd_efficiency": 18}]})";
  HardwareCatalog pct = builtin;
  try {
    pct.load_dir(dir.string(), true);
    ADD_FAILURE() << "an efficiency of 18 was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("h200"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(0, 1]"), std::string::npos) << e.what();
  }
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

  // --offload: the device's and the host's memory, both printed; the exit code says whether the device fits.
  out = run_cli("plan --model llama3-8b --gpu h200 --gpus 1 --global-batch 1 --zero 0 --recompute full", &st);
  EXPECT_EQ(st, 3) << out;
  EXPECT_NE(out.find("host memory per GPU: 0.00 GB"), std::string::npos) << out;
  out = run_cli("plan --model llama3-8b --gpu h200 --gpus 1 --global-batch 1 --zero 0 --recompute full --offload optimizer",
                &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("memory per GPU: 38.47 GB"), std::string::npos) << out;
  EXPECT_NE(out.find("host memory per GPU: 96.36 GB = optimizer 64.24 + master 32.12"), std::string::npos) << out;
  out = run_cli("plan --model llama3-8b --offload gpu", &st);
  EXPECT_EQ(st, 2) << out;
  EXPECT_NE(out.find("--offload 'gpu': allowed none, optimizer"), std::string::npos) << out;

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
