// Direct-call forms of the pool backward passes (tests and benchmarks call them); the IR
// ops in kernels.h (max_pool_backward, avg_pool_backward) share their code.
// Tensors are contiguous; attributes are normalised as infer_and_normalize leaves them.
#pragma once

#include "backends/cuda/kernels.h"

namespace fusebox::cuda {

// max_pool backward: dy and indices [N, C, O...] (indices i64 into the flattened x, as
// max_pool's second output) -> dx [N, C, D...]: each dx element is the sum of the dy
// elements whose index names it (0 when none). `attrs` are the forward's.
void max_pool_backward(Context& ctx, const PoolAttrs& attrs, const DeviceTensor& dy,
                       const DeviceTensor& indices, DeviceTensor& dx);

// avg_pool backward: dy [N, C, O...] -> dx [N, C, D...]: each dx element is the sum over
// the windows that contain it of dy / that window's divisor (the forward's divisor).
void avg_pool_backward(Context& ctx, const PoolAttrs& attrs, const DeviceTensor& dy,
                       DeviceTensor& dx);

}  // namespace fusebox::cuda
