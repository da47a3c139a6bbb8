// What the two layouts of batch_norm share (kernels/batch_norm/batch_norm.cu: the entry points, the
// contiguous kernels and the per-channel stages; kernels/batch_norm/channels_last.cu: the
// channels-last kernels). Include from .cu files only.
//
// Every pass has three stages whatever the layout: 1. per-chunk partial statistics of each
// channel (Welford triples forward, sums of dy and dy * x_hat backward) into a
// [channels][chunks] buffer; 2. one per-channel kernel (kernels/batch_norm/batch_norm.cu) merges a
// channel's chunks in a fixed order and writes the statistics outputs and the coefficients of
// 3. the elementwise pass (y, or dx). Only stages 1 and 3 depend on the layout.
//
// A fused relu (BatchNormAttrs::relu) is a template parameter of the kernels that touch
// activations (kRelu; the unfused kernels are the ones they were): stage 3 of the forward
// stores relu(y), and the backward's stages 1 and 3 read y beside dy and mask dy as they
// load it (load_dy). Both compute exactly what the unfused relu and unary_backward
// kernels (kernels/pointwise/) would, so the fused path gives the unfused path's bits.
#pragma once

#include <cstdint>
#include <type_traits>

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

// y as stage 3 stores it: with kRelu, relu (kernels/pointwise/unary.cu's v < 0 ? 0 : v) of
// y rounded to T, which is what the unfused relu reads: a value that rounds to -0 stays -0,
// NaN stays NaN.
// y plus a fused residual (batch_norm's input 5) as the unfused add computes it: y rounded
// to T, the sum in compute_t<T> (stage 3 rounds it when it stores it, or activate does).
template <class T>
__device__ __forceinline__ compute_t<T> add_residual(compute_t<T> y, compute_t<T> residual) {
  using C = compute_t<T>;
  return convert<C>(convert<T>(y)) + residual;
}

template <class T, bool kRelu>
__device__ __forceinline__ compute_t<T> activate(compute_t<T> v) {
  using C = compute_t<T>;
  if constexpr (!kRelu) {
    return v;
  } else {
    const C rounded = convert<C>(convert<T>(v));
    return rounded < C(0) ? C(0) : rounded;
  }
}

// relu's gradient at the forward's output y as kernels/pointwise/backward.cu's
// unary_backward stores it: dy * (y > 0 ? 1 : 0) rounded to T (so an infinite or NaN dy
// where y <= 0 gives NaN, as unfused).
template <class T>
__device__ __forceinline__ compute_t<T> relu_gradient(compute_t<T> dy, compute_t<T> y) {
  using C = compute_t<T>;
  return convert<C>(convert<T>(dy * (y > C(0) ? C(1) : C(0))));
}

// Element i of dy as the backward uses it: masked by relu's gradient at y with kRelu (y is
// null without).
template <bool kRelu, class T>
__device__ __forceinline__ compute_t<T> load_dy(const T* dy, const T* y, int64_t i) {
  if constexpr (kRelu)
    return relu_gradient<T>(load_compute(dy, i), load_compute(y, i));
  else
    return load_compute(dy, i);
}

// Calls f(std::bool_constant<relu>{}), picking the kernels' kRelu.
template <class F>
void with_relu(bool relu, F&& f) {
  if (relu)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// Stage 1's output: `buffer` holds, per channel c and chunk j, at c * chunks + j, a
// Moments<C> (forward) or two C sums, dy then dy * x_hat (backward, at 2 (c * chunks + j)).
struct Partials {
  BufferRange buffer;  // a temporary of the node (its arena gap, or the encoder's overflow)
  int64_t chunks = 0;
};

// ---- channels-last stages 1 and 3 (kernels/batch_norm/channels_last.cu) ------------------------
// x, y, dy, dx: dense channels-last [N, C, D...] (rank >= 3), at least one element per
// channel; T a device float type (double, float, __half, __nv_bfloat16); P the device type of
// the per-channel tensors (T, or float for __half / __nv_bfloat16 T: mixed precision).
// relu_y: the forward's output of a fused relu, which masks dy (null: no relu).
// Buffers are allocated as the encoder's temporaries.

template <class T>
Partials channels_last_stats(Context& ctx, const DeviceTensor& x);
template <class T>
void channels_last_apply(Context& ctx, const DeviceTensor& x, const DeviceTensor& y,
                         const BufferRange& coef, bool relu, const DeviceTensor* residual);
template <class T, class P>
Partials channels_last_backward_sums(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                                     const DeviceTensor* relu_y, const DeviceTensor& saved_mean,
                                     const DeviceTensor& saved_inv_std);
template <class T>
void channels_last_backward_dx(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                               const DeviceTensor* relu_y, const DeviceTensor& dx,
                               const BufferRange& coef);

}  // namespace fusebox::cuda::bn
