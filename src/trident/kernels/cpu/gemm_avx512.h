// Internal: the AVX-512 float32 and bfloat16 GEMMs behind kernels::cpu::gemm (see gemm_avx512.cc for
// the blocking and the numerics). Ownership: none (thread-local packing buffers). Blocking: runs on the calling thread.
// Thread-safety: concurrent calls on disjoint C are safe. No timeouts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trident::kernels::cpu::detail {

// True when the active ISA level (isa.h) is avx2 or higher: trident's own GEMMs (gemm_avx2.h at avx2, this
// one above) and the attention built on them serve float32 work. Defined in gemm.cc.
bool native_kernels_enabled();

// Triangular structure the caller guarantees or needs (causal attention), to skip work:
// kLowerC: only C(i, j) with j <= i is needed (others in the computed 16-column groups hold garbage);
// kLowerA: op(A)(i, k) == 0 for k > i (requires M <= K); kUpperA: op(A)(i, k) == 0 for k < i (M <= K).
// Skipped terms are exact zeros, so the chains equal the full ones.
enum class Tri : int { kNone = 0, kLowerC, kLowerA, kUpperA };

// What a register tile (rows [i0, i0 + mr) of a panel's columns [j0, j0 + w), in the k block [k0, k0 + kc))
// computes of a triangular product: columns [0, we) of the panel, k in [k0 + ks, k0 + ke); kfirst, the
// first k of the whole product that reaches these rows (C starts from zero in the block holding it).
// False when the tile has nothing to do. Both kernels (AVX-512, AVX2) tile this way.
struct TriTile {
  int we, ks, ke, kfirst;
};
inline bool tri_tile(Tri tri, int i0, int mr, int j0, int w, int k0, int kc, TriTile* t) {
  *t = TriTile{w, 0, kc, 0};
  if (tri == Tri::kLowerC) {
    t->we = i0 + mr - j0 < w ? i0 + mr - j0 : w;
    return t->we > 0;
  }
  if (tri == Tri::kLowerA) {
    t->ke = i0 + mr - k0 < kc ? i0 + mr - k0 : kc;
    return t->ke > 0;
  }
  if (tri == Tri::kUpperA) {
    t->kfirst = i0;
    t->ks = i0 - k0 > 0 ? i0 - k0 : 0;
    return t->ks < kc;
  }
  return true;
}

// The active level's own float32 GEMM with triangular skipping (gemm_avx512 at avx512 and up, gemm_avx2 at
// avx2), for the attention kernels; only where native_kernels_enabled(). Defined in gemm.cc.
using TriGemm = void (*)(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                         int ldb, bool accumulate, float* C, int ldc, Tri tri);
TriGemm native_tri_gemm();

// C[M,N] = (accumulate ? C : 0) + op(A) op(B), row-major, op(X) = X^T when trans_x; each element is one
// fused multiply-add chain over k in order. Only call at ISA level avx512 or higher.
void gemm_avx512(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                 bool accumulate, float* C, int ldc, Tri tri = Tri::kNone);

// The same product with op(B) packed once per call and shared by the tasks of a split GEMM (each 6-row
// tile then reads one contiguous 64-column panel instead of re-packing a transposed B or striding through
// B's rows). Layout: panel by panel; 64-column panel p holds op(B)(0..K, 64p..64p+64) as [K][64] floats
// from float 64 p K, columns past N zero. gemm_avx512_pack_b writes panels [p0, p1) of a buffer of
// gemm_avx512_packed_b_floats(N, K) floats (64-byte aligned); gemm_avx512_packed computes
// C[M, 0..N) (+)= op(A) op(B)(:, j0..j0+N), j0 a multiple of 64. Same numerics as gemm_avx512.
size_t gemm_avx512_packed_b_floats(int N, int K);
void gemm_avx512_pack_b(bool trans_b, int N, int K, const float* B, int ldb, float* packed, int p0, int p1);
void gemm_avx512_packed(bool trans_a, int M, int N, int K, const float* A, int lda, const float* packed, int j0,
                        bool accumulate, float* C, int ldc);

// bfloat16 products: C = (accumulate ? C : 0) + bf16(op(A)) bf16(op(B)), operands rounded to bfloat16
// (round-to-nearest-even), products summed in float32. gemm_amx_bf16 runs on the AMX tile unit (level amx;
// denormals flushed); only call at that level. At level avx512bf16 the dpbf16_* functions below run on
// vdpbf16ps (each instruction adds two products per lane, pairs along k).
void gemm_amx_bf16(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                   bool accumulate, float* C, int ldc);

// The vdpbf16ps product with both operands packed once per call and shared by the tasks of a split GEMM
// (the weights of a Linear layer are converted once per product, not once per task; each 6-row tile reads
// one contiguous 128-pair x 64-column panel of B, resident in L1). Layouts, K padded to kp pairs (a
// multiple of 16, zeros past K), mp = M rounded up to 16:
//   A untransposed: [M][2 kp] bfloat16, row i = bf16(op(A)(i, 0..K));
//   A transposed (stored K x M): [kp][mp] 32-bit pair words (bf16 A(i, 2q), bf16 A(i, 2q + 1)), which
//      interleaves two stored rows instead of transposing; dpbf16_pack_a writes rows (columns) [i0, i1),
//      i0 a multiple of 16;
//   B: pairs in blocks of 128; the block starting at pair p0 (pc pairs) holds, for each 64-column panel p,
//      [pc][64] 32-bit words (bf16 op(B)(2q, j), bf16 op(B)(2q + 1, j)) from word p0 * np + 64 p * pc,
//      np = N rounded up to 64, columns past N zero; dpbf16_pack_b writes panels [p0, p1).
// dpbf16_packed computes C[M, 0..N) (+)= op(A) rows [0, M) times op(B)(:, j0..j0+N), j0 a multiple of 64;
// a points at this call's row 0 (untransposed: row i0 of the packed A; transposed: word i0 of pair row 0,
// ma = mp). Each C element is a float32 chain over the pairs in order, whatever the tiling. Only call at level avx512bf16 or higher.
int dpbf16_pairs(int K);
size_t dpbf16_packed_a_halves(int M, int K);
size_t dpbf16_packed_b_words(int N, int K);
void dpbf16_pack_a(bool trans_a, int M, int K, const float* A, int lda, uint16_t* packed, int i0, int i1);
void dpbf16_pack_b(bool trans_b, int N, int K, const float* B, int ldb, uint32_t* packed, int p0, int p1);
void dpbf16_packed(bool trans_a, int M, int N, int K, const uint16_t* a, int ma, const uint32_t* b, int np, int j0,
                   bool accumulate, float* C, int ldc);

// One core's issue rate of vdpbf16ps and of vfmadd231ps on zmm registers, in GFLOP/s (2 flops per product;
// 24 independent accumulators, so throughput rather than latency): the best of several runs of about 20 us
// each, after a warm-up that lets the core settle at its AVX-512 clock. 0 where the CPU lacks the
// instruction. Blocks the calling thread for about half a millisecond.
double probe_dpbf16_gflops();
double probe_fma_gflops();

}  // namespace trident::kernels::cpu::detail
