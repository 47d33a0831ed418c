// Verifiable inputs for `trident bench comm --check` (nccl-tests' verifiable/ in spirit): every rank fills
// its inputs from a seeded function of (rank, element index, iteration) with small integers, so that every
// reduction is exact in any order and in every dtype, and computes the expected output of each collective
// on its own, from the same function, without communicating.
//
// Ownership: plain functions over caller-owned buffers (pointer, count, dtype). Blocking: pure CPU work.
// Thread-safety: stateless, safe from any thread. Timeouts: none.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trident/comm/types.h"

namespace trident::bench {

// The value of element k of rank r's input at iteration `iter`, as a double (exactly representable in
// `dtype`). `redop` picks the range: data movement and sum/avg/min/max use small signed integers (uint8:
// 0..250), prod uses {1, 2, -1} so that products of any number of ranks stay exact powers of two in size.
// `reduces` says whether the collective combines values (it narrows the range so sums stay exact).
double input_value(int rank, size_t k, int iter, DType dtype, ReduceOp redop, bool reduces);

// buf[i] = input_value(rank, k0 + i, iter, ...) for i in [0, count).
void fill_input(void* buf, size_t count, DType dtype, int rank, size_t k0, int iter, ReduceOp redop, bool reduces);

// Overwrites buf[0, count) with a value no input ever takes (NaN for floating types), so elements a
// collective failed to write are counted wrong.
void poison(void* buf, size_t count, DType dtype);

// The expected element k of a reduction over `world` ranks' inputs (element k of each), as the backend
// computes it in `dtype` (avg: true division for floating types, truncation for integers).
double reduced_value(int world, size_t k, int iter, DType dtype, ReduceOp redop);

// Number of i in [0, count) where buf[i] differs from input_value(src_rank(i), src_k(i), iter, ...) —
// the element of some rank's input the collective should have delivered there.
template <typename SrcRank, typename SrcK>
size_t count_wrong_moved(const void* buf, size_t count, DType dtype, int iter, ReduceOp redop, bool reduces,
                         SrcRank src_rank, SrcK src_k);
// Number of i in [0, count) where buf[i] differs from reduced_value(world, k0 + i, iter, ...).
size_t count_wrong_reduced(const void* buf, size_t count, DType dtype, int world, size_t k0, int iter, ReduceOp redop);

// Element i of buf as a double (bfloat16/float16 widened exactly).
double load_value(const void* buf, size_t i, DType dtype);
// Rounds v to what `dtype` stores (identity for values already exact in it).
double round_to(double v, DType dtype);

template <typename SrcRank, typename SrcK>
size_t count_wrong_moved(const void* buf, size_t count, DType dtype, int iter, ReduceOp redop, bool reduces,
                         SrcRank src_rank, SrcK src_k) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double want = input_value(src_rank(i), src_k(i), iter, dtype, redop, reduces);
    const double got = load_value(buf, i, dtype);
    if (!(got == want)) ++wrong;
  }
  return wrong;
}

}  // namespace trident::bench
