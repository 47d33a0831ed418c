// The kernel benchmark's peak table and option checks (bench/kernel_bench.h); one tiny run end to end.
#include <gtest/gtest.h>

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
  o.seconds = 0.003;
  EXPECT_EQ(trident::bench::run_kernel_bench(o), 0);
  EXPECT_EQ(kc::active_isa(), before);
}

}  // namespace
