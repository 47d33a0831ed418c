// AVX-512 helpers shared by the CPU kernels that transpose blocks in registers (the GEMMs' packing of a
// transposed operand, the bfloat16 flash attention's packing of K). Include only where <immintrin.h> and
// GCC's target attributes are available (the files that include it check); callers are compiled for
// AVX-512 by their own target attributes, into which this always-inline helper inlines.
#pragma once

#include <immintrin.h>

namespace trident::kernels::cpu::detail {

// In-register 16 x 16 transpose of 32-bit elements: rows r[0..15] in, r[c] = column c out.
__attribute__((target("avx512f"), always_inline)) inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m512 u[16];  // u[4g + m], 128-bit lane L: column 4L + m of rows 4g..4g+3
  for (int g = 0; g < 4; ++g) {
    const __m512d a0 = _mm512_castps_pd(t[4 * g]), a1 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d a2 = _mm512_castps_pd(t[4 * g + 2]), a3 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  for (int m = 0; m < 4; ++m) {
    const __m512 x0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88), y0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xdd);
    const __m512 x1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88),
                 y1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xdd);
    r[0 + m] = _mm512_shuffle_f32x4(x0, x1, 0x88);   // lane 0 columns
    r[8 + m] = _mm512_shuffle_f32x4(x0, x1, 0xdd);   // lane 2
    r[4 + m] = _mm512_shuffle_f32x4(y0, y1, 0x88);   // lane 1
    r[12 + m] = _mm512_shuffle_f32x4(y0, y1, 0xdd);  // lane 3
  }
}

}  // namespace trident::kernels::cpu::detail
