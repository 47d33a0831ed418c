// Elementwise reduction kernels used by every algorithm and transport. No allocation, no threads.
// bfloat16 and float16 are combined in float32 and rounded once per call (float32 accumulation).
// uint8 supports movement only: any arithmetic op on uint8 is an InvalidArgument (checked by the
// process group before a collective starts).
#pragma once

#include <cstddef>

#include "trident/comm/types.h"

namespace trident {

// dst[i] = dst[i] op src[i] for i < count. dst and src may not overlap partially (they may be equal).
// kAvg combines as kSum (the caller scales at the end).
void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
// dst[i] = a[i] op b[i] (out-of-place form; dst may equal a or b).
void reduce_into3(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);
// buf[i] /= divisor (floating dtypes; integers divide truncating toward zero).
void scale_divide(void* buf, size_t count, DType dtype, int divisor);
// Whether `op` is defined on `dtype` (uint8: none).
bool reduce_supported(DType dtype, ReduceOp op);

}  // namespace trident
