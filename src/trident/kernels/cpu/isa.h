// Instruction-set level of the CPU kernels: what this CPU and OS support (read once: cpuid, XGETBV and,
// for AMX, the kernel's permission for the tile state), optionally forced lower with TRIDENT_ISA so every
// path can run on one machine. All CPU kernels dispatch on active_isa().
// Thread-safety: the query functions are safe from any thread; set_isa is for tests and tools and must
// not race kernel calls. No blocking, no timeouts.
#pragma once

#include <string>

namespace trident::kernels::cpu {

// Ordered: each level includes the ones below it.
//   portable    baseline x86-64 code, OpenBLAS GEMMs
//   avx2        AVX2 + FMA (x86-64-v3): trident's float32 GEMM (gemm_avx2.cc), elementwise and attention kernels
//   avx512      AVX-512 F/BW/CD/DQ/VL (x86-64-v4): trident's float32 GEMM and attention
//   avx512bf16  + AVX512_BF16: bfloat16 GEMMs on vdpbf16ps (float32 accumulation)
//   amx         + AMX-BF16 tiles: bfloat16 GEMMs on the tile unit
enum class Isa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };

const char* isa_name(Isa isa);
// "portable", "avx2", "avx512", "avx512bf16" or "amx"; anything else throws InvalidArgument naming the
// accepted values.
Isa parse_isa(const std::string& name);

// The highest level this CPU and OS support (detected once).
Isa machine_isa();
// The CPU features the levels rest on, as found: e.g. "avx2 fma avx512f ... avx512_bf16 (no amx-tile)".
std::string cpu_features();

// The level the kernels run: TRIDENT_ISA (default auto = machine_isa()) at first use, then whatever
// set_isa chose. A TRIDENT_ISA above machine_isa() throws InvalidArgument naming the level and the
// CPU's features.
Isa active_isa();
// Switches the kernels process-wide (tests compare the levels); returns the previous level. A level
// above machine_isa() throws InvalidArgument.
Isa set_isa(Isa isa);

// Whether the bfloat16 GEMMs of level avx512bf16 run on vdpbf16ps or on float32 FMAs over bf16-rounded
// operands (the same products, summed in float32). Having the instruction is not enough: the Intel Xeon
// cores measured here (Emerald Rapids, AMX hidden by the hypervisor) issue it at half the flop rate of
// their FMAs, AMD's Zen 5 at about twice. So both rates are measured once, on first use (about half a
// millisecond), and vdpbf16ps is taken where it runs at least kBf16DotMinGain x the FMAs (auto); on and
// off force the choice (TRIDENT_BF16_DOT, or set_bf16_dot for tests). Level amx is not affected.
enum class Bf16Dot : int { kAuto = 0, kOn = 1, kOff = 2 };
struct Bf16DotRates {
  double dpbf16_gflops = 0, fma_gflops = 0;  // one core; zeros below level avx512bf16
};
inline constexpr double kBf16DotMinGain = 1.25;
// "auto", "on" or "off"; anything else throws InvalidArgument naming the accepted values.
Bf16Dot parse_bf16_dot(const std::string& name);
const char* bf16_dot_name(Bf16Dot mode);
// This core's rates, measured on the first call (later calls return the same figures).
Bf16DotRates bf16_dot_rates();
// auto's rule on given rates.
bool bf16_dot_pays(const Bf16DotRates& r);
// The mode now: TRIDENT_BF16_DOT at first use, then whatever set_bf16_dot chose. set_bf16_dot returns the
// previous mode and, like set_isa, must not race kernel calls.
Bf16Dot bf16_dot_mode();
Bf16Dot set_bf16_dot(Bf16Dot mode);
// Whether level avx512bf16's bfloat16 GEMM is the vdpbf16ps kernel: mode on, or auto and it pays here.
bool bf16_dot_in_use();

// One line naming the level and the kernel each operation runs on it, e.g. "isa avx512bf16 (machine
// avx512bf16): gemm float32 avx512-fma, gemm bfloat16 avx512bf16-dpbf16, ...".
std::string kernel_summary();

}  // namespace trident::kernels::cpu
