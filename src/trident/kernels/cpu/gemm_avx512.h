// Internal: the AVX-512 float32 GEMM behind kernels::cpu::gemm (see gemm_avx512.cc for the blocking and
// the numerics). Ownership: none (one thread-local packing buffer). Blocking: runs on the calling thread.
// Thread-safety: concurrent calls on disjoint C are safe. No timeouts.
#pragma once

namespace trident::kernels::cpu::detail {

// True when the CPU has AVX-512 F/VL/DQ/BW and FMA (checked once, at first call).
bool avx512_gemm_available();

// True when the AVX-512 kernels (this GEMM, the attention built on it) serve float32 work: the CPU has
// AVX-512, TRIDENT_CPU_KERNELS is not "portable" and set_native_kernels has not turned them off (GEMMs
// also need a one-thread BLAS pool). Defined in gemm.cc.
bool native_kernels_enabled();

// Triangular structure the caller guarantees or needs (causal attention), to skip work:
// kLowerC: only C(i, j) with j <= i is needed (others in the computed 16-column groups hold garbage);
// kLowerA: op(A)(i, k) == 0 for k > i (requires M <= K); kUpperA: op(A)(i, k) == 0 for k < i (M <= K).
// Skipped terms are exact zeros, so the chains equal the full ones.
enum class Tri : int { kNone = 0, kLowerC, kLowerA, kUpperA };

// C[M,N] = (accumulate ? C : 0) + op(A) op(B), row-major, op(X) = X^T when trans_x; each element is one
// fused multiply-add chain over k in order. Only call when avx512_gemm_available().
void gemm_avx512(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                 bool accumulate, float* C, int ldc, Tri tri = Tri::kNone);

// bfloat16 products on AMX: C = (accumulate ? C : 0) + bf16(op(A)) bf16(op(B)), operands rounded to
// bfloat16 (round-to-nearest-even), products summed in float32 by the tile unit (denormals flushed).
// amx_bf16_available(): the CPU has AMX-BF16 and the kernel granted the tile state (asked once).
bool amx_bf16_available();
void gemm_amx_bf16(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                   bool accumulate, float* C, int ldc);

}  // namespace trident::kernels::cpu::detail
