// Micro-benchmarks of trident's CPU training core on nanoGPT's CPU configuration (n_layer 4, n_head 4,
// n_embd 128, block_size 64, batch_size 12, vocab 65 as tiny Shakespeare's characters), one thread.
// Run: env -u OPENBLAS_CORETYPE ./bench_kernels   (the environment's OPENBLAS_CORETYPE=Haswell would hold
// OpenBLAS to AVX2 kernels). Counters: tokens_per_s (items/s) for whole steps, GFLOP/s for kernels.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "trident/kernels/cpu/ops.h"
#include "trident/nn/models.h"
#include "trident/optim/adamw.h"
#include "trident/optim/schedule.h"

namespace kc = trident::kernels::cpu;

namespace {

constexpr int kB = 12, kT = 64, kC = 128, kV = 65;

nlohmann::json nanogpt_cpu(const std::string& dtype, bool ckpt) {
  return {{"n_layer", 4},  {"n_head", 4},   {"n_embd", kC},  {"block_size", kT},
          {"vocab_size", kV}, {"bias", false}, {"dtype", dtype}, {"activation_checkpointing", ckpt}};
}

std::vector<int32_t> random_tokens(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % kV);
  return t;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// One training step: forward_backward + grad clip + AdamW (what `trident train` does per iteration).
void train_step(benchmark::State& state, const std::string& dtype, bool ckpt, bool bias) {
  kc::set_num_threads(1);
  auto cfg = nanogpt_cpu(dtype, ckpt);
  cfg["bias"] = bias;
  auto model = trident::nn::make_model(cfg);
  trident::optim::AdamW opt(*model, {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f});
  auto x = random_tokens(kB * kT, 1), y = random_tokens(kB * kT, 2);
  float loss = 0;
  for (auto _ : state) {
    model->zero_grad();
    loss = model->forward_backward(x.data(), y.data(), kB, kT, true);
    trident::optim::clip_grad_norm(model->grad_data(), model->num_params(), 1.0f);
    opt.step(1e-3f);
  }
  state.counters["loss"] = loss;
  state.SetItemsProcessed(state.iterations() * kB * kT);
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * kB * kT,
                                                      benchmark::Counter::kIsRate);
}

void BM_TrainStepGpt(benchmark::State& s) { train_step(s, "float32", false, true); }
void BM_TrainStepGptNoBias(benchmark::State& s) { train_step(s, "float32", false, false); }
void BM_TrainStepGptCheckpointed(benchmark::State& s) { train_step(s, "float32", true, true); }
void BM_TrainStepGptBf16(benchmark::State& s) { train_step(s, "bfloat16", false, true); }

void BM_ForwardBackwardGpt(benchmark::State& state) {
  kc::set_num_threads(1);
  auto model = trident::nn::make_model(nanogpt_cpu("float32", false));
  auto x = random_tokens(kB * kT, 1), y = random_tokens(kB * kT, 2);
  for (auto _ : state) {
    model->zero_grad();
    benchmark::DoNotOptimize(model->forward_backward(x.data(), y.data(), kB, kT, true));
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * kB * kT,
                                                      benchmark::Counter::kIsRate);
}

void BM_Sgemm(benchmark::State& state) {
  kc::set_num_threads(1);
  const int M = state.range(0), N = state.range(1), K = state.range(2);
  const bool bf16 = state.range(3) != 0;
  auto a = random_floats(size_t(M) * K, 1), b = random_floats(size_t(N) * K, 2);
  std::vector<float> c(size_t(M) * N);
  for (auto _ : state)
    kc::gemm(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N,
             bf16 ? kc::Precision::kBFloat16 : kc::Precision::kFloat32);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_Attention(benchmark::State& state) {
  const bool backward = state.range(0) != 0;
  auto qkv = random_floats(size_t(kB) * kT * 3 * kC, 1), dout = random_floats(size_t(kB) * kT * kC, 2);
  std::vector<float> out(size_t(kB) * kT * kC), lse(size_t(kB) * 4 * kT), dqkv(qkv.size());
  kc::attention_forward(out.data(), lse.data(), qkv.data(), kB, kT, kC, 4);
  for (auto _ : state) {
    if (backward) kc::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), kB, kT, kC, 4);
    else kc::attention_forward(out.data(), lse.data(), qkv.data(), kB, kT, kC, 4);
  }
}

void BM_Gelu(benchmark::State& state) {
  const size_t n = size_t(kB) * kT * 4 * kC;
  auto x = random_floats(n, 1), g = random_floats(n, 2);
  std::vector<float> y(n);
  for (auto _ : state) {
    if (state.range(0)) kc::gelu_backward(y.data(), x.data(), g.data(), n, kc::GeluKind::kExact);
    else kc::gelu_forward(y.data(), x.data(), n, kc::GeluKind::kExact);
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_LayerNorm(benchmark::State& state) {
  const int N = kB * kT;
  auto x = random_floats(size_t(N) * kC, 1), g = random_floats(size_t(N) * kC, 2), w = random_floats(kC, 3);
  std::vector<float> y(size_t(N) * kC), mean(N), rstd(N), dx(size_t(N) * kC), dw(kC), db(kC);
  kc::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, kC);
  for (auto _ : state) {
    if (state.range(0))
      kc::layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(), rstd.data(), N, kC);
    else kc::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, kC);
  }
}

}  // namespace

BENCHMARK(BM_TrainStepGpt)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_TrainStepGptNoBias)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_TrainStepGptCheckpointed)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_TrainStepGptBf16)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_ForwardBackwardGpt)->Unit(benchmark::kMillisecond)->MinTime(1.0);
// The GEMM shapes of one step: [N=768] x {qkv 384, proj 128, fc 512} x K, backward weight shapes.
BENCHMARK(BM_Sgemm)
    ->Args({768, 384, 128, 0})
    ->Args({768, 512, 128, 0})
    ->Args({768, 128, 512, 0})
    ->Args({384, 128, 768, 0})
    ->Args({768, 65, 128, 0})
    ->Args({768, 512, 128, 1})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Attention)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Gelu)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayerNorm)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
