// CPU feature detection and the active ISA level of the kernels (see isa.h).
#include "trident/kernels/cpu/isa.h"

#include <atomic>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/kernels/cpu/gemm_avx512.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TRIDENT_X86_CPUID 1
#endif

namespace trident::kernels::cpu {

namespace detail {
std::atomic<int> g_isa{-1};
// Names of the GEMMs each level runs (gemm.cc, next to the table that selects them).
const char* gemm_f32_kernel(Isa isa);
const char* gemm_bf16_kernel(Isa isa);
// The attention kernel each level runs by precision (attention.cc, next to its table).
std::string attention_kernel(Isa isa, Precision p);
}  // namespace detail

namespace {

constexpr const char* kNames[] = {"portable", "avx2", "avx512", "avx512bf16", "amx"};

struct Features {
  bool avx2 = false, fma = false, bmi1 = false, bmi2 = false, lzcnt = false, movbe = false, f16c = false;
  bool os_avx = false;  // XCR0: the OS saves the YMM state
  bool avx512f = false, avx512bw = false, avx512cd = false, avx512dq = false, avx512vl = false;
  bool os_avx512 = false;  // XCR0: opmask and ZMM state
  bool avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
  bool os_amx = false;       // XCR0: tile config and data
  bool amx_granted = false;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded
  Isa level = Isa::kPortable;
};

#ifdef TRIDENT_X86_CPUID
uint64_t xgetbv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

Features detect() {
  Features f;
#ifdef TRIDENT_X86_CPUID
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  f.movbe = (c >> 22) & 1;
  f.f16c = (c >> 29) & 1;
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  f.os_avx = avx && (xcr0 & 0x6) == 0x6;
  f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;
  f.os_amx = (xcr0 & 0x60000) == 0x60000;
  unsigned ea = 0, eb = 0, ec = 0, ed = 0;
  if (__get_cpuid(0x80000001, &ea, &eb, &ec, &ed)) f.lzcnt = (ec >> 5) & 1;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.bmi1 = (b >> 3) & 1;
    f.avx2 = (b >> 5) & 1;
    f.bmi2 = (b >> 8) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512cd = (b >> 28) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    const unsigned max_sub = a;
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = (a >> 5) & 1;
  }
  const bool v3 = f.os_avx && f.avx2 && f.fma && f.bmi1 && f.bmi2 && f.lzcnt && f.movbe && f.f16c;
  const bool v4 = v3 && f.os_avx512 && f.avx512f && f.avx512bw && f.avx512cd && f.avx512dq && f.avx512vl;
  // Linux hands out the AMX tile state only on request (ARCH_REQ_XCOMP_PERM = 0x1023, XTILEDATA = 18).
  if (v4 && f.avx512_bf16 && f.amx_tile && f.amx_bf16 && f.os_amx)
    f.amx_granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  f.level = !v3              ? Isa::kPortable
            : !v4            ? Isa::kAvx2
            : !f.avx512_bf16 ? Isa::kAvx512
            : !f.amx_granted ? Isa::kAvx512Bf16
                             : Isa::kAmx;
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

std::mutex g_init_mu;

}  // namespace

const char* isa_name(Isa isa) {
  const int i = static_cast<int>(isa);
  return i >= 0 && i < 5 ? kNames[i] : "unknown";
}

Isa parse_isa(const std::string& name) {
  for (int i = 0; i < 5; ++i)
    if (name == kNames[i]) return static_cast<Isa>(i);
  TRIDENT_THROW(InvalidArgument,
                "ISA level '{}': use portable, avx2, avx512, avx512bf16 or amx (or auto: the highest "
                "this CPU supports)",
                name);
}

Isa machine_isa() { return features().level; }

std::string cpu_features() {
  const Features& f = features();
  std::string have, missing;
  auto add = [&](bool on, const char* name) {
    std::string& s = on ? have : missing;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.os_avx, "avx(os)");
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.bmi1 && f.bmi2 && f.lzcnt && f.movbe && f.f16c, "bmi/lzcnt/movbe/f16c");
  add(f.os_avx512, "avx512(os)");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512cd, "avx512cd");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vl, "avx512vl");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_tile, "amx-tile");
  add(f.amx_bf16, "amx-bf16");
  if (f.amx_tile) add(f.os_amx && f.amx_granted, "amx(os permission)");
  return missing.empty() ? have : have + " (no " + missing + ")";
}

Isa set_isa(Isa isa) {
  TRIDENT_CHECK(static_cast<int>(isa) <= static_cast<int>(machine_isa()), InvalidArgument,
                "ISA level {} is not available: this CPU supports up to {} (features: {}); choose {} or lower",
                isa_name(isa), isa_name(machine_isa()), cpu_features(), isa_name(machine_isa()));
  const int before = detail::isa_level();
  detail::g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return static_cast<Isa>(before);
}

Isa active_isa() { return static_cast<Isa>(detail::isa_level()); }

namespace detail {
int init_isa() {
  std::lock_guard<std::mutex> lock(g_init_mu);
  int v = g_isa.load(std::memory_order_relaxed);
  if (v >= 0) return v;
  const std::string want = env::isa();
  Isa isa = machine_isa();
  if (want != "auto") {
    const Isa asked = parse_isa(want);
    TRIDENT_CHECK(static_cast<int>(asked) <= static_cast<int>(isa), InvalidArgument,
                  "TRIDENT_ISA={}: this CPU supports up to {} (features: {}); set TRIDENT_ISA={} or lower, or unset it",
                  want, isa_name(isa), cpu_features(), isa_name(isa));
    isa = asked;
  }
  v = static_cast<int>(isa);
  g_isa.store(v, std::memory_order_relaxed);
  return v;
}
}  // namespace detail

Bf16Dot parse_bf16_dot(const std::string& name) {
  if (name == "auto") return Bf16Dot::kAuto;
  if (name == "on") return Bf16Dot::kOn;
  if (name == "off") return Bf16Dot::kOff;
  TRIDENT_THROW(InvalidArgument,
                "TRIDENT_BF16_DOT='{}': use auto (vdpbf16ps where it measures faster than float32 FMAs), on or off",
                name);
}

const char* bf16_dot_name(Bf16Dot mode) {
  return mode == Bf16Dot::kOn ? "on" : mode == Bf16Dot::kOff ? "off" : "auto";
}

Bf16DotRates bf16_dot_rates() {
  static const Bf16DotRates r = [] {
    Bf16DotRates m;
    m.fma_gflops = detail::probe_fma_gflops();
    m.dpbf16_gflops = detail::probe_dpbf16_gflops();
    return m;
  }();
  return r;
}

bool bf16_dot_pays(const Bf16DotRates& r) {
  return r.dpbf16_gflops > 0 && r.dpbf16_gflops >= kBf16DotMinGain * r.fma_gflops;
}

namespace {
std::atomic<int> g_bf16_dot{-1};
}  // namespace

Bf16Dot bf16_dot_mode() {
  int v = g_bf16_dot.load(std::memory_order_relaxed);
  if (v < 0) {
    std::lock_guard<std::mutex> lock(g_init_mu);
    v = g_bf16_dot.load(std::memory_order_relaxed);
    if (v < 0) {
      v = static_cast<int>(parse_bf16_dot(env::bf16_dot()));
      g_bf16_dot.store(v, std::memory_order_relaxed);
    }
  }
  return static_cast<Bf16Dot>(v);
}

Bf16Dot set_bf16_dot(Bf16Dot mode) {
  const Bf16Dot before = bf16_dot_mode();
  g_bf16_dot.store(static_cast<int>(mode), std::memory_order_relaxed);
  return before;
}

bool bf16_dot_in_use() {
  const Bf16Dot m = bf16_dot_mode();
  if (m != Bf16Dot::kAuto) return m == Bf16Dot::kOn;
  static const bool pays = bf16_dot_pays(bf16_dot_rates());
  return pays;
}

std::string kernel_summary() {
  const Isa isa = active_isa();
  const int clone = isa >= Isa::kAvx512 ? 2 : static_cast<int>(isa);
  const char* clone_name = clone == 2 ? "x86-64-v4" : clone == 1 ? "x86-64-v3" : "x86-64";
  std::string s = std::string("isa ") + isa_name(isa) + " (machine " + isa_name(machine_isa()) + "): gemm float32 " +
                  detail::gemm_f32_kernel(isa) + ", gemm bfloat16 " + detail::gemm_bf16_kernel(isa) + ", attention float32 " +
                  detail::attention_kernel(isa, Precision::kFloat32) + ", attention bfloat16 " +
                  detail::attention_kernel(isa, Precision::kBFloat16) + ", layernorm/gelu/softmax-xent/adamw " + clone_name;
  if (isa == Isa::kAvx512Bf16) {
    const Bf16DotRates r = bf16_dot_rates();
    s += fmt::format("; bfloat16 dot: TRIDENT_BF16_DOT={}, vdpbf16ps {:.0f} against FMA {:.0f} GFLOP/s on one core{}",
                     bf16_dot_name(bf16_dot_mode()), r.dpbf16_gflops, r.fma_gflops,
                     bf16_dot_mode() != Bf16Dot::kAuto ? ""
                     : bf16_dot_in_use()               ? " (faster: used)"
                                                       : " (not faster here: bfloat16 GEMMs run on FMAs)");
  }
  return s;
}

}  // namespace trident::kernels::cpu
