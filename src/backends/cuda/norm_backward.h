// Direct-call forms of the batch_norm and pool backward passes (tests and benchmarks call
// them); the IR ops in kernels.h (batch_norm_backward, max_pool_backward, ...) share their
// code. The layer_norm / rms_norm backward passes are declared in kernels.h.
// Tensors are contiguous; attributes are normalised as infer_and_normalize leaves them.
#pragma once

#include "backends/cuda/kernels.h"

namespace fusebox::cuda {

// batch_norm in training mode (batch statistics), backward. x, dy [N, C, D...];
// scale, saved_mean, saved_inv_std [C] (the forward's input 1 and outputs 3 and 4, x's
// dtype). With x_hat = (x - mean) * inv_std and M = N * prod(D):
//   dbias  = sum(dy),  dscale = sum(dy * x_hat)    (per channel)
//   dx     = scale * inv_std * (dy - dbias / M - x_hat * dscale / M)
// dx like x; dscale and dbias [C] in x's dtype or f32. Any of the three may be null.
void batch_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                         const DeviceTensor& scale, const DeviceTensor& saved_mean,
                         const DeviceTensor& saved_inv_std, DeviceTensor* dx, DeviceTensor* dscale,
                         DeviceTensor* dbias);

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
