// Element-wise reduction kernels for the collectives (`destination op= source`), torch-free.
#pragma once

#include <cstddef>

#include "collectives/types.h"

namespace shardwise::collectives {

// The type reductions run in: float32 for bfloat16/float16, otherwise the element type itself.
Datatype accumulation_type(Datatype dtype);

// destination[i] = destination[i] op source[i] for `count` elements of `dtype`, which must be its
// own accumulation type. MIN/MAX propagate NaN. AVG reduces as SUM (see finish_average).
void reduce_into(void* destination, const void* source, size_t count, Datatype dtype, ReduceOp op);

// destination[i] = a[i] op b[i]: reduce_into without first copying `a` into `destination`.
void reduce_from(
    void* destination, const void* a, const void* b, size_t count, Datatype dtype, ReduceOp op);

// Divides `count` elements by `divisor` (float types only): the last step of AVG.
void finish_average(void* data, size_t count, Datatype dtype, int divisor);

// Copies `count` elements of `dtype` at `source` into `destination` in its accumulation type
// (float32 for 16-bit floats, widened exactly), and back (rounded to nearest even, once).
void widen(const void* source, void* destination, size_t count, Datatype dtype);
void narrow(const void* source, void* destination, size_t count, Datatype dtype);

// Throws std::invalid_argument when `op` is undefined for `dtype` (AVG on integers or bool).
void check_reduce(Datatype dtype, ReduceOp op);

}  // namespace shardwise::collectives
