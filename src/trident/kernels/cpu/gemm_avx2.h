// trident's float32 GEMM for the ISA level avx2 (gemm_avx2.cc says why and how): C[M,N] = (accumulate ? C :
// 0) + op(A) op(B), row-major, one thread, each C element one FMA chain over k in order; nothing for K <= 0
// (gemm.cc answers that case itself). Call it only at level avx2 and up (isa.h); internal to the CPU
// kernels (gemm.cc dispatches to it).
// tri: the triangular products of causal attention, as gemm_avx512's.
#pragma once

#include "trident/kernels/cpu/gemm_avx512.h"

namespace trident::kernels::cpu::detail {

void gemm_avx2(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
               bool accumulate, float* C, int ldc, Tri tri = Tri::kNone);

}  // namespace trident::kernels::cpu::detail
