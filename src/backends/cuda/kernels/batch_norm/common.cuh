// What the two layouts of batch_norm share (kernels/batch_norm/batch_norm.cu: the entry points, the
// contiguous kernels and the per-channel stages; kernels/batch_norm/channels_last.cu: the
// channels-last kernels). Include from .cu files only.
//
// Every pass has three stages whatever the layout: 1. per-chunk partial statistics of each
// channel (Welford triples forward, sums of dy and dy * x_hat backward) into a
// [channels][chunks] buffer; 2. one per-channel kernel (kernels/batch_norm/batch_norm.cu) merges a
// channel's chunks in a fixed order and writes the statistics outputs and the coefficients of
// 3. the elementwise pass (y, or dx). Only stages 1 and 3 depend on the layout.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"

namespace fusebox::cuda::bn {

constexpr int kThreads = 256;  // threads per block of the stage 1 and 3 kernels (at most)

// Welford triple.
template <class C>
struct Moments {
  C count;
  C mean;
  C m2;  // sum of squared deviations from mean
};

// Chan et al.'s merge of two triples (a's order first: merge is not commutative in
// floating point, so callers fix the order).
template <class C>
__device__ __forceinline__ Moments<C> merge(const Moments<C>& a, const Moments<C>& b) {
  const C count = a.count + b.count;
  if (count == C(0)) return a;
  const C delta = b.mean - a.mean;
  const C wb = b.count / count;
  return {count, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.count * wb};
}

// Per-channel coefficients of the elementwise passes.
//   forward:  y  = (x - mean) * k + bias                     k = scale * inv_std
//   backward: dx = k * (dy - mean_dy - x_hat * mean_dyx)     x_hat = (x - mean) * inv_std
template <class C>
struct Coefficients {
  C mean;
  C k;
  C bias;  // forward only
  C inv_std;
  C mean_dy;   // backward: dbias / M (0 for the inference form)
  C mean_dyx;  // backward: dscale / M (0 for the inference form)
};

// Stage 1's output: `buffer` holds, per channel c and chunk j, at c * chunks + j, a
// Moments<C> (forward) or two C sums, dy then dy * x_hat (backward, at 2 (c * chunks + j)).
struct Partials {
  DeviceBuffer buffer;
  int64_t chunks = 0;
};

// ---- channels-last stages 1 and 3 (kernels/batch_norm/channels_last.cu) ------------------------
// x, y, dy, dx: dense channels-last [N, C, D...] (rank >= 3), at least one element per
// channel; T a device float type (double, float, __half, __nv_bfloat16); P the device type of
// the per-channel tensors (T, or float for __half / __nv_bfloat16 T: mixed precision).
// Buffers are allocated as the encoder's temporaries.

template <class T>
Partials channels_last_stats(Context& ctx, const DeviceTensor& x);
template <class T>
void channels_last_apply(Context& ctx, const DeviceTensor& x, const DeviceTensor& y,
                         const DeviceBuffer& coef);
template <class T, class P>
Partials channels_last_backward_sums(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                                     const DeviceTensor& saved_mean,
                                     const DeviceTensor& saved_inv_std);
template <class T>
void channels_last_backward_dx(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                               const DeviceTensor& dx, const DeviceBuffer& coef);

}  // namespace fusebox::cuda::bn
