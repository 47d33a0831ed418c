#include "trident/bench/kernel_bench.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/error.h"
#include "trident/kernels/cpu/attention_bf16.h"
#include "trident/kernels/cpu/ops.h"

namespace trident::bench {
namespace {

namespace kc = kernels::cpu;

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// CPU time of this thread: on a machine shared with other work, what the kernel itself took.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double wall_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Seconds per call of f by `clock`: one untimed call, then calls until `budget` has passed.
double per_call(const std::function<void()>& f, double budget, double (*clock)()) {
  f();
  int64_t n = 0;
  const double t0 = clock();
  double el = 0;
  do {
    f();
    ++n;
    el = clock() - t0;
  } while (el < budget);
  return el / static_cast<double>(n);
}

// CPU seconds per call of f, best of 3 rounds of `seconds` / 3.
double time_call(const std::function<void()>& f, double seconds) {
  double best = 1e30;
  for (int round = 0; round < 3; ++round) best = std::min(best, per_call(f, seconds / 3, thread_seconds));
  return best;
}

// Wall seconds per call of f on 1 and on n threads: three rounds, each timing 1 thread then n threads
// for `seconds` / 6 each, the best of each kept. Wall time because the workers' time counts; interleaved
// so a change of the machine's load hits both.
std::pair<double, double> time_threads(const std::function<void()>& f, double seconds, int n) {
  double best1 = 1e30, bestn = 1e30;
  for (int round = 0; round < 3; ++round) {
    kc::set_num_threads(1);
    best1 = std::min(best1, per_call(f, seconds / 6, wall_seconds));
    kc::set_num_threads(n);
    bestn = std::min(bestn, per_call(f, seconds / 6, wall_seconds));
  }
  return {best1, bestn};
}

// Core clock in GHz: 8 dependent adds per loop iteration retire at one per cycle (CPU time, so time
// slices given to other processes do not count).
double measure_ghz() {
  auto run = [](int64_t iters) {
    uint64_t x = 0, y = 1;
    const double t0 = thread_seconds();
    for (int64_t i = 0; i < iters; ++i) {
#if defined(__x86_64__)
      __asm__ volatile(
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
          : "+r"(x)
          : "r"(y));
#else
      x += y;
#endif
    }
    return thread_seconds() - t0 + 0 * static_cast<double>(x);
  };
  run(10'000'000);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) best = std::min(best, run(50'000'000));
  return 8.0 * 50'000'000 / best / 1e9;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

double cpuinfo_mhz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return std::stod(line.substr(colon + 1));
    }
  return 0;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  return "unknown";
}

}  // namespace

double flops_per_cycle(kc::Isa isa, bool bf16) {
  switch (isa) {
    case kc::Isa::kPortable:
      return 4 * 2 * 2;
    case kc::Isa::kAvx2:
      return 8 * 2 * 2;
    case kc::Isa::kAvx512:
      return 16 * 2 * 2;
    case kc::Isa::kAvx512Bf16:
      return bf16 && kc::bf16_dot_in_use() ? 16 * 4 * 2 : 16 * 2 * 2;  // on FMAs where vdpbf16ps is slower
    case kc::Isa::kAmx:
      return bf16 ? 1024 : 16 * 2 * 2;
  }
  return 0;
}

int run_kernel_bench(const KernelBenchOptions& f) {
  TRIDENT_CHECK(f.batch > 0 && f.block > 0 && f.embd > 0 && f.heads > 0 && f.vocab > 0 && f.embd % f.heads == 0,
                InvalidArgument,
                "bench kernels: --batch, --block, --embd, --heads and --vocab must be positive and --embd divisible by "
                "--heads (got {} {} {} {} {})",
                f.batch, f.block, f.embd, f.heads, f.vocab);
  TRIDENT_CHECK(f.ffn >= 0, InvalidArgument, "bench kernels: --ffn must be 0 (4 x --embd) or positive (got {})",
                f.ffn);
  TRIDENT_CHECK(f.seconds > 0, InvalidArgument, "bench kernels: --seconds must be positive (got {})", f.seconds);
  TRIDENT_CHECK(f.threads >= 1 && f.threads <= 1024, InvalidArgument,
                "bench kernels: --threads must be between 1 and 1024 (got {})", f.threads);
  std::vector<kc::Isa> levels;
  if (f.isa == "all") {
    for (int i = 0; i <= static_cast<int>(kc::machine_isa()); ++i) levels.push_back(static_cast<kc::Isa>(i));
  } else {
    size_t pos = 0;
    while (pos <= f.isa.size()) {
      const size_t comma = std::min(f.isa.find(',', pos), f.isa.size());
      const kc::Isa l = kc::parse_isa(f.isa.substr(pos, comma - pos));
      TRIDENT_CHECK(static_cast<int>(l) <= static_cast<int>(kc::machine_isa()), InvalidArgument,
                    "bench kernels --isa {}: this CPU supports up to {} (features: {})", kc::isa_name(l),
                    kc::isa_name(kc::machine_isa()), kc::cpu_features());
      levels.push_back(l);
      pos = comma + 1;
    }
  }
  kc::set_num_threads(1);
  const double ghz = measure_ghz();
  std::printf("cpu: %s\nfeatures: %s\nmachine level: %s\n", cpu_model().c_str(), kc::cpu_features().c_str(),
              kc::isa_name(kc::machine_isa()));
  std::printf("clock: %.2f GHz measured (dependent adds, thread CPU time), /proc/cpuinfo says %.0f MHz\n", ghz,
              cpuinfo_mhz());
  // What a loop of nothing but independent zmm FMAs reaches on one core: the ceiling of the float32 products
  // at avx512 and up, below the nominal peak where the core runs 512-bit FMAs at a lower clock than the
  // scalar adds above measure.
  const double fma_loop = kc::bf16_dot_rates().fma_gflops;
  if (fma_loop > 0)
    std::printf("zmm FMA loop: %.1f GFLOP/s on one core, %.0f%% of the nominal avx512 peak %.1f (float32 products at "
                "avx512 and up are also shown against it)\n",
                fma_loop, 100 * fma_loop / (ghz * flops_per_cycle(kc::Isa::kAvx512, false)),
                ghz * flops_per_cycle(kc::Isa::kAvx512, false));
  if (f.threads == 1)
    std::printf("1 thread, this thread's CPU time\n");
  else
    std::printf("%d threads (the kernels' pool) against 1, interleaved, wall clock; peak = %d x one core's; load "
                "average at start: %s\n",
                f.threads, f.threads, load_average().c_str());
  const int B = f.batch, T = f.block, C = f.embd, NH = f.heads, V = f.vocab, N = B * T;
  const int F = f.ffn > 0 ? f.ffn : 4 * C;  // the MLP's hidden width: the GEMMs are its up-projection's three
  std::printf("shapes%s%s: B %d, T %d, C %d, MLP %d, heads %d, vocab %d (N = B*T = %d rows)\n\n",
              f.model.empty() ? "" : " of ", f.model.c_str(), B, T, C, F, NH, V, N);

  const auto x = random_floats(static_cast<size_t>(N) * F, 1), w = random_floats(static_cast<size_t>(F) * C, 2);
  const auto qkv = random_floats(static_cast<size_t>(N) * 3 * C, 3, 0.5f),
             g = random_floats(static_cast<size_t>(N) * F, 4);
  const auto logits = random_floats(static_cast<size_t>(N) * V, 5);
  std::vector<float> out(static_cast<size_t>(N) * F), out2(out.size()), dw(static_cast<size_t>(F) * C);
  std::vector<float> mean(N), rstd(N), lse(static_cast<size_t>(B) * NH * T), dqkv(qkv.size()), dl(logits.size());
  std::vector<int32_t> tgt(N);
  for (int i = 0; i < N; ++i) tgt[i] = i % V;
  const size_t np = static_cast<size_t>(12) * C * C;  // one GPT block's parameters
  auto p = random_floats(np, 6), pg = random_floats(np, 7);
  std::vector<float> m(np, 0.0f), v(np, 0.0f);
  std::vector<char> cpa(64 << 20), cpb(cpa.size());

  const bool multi = f.threads > 1;
  if (multi)
    std::printf("%-11s %-34s %10s %10s %7s %10s %8s\n", "isa", "kernel", "measured", "peak", "of peak", "1 thread",
                "speedup");
  else
    std::printf("%-11s %-34s %10s %10s %7s\n", "isa", "kernel", "measured", "peak", "of peak");
  for (kc::Isa l : levels) {
    const kc::Isa before = kc::set_isa(l);
    // peak_level: the level whose peak the row is held to (-1: this one). bfloat16 attention runs
    // vdpbf16ps, not AMX tiles, so at amx it is held to avx512bf16's.
    auto flops_row = [&](const char* name, double flops, bool bf16, const std::function<void()>& fn,
                         int peak_level = -1) {
      const kc::Isa pl = peak_level < 0 ? l : static_cast<kc::Isa>(peak_level);
      if (multi) {
        const auto [s1, sn] = time_threads(fn, f.seconds, f.threads);
        const double gf = flops / sn / 1e9, peak = f.threads * ghz * flops_per_cycle(pl, bf16);
        std::printf("%-11s %-34s %6.1f GF/s %6.1f GF/s %6.0f%% %5.1f GF/s %7.2fx\n", kc::isa_name(l), name, gf, peak,
                    100 * gf / peak, flops / s1 / 1e9, s1 / sn);
        return;
      }
      const double s = time_call(fn, f.seconds);
      const double gf = flops / s / 1e9, peak = ghz * flops_per_cycle(pl, bf16);
      // Rows whose products run on zmm FMAs: float32 at avx512 and up, bfloat16 where it is rounded onto them.
      const bool on_fmas = fma_loop > 0 && static_cast<int>(l) >= static_cast<int>(kc::Isa::kAvx512) &&
                           flops_per_cycle(pl, bf16) == flops_per_cycle(kc::Isa::kAvx512, false);
      if (on_fmas)
        std::printf("%-11s %-34s %6.1f GF/s %6.1f GF/s %6.0f%%  (%.0f%% of the FMA loop)\n", kc::isa_name(l), name, gf,
                    peak, 100 * gf / peak, 100 * gf / fma_loop);
      else
        std::printf("%-11s %-34s %6.1f GF/s %6.1f GF/s %6.0f%%\n", kc::isa_name(l), name, gf, peak, 100 * gf / peak);
    };
    auto bytes_row = [&](const char* name, double bytes, const std::function<void()>& fn) {
      const size_t nb = std::min(cpa.size(), static_cast<size_t>(bytes / 2));
      const double sc = time_call([&] { std::memcpy(cpb.data(), cpa.data(), nb); }, f.seconds / 4);
      const double peak = 2.0 * nb / sc / 1e9;
      if (multi) {
        const auto [s1, sn] = time_threads(fn, f.seconds, f.threads);
        const double gb = bytes / sn / 1e9;
        std::printf("%-11s %-34s %6.1f GB/s %6.1f GB/s %6.0f%% %5.1f GB/s %7.2fx  (peak: memcpy, 1 thread)\n",
                    kc::isa_name(l), name, gb, peak, 100 * gb / peak, bytes / s1 / 1e9, s1 / sn);
        return;
      }
      const double s = time_call(fn, f.seconds);
      const double gb = bytes / s / 1e9;
      std::printf("%-11s %-34s %6.1f GB/s %6.1f GB/s %6.0f%%  (memcpy)\n", kc::isa_name(l), name, gb, peak,
                  100 * gb / peak);
    };
    for (int bf = 0; bf < 2; ++bf) {
      const auto prec = bf ? kc::Precision::kBFloat16 : kc::Precision::kFloat32;
      const double fl = 2.0 * N * C * F;
      char n1[64], n2[64], n3[64];
      std::snprintf(n1, sizeof n1, "gemm %s x W^T (%dx%dx%d)", bf ? "bf16" : "f32", N, F, C);
      std::snprintf(n2, sizeof n2, "gemm %s dY W (%dx%dx%d)", bf ? "bf16" : "f32", N, C, F);
      std::snprintf(n3, sizeof n3, "gemm %s dY^T X (%dx%dx%d)", bf ? "bf16" : "f32", F, C, N);
      flops_row(n1, fl, bf, [&] {
        kc::gemm(false, true, N, F, C, 1.0f, x.data(), C, w.data(), C, 0.0f, out.data(), F, prec);
      });
      flops_row(n2, fl, bf, [&] {
        kc::gemm(false, false, N, C, F, 1.0f, g.data(), F, w.data(), C, 0.0f, out.data(), C, prec);
      });
      flops_row(n3, fl, bf, [&] {
        kc::gemm(true, false, F, C, N, 1.0f, g.data(), F, x.data(), C, 1.0f, dw.data(), C, prec);
      });
    }
    // Causal attention: half of the T x T scores, two products forward, five backward.
    const double attn = 2.0 * B * T * static_cast<double>(T) * C;
    flops_row("attention forward", attn, false,
              [&] { kc::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH); });
    kc::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    flops_row("attention backward", 2.5 * attn, false,
              [&] { kc::attention_backward(dqkv.data(), g.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH); });
    // bfloat16 operands: the flash-style vdpbf16ps kernel where it runs (levels avx512bf16 and amx where
    // vdpbf16ps pays, T past one 64-key tile; the summary line names it), held to vdpbf16ps's peak (not the
    // AMX tiles'), else the float32 kernel, held to the float32 peak.
    const bool flash = static_cast<int>(l) >= static_cast<int>(kc::Isa::kAvx512Bf16) && kc::bf16_dot_in_use() &&
                       T >= kc::detail::flash_bf16_min_t();
    const int attn_peak = std::min(static_cast<int>(l), static_cast<int>(kc::Isa::kAvx512Bf16));
    const auto bf = kc::Precision::kBFloat16;
    flops_row(
        flash ? "attention bf16 fwd (flash)" : "attention bf16 fwd (f32 kernel)", attn, flash,
        [&] { kc::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, bf); }, attn_peak);
    kc::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, bf);
    flops_row(
        flash ? "attention bf16 bwd (flash)" : "attention bf16 bwd (f32 kernel)", 2.5 * attn, flash,
        [&] { kc::attention_backward(dqkv.data(), g.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, bf); },
        attn_peak);
    const double row = 4.0 * N * C;
    bytes_row("layernorm forward", 2 * row,
              [&] { kc::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C); });
    bytes_row("layernorm backward", 3 * row, [&] {
      kc::layernorm_backward(out2.data(), dw.data(), nullptr, g.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                             C);
    });
    bytes_row("gelu forward+grad (MLP width)", 3.0 * 4 * N * F, [&] {
      kc::gelu_forward_and_grad(out.data(), out2.data(), x.data(), static_cast<size_t>(N) * F, kc::GeluKind::kTanh);
    });
    bytes_row("softmax + cross-entropy", 8.0 * N * V,
              [&] { kc::cross_entropy_forward_backward(dl.data(), logits.data(), tgt.data(), N, V, 1.0f / N); });
    bytes_row("adamw (12 C^2 params)", 28.0 * np, [&] {
      kc::adamw_update(p.data(), pg.data(), m.data(), v.data(), np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
    });
    kc::set_isa(before);
  }
  kc::set_num_threads(1);
  std::printf("\n%s\n", kc::kernel_summary().c_str());
  return 0;
}

}  // namespace trident::bench
