// The kernel benchmark's peak table and option checks (bench/kernel_bench.h); one tiny run end to end.
#include <gtest/gtest.h>

#include <string>

#include "harness/cli_run.h"

#include "trident/bench/kernel_bench.h"
#include "trident/core/error.h"
#include "trident/kernels/cpu/isa.h"

namespace {

namespace kc = trident::kernels::cpu;

// Two FMA pipes of the level's width, 2 FLOPs per lane; AMX-BF16 1024 per cycle for bfloat16 products.
TEST(KernelBench, NominalFlopsPerCycleByLevel) {
  using trident::bench::flops_per_cycle;
  EXPECT_EQ(flops_per_cycle(kc::Isa::kPortable, false), 16);
  EXPECT_EQ(flops_per_cycle(kc::Isa::kAvx2, false), 32);
  EXPECT_EQ(flops_per_cycle(kc::Isa::kAvx512, false), 64);
  EXPECT_EQ(flops_per_cycle(kc::Isa::kAvx512, true), 64);  // bfloat16 rounded onto float32 FMAs
  EXPECT_EQ(flops_per_cycle(kc::Isa::kAvx512Bf16, false), 64);
  EXPECT_EQ(flops_per_cycle(kc::Isa::kAmx, false), 64);
  EXPECT_EQ(flops_per_cycle(kc::Isa::kAmx, true), 1024);
}

TEST(KernelBench, RejectsBadOptions) {
  trident::bench::KernelBenchOptions o;
  o.embd = 10;
  o.heads = 3;  // 10 is not divisible by 3
  EXPECT_THROW(trident::bench::run_kernel_bench(o), trident::InvalidArgument);
  o = {};
  o.seconds = 0;
  EXPECT_THROW(trident::bench::run_kernel_bench(o), trident::InvalidArgument);
  o = {};
  o.threads = 0;
  EXPECT_THROW(trident::bench::run_kernel_bench(o), trident::InvalidArgument);
  o = {};
  o.isa = "no-such-level";
  EXPECT_THROW(trident::bench::run_kernel_bench(o), trident::InvalidArgument);
}

TEST(KernelBench, TinyRunAtThePortableLevelRestoresTheLevel) {
  const kc::Isa before = kc::active_isa();
  trident::bench::KernelBenchOptions o;
  o.isa = "portable";
  o.batch = 2, o.block = 8, o.embd = 16, o.heads = 2, o.vocab = 5;
  o.ffn = 24;  // a MLP width other than 4 C (Llama's) reaches the GEMMs' shapes
  o.seconds = 0.003;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(trident::bench::run_kernel_bench(o), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(kc::active_isa(), before);
  EXPECT_NE(out.find("C 16, MLP 24, heads 2, vocab 5"), std::string::npos) << out;
  EXPECT_NE(out.find("gemm f32 dY W (16x16x24)"), std::string::npos) << out;
  EXPECT_NE(out.find("gemm bf16 dY^T X (24x16x16)"), std::string::npos) << out;
}

// `trident bench kernels --model NAME` takes the widths of the planner's catalog entry; an unknown name is an error that lists the catalog, and widths given by hand beside a model are
// refused.
TEST(KernelBenchCli, ModelNamesTheWidths) {
  using trident::testing::run_trident;
  const std::string tiny = " --isa portable --batch 1 --block 8 --seconds 0.003";
  auto r = run_trident("bench kernels --model gpt2" + tiny);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("shapes of gpt2: B 1, T 8, C 768, MLP 3072, heads 12, vocab 50257"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gemm f32 x W^T (8x3072x768)"), std::string::npos) << r.out;
  r = run_trident("bench kernels --model no-such-model" + tiny);
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("no-such-model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("llama3.2-1b"), std::string::npos) << r.out;  // the catalog is listed
  r = run_trident("bench kernels --model gpt2 --embd 64" + tiny);
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("--embd"), std::string::npos) << r.out;
}

}  // namespace
