// The direct-call form of the batch_norm backward pass (tests and benchmarks call it); the
// IR op in kernels.h (batch_norm_backward) shares its code.
// Tensors are contiguous; attributes are normalised as infer_and_normalize leaves them.
#pragma once

#include "backends/cuda/kernels.h"

namespace fusebox::cuda {

// batch_norm in training mode (batch statistics), backward. x, dy [N, C, D...];
// scale, saved_mean, saved_inv_std [C] (the forward's input 1 and outputs 3 and 4; x's
// dtype, or all f32 for f16 / bf16 x). With x_hat = (x - mean) * inv_std and M = N * prod(D):
//   dbias  = sum(dy),  dscale = sum(dy * x_hat)    (per channel)
//   dx     = scale * inv_std * (dy - dbias / M - x_hat * dscale / M)
// dx like x; dscale and dbias [C] in x's dtype or f32. Any of the three may be null.
void batch_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                         const DeviceTensor& scale, const DeviceTensor& saved_mean,
                         const DeviceTensor& saved_inv_std, DeviceTensor* dx, DeviceTensor* dscale,
                         DeviceTensor* dbias);

}  // namespace fusebox::cuda
