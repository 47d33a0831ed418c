// The CPU kernel benchmark behind `trident bench kernels`: the speed of each CPU kernel at each ISA level
// this machine has, beside the core's nominal peak for that level, on the shapes of a GPT training step
// (default: nanoGPT's CPU config). One thread by default (this thread's CPU time); with threads > 1 each
// kernel runs on 1 and on N threads of the kernels' pool, interleaved, timed by the wall clock, and the row
// shows the speedup.
//
// Peak = GHz x FLOPs/cycle of the level, with GHz measured (a chain of dependent integer adds: one per
// cycle) and FLOPs/cycle nominal: two vector FMA pipes of the level's width (x86-64: 4 lanes, avx2: 8,
// avx512: 16, 2 FLOPs each); vdpbf16ps counts 4 FLOPs per lane (where the level runs bfloat16 on it:
// isa.h, TRIDENT_BF16_DOT); AMX-BF16 1024 per cycle (Sapphire Rapids). Parts with one 512-bit FMA pipe, or
// 512-bit ops split in two (Zen 4), peak at half of that. Where the CPU has AVX-512, the rate of a loop of
// nothing but independent zmm FMAs is measured too, and the rows whose products run on zmm FMAs also show
// their share of it: cores run 512-bit FMAs below the clock the scalar adds measure (about 87% of the
// nominal peak on the Emerald Rapids Xeon measured), so that share says how much a kernel could still gain.
// Times are this thread's CPU time (best of 3 rounds). Memory-bound kernels report GB/s (bytes each must
// read and write) beside memcpy of the same bytes.
//
// Blocking: runs for about (levels x rows x seconds); prints its table to stdout as it goes. Not
// thread-safe (it sets the process's ISA level and kernel thread count, and restores them at the end).
#pragma once

#include <string>

#include "trident/kernels/cpu/isa.h"

namespace trident::bench {

struct KernelBenchOptions {
  std::string isa = "all";  // "all" (every level this CPU has) or a comma list of levels
  int batch = 12, block = 64, embd = 128, heads = 4, vocab = 65;
  int ffn = 0;        // the MLP's hidden width (0: 4 x embd)
  std::string model;  // the named model whose widths these are (shown in the header; "" = given by hand)
  double seconds = 0.3;  // time per measurement (best of 3 rounds)
  int threads = 1;       // above 1: each kernel also runs on 1 thread and the speedup is shown
};

// Runs the benchmark and prints its table to stdout. Throws InvalidArgument for a bad option (a level
// this CPU lacks, a non-positive shape). Returns the process exit code (0).
int run_kernel_bench(const KernelBenchOptions& o);

// Nominal FLOPs per cycle of one core at a level, float32 or bfloat16 products (see the file comment).
double flops_per_cycle(kernels::cpu::Isa isa, bool bf16);

}  // namespace trident::bench
