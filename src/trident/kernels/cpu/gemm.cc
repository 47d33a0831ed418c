// GEMM and Linear layers through OpenBLAS (cblas_sgemm; cblas_sbgemm for bfloat16).
#include <cblas.h>
#include <sched.h>

#include <atomic>
#include <vector>

#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/kernels/cpu/gemm_avx512.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/simd.h"

// Debian's OpenBLAS 0.3.21 is built without BUILD_BFLOAT16: cblas.h declares cblas_sbgemm but the library
// lacks it. A weak reference lets one binary use it where present and emulate it elsewhere.
extern "C" void cblas_sbgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint,
                             float, const bfloat16*, blasint, const bfloat16*, blasint, float, float*, blasint)
    __attribute__((weak));

namespace trident::kernels::cpu {

bool have_native_bf16_gemm() { return cblas_sbgemm != nullptr; }

namespace {
int g_threads = 0;

int default_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
  return 1;
}

// Copies op-less matrix X (rows x cols, leading dim ld) into contiguous bfloat16.
void pack_bf16(std::vector<uint16_t>& dst, const float* x, int rows, int cols, int ld) {
  dst.resize(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) to_bf16(dst.data() + static_cast<size_t>(r) * cols, x + static_cast<size_t>(r) * ld, cols);
}

// Rounds X to bfloat16 precision, kept as float32 (products of two bfloat16 values are exact in float32,
// so sgemm on rounded operands computes what a bfloat16 GEMM with float32 accumulation does).
TRIDENT_CLONES
void round_bf16(std::vector<float>& dst, const float* x, int rows, int cols, int ld) {
  dst.resize(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const float* src = x + static_cast<size_t>(r) * ld;
    float* out = dst.data() + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      uint32_t u;
      std::memcpy(&u, &src[c], 4);
      u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
      std::memcpy(&out[c], &u, 4);
    }
  }
}
}  // namespace

void set_num_threads(int n) {
  if (n <= 0) n = default_threads();
  g_threads = n;
  openblas_set_num_threads(n);
}

int num_threads() { return g_threads > 0 ? g_threads : openblas_get_num_threads(); }

namespace {
// TRIDENT_CPU_KERNELS (read once): auto = the AVX-512 kernels where the CPU has them; portable = OpenBLAS
// GEMMs and the portable attention (the A/B baseline, and what CPUs without AVX-512 run).
bool native_kernels_configured() {
  static const bool enabled = [] {
    const std::string mode = env::cpu_kernels();
    TRIDENT_CHECK(mode == "auto" || mode == "portable", InvalidArgument,
                  "TRIDENT_CPU_KERNELS='{}': expected auto (AVX-512 kernels where the CPU has them) or portable",
                  mode);
    return mode == "auto" && detail::avx512_gemm_available();
  }();
  return enabled;
}
std::atomic<bool> g_native_allowed{true};

// The AVX-512 GEMM serves single-thread float32 products with alpha 1 and beta 0 or 1 (every call the
// models make); anything else goes to OpenBLAS.
bool use_native_gemm(float alpha, float beta) {
  return alpha == 1.0f && (beta == 0.0f || beta == 1.0f) && detail::native_kernels_enabled() && num_threads() == 1;
}
}  // namespace

bool set_native_kernels(bool on) {
  const bool was = g_native_allowed.exchange(on);
  return was && native_kernels_configured();
}

bool native_kernels_active() { return detail::native_kernels_enabled(); }

namespace detail {
bool native_kernels_enabled() {
  return g_native_allowed.load(std::memory_order_relaxed) && native_kernels_configured();
}
}  // namespace detail

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision p) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[static_cast<size_t>(i) * ldc + j] = beta == 0.0f ? 0.0f : beta * C[static_cast<size_t>(i) * ldc + j];
    return;
  }
  if (p == Precision::kFloat32) {
    if (use_native_gemm(alpha, beta)) {
      detail::gemm_avx512(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta == 1.0f, C, ldc);
      return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Stored shape of A is (trans_a ? K x M : M x K); of B (trans_b ? N x K : K x N).
  int ar = trans_a ? K : M, ac = trans_a ? M : K;
  int br = trans_b ? N : K, bc = trans_b ? K : N;
  if (!have_native_bf16_gemm()) {
    if (use_native_gemm(alpha, beta) && detail::amx_bf16_available()) {
      detail::gemm_amx_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta == 1.0f, C, ldc);
      return;
    }
    thread_local std::vector<float> a32, b32;
    round_bf16(a32, A, ar, ac, lda);
    round_bf16(b32, B, br, bc, ldb);
    if (use_native_gemm(alpha, beta)) {
      detail::gemm_avx512(trans_a, trans_b, M, N, K, a32.data(), ac, b32.data(), bc, beta == 1.0f, C, ldc);
      return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, a32.data(), ac, b32.data(), bc, beta, C, ldc);
    return;
  }
  thread_local std::vector<uint16_t> a16, b16;
  pack_bf16(a16, A, ar, ac, lda);
  pack_bf16(b16, B, br, bc, ldb);
  cblas_sbgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
               alpha, a16.data(), ac, b16.data(), bc, beta, C, ldc);
}

TRIDENT_CLONES
static void fill_bias_rows(float* out, const float* bias, int N, int OC) {
  for (int i = 0; i < N; ++i) {
    float* o = out + static_cast<size_t>(i) * OC;
    for (int j = 0; j < OC; ++j) o[j] = bias[j];
  }
}

TRIDENT_CLONES
static void column_sums_acc(float* dbias, const float* dout, int N, int OC) {
  for (int i = 0; i < N; ++i) {
    const float* d = dout + static_cast<size_t>(i) * OC;
    for (int j = 0; j < OC; ++j) dbias[j] += d[j];
  }
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    Precision p) {
  // With a bias, out starts as the bias rows and the GEMM accumulates (beta 1): this replaces BLAS's
  // zeroing pass for beta 0 and a separate bias pass.
  if (bias) fill_bias_rows(out, bias, N, OC);
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC, p);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, float dinp_beta, Precision p) {
  if (dinp) gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, dinp_beta, dinp, C, p);
  if (dweight) gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, p);
  if (dbias) column_sums_acc(dbias, dout, N, OC);
}

TRIDENT_CLONES
void to_bf16(uint16_t* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &in[i], 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    // NaN stays NaN (quiet).
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded);
  }
}

TRIDENT_CLONES
void from_bf16(float* out, const uint16_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &u, 4);
  }
}

}  // namespace trident::kernels::cpu
