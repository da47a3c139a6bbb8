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
// activations (kRelu, kMask; the unfused kernels are the ones they were): stage 3 of the
// forward stores relu(y), and the backward's stages 1 and 3 mask dy as they load it
// (load_dy), by relu's gradient at y: y read beside dy (MaskFrom::y), or recomputed from the x
// they read anyway (MaskFrom::x: the forward's affine map with the saved statistics, scale and
// bias, the very coefficients stage 3 used, so the same y; a third fewer bytes read). Both
// compute exactly what the unfused relu and unary_backward kernels (kernels/pointwise/) would,
// so the fused path gives the unfused path's bits.
//
// The backward's dy may come in two terms (batch_norm_backward's dy_addend: autodiff's sum of
// a block output's two gradient contributions, passes/fusion.h fold_gradient_sums): load_dy
// adds them as the add kernel would (rounded to T) before the mask. Stage 1 may write the dy
// it used (batch_norm_backward's output 3, the gradient a fused residual gets): stage 3 then
// reads that instead of the terms and y again.
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
// k is scale times inv_std as the statistics output stores it (P), in f64, rounded to C: the
// backward computes the same k from the saved statistics.
template <class C>
struct Coefficients {
  C mean;
  C k;
  C bias;  // forward; backward with MaskFrom::x
  C inv_std;
  C mean_dy;   // backward: dbias / M (0 for the inference form)
  C mean_dyx;  // backward: dscale / M (0 for the inference form)
};

// k = scale * inv_std (Coefficients), from the per-channel inputs as stored.
template <class C, class P>
__host__ __device__ __forceinline__ C scaled_inv_std(P scale, P inv_std) {
  return C(convert<double>(scale) * convert<double>(inv_std));
}

// Stage 3's affine map before any residual or relu: one definition, so that the backward's
// mask recomputed from x (MaskFrom::x) sees the forward's values bit for bit.
template <class C>
__device__ __forceinline__ C affine(C x, C mean, C k, C bias) {
  return (x - mean) * k + bias;
}

// Where the backward's relu mask comes from (none: no fused relu).
enum class MaskFrom { none, y, x };

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

// relu's gradient at the y stage 3 stored for x (relu of the affine map rounded to T: y > 0
// exactly where that rounding is > 0).
template <class T>
__device__ __forceinline__ compute_t<T> relu_gradient_at_x(compute_t<T> dy, compute_t<T> x,
                                                           compute_t<T> mean, compute_t<T> k,
                                                           compute_t<T> bias) {
  using C = compute_t<T>;
  return relu_gradient<T>(dy, convert<C>(convert<T>(affine(x, mean, k, bias))));
}

// dy + addend as the add kernel stores it: the sum in compute_t<T>, rounded to T.
template <class T>
__device__ __forceinline__ compute_t<T> add_terms(compute_t<T> dy, compute_t<T> addend) {
  using C = compute_t<T>;
  return convert<C>(convert<T>(dy + addend));
}

// Element i of dy as the backward uses it: plus addend's when given, masked as kMask says (y
// is null unless MaskFrom::y; x, mean, k, bias are used with MaskFrom::x only).
template <MaskFrom kMask, class T>
__device__ __forceinline__ compute_t<T> load_dy(const T* dy, const T* addend, const T* y, int64_t i,
                                                compute_t<T> x, compute_t<T> mean, compute_t<T> k,
                                                compute_t<T> bias) {
  compute_t<T> g = load_compute(dy, i);
  if (addend) g = add_terms<T>(g, load_compute(addend, i));
  if constexpr (kMask == MaskFrom::y)
    return relu_gradient<T>(g, load_compute(y, i));
  else if constexpr (kMask == MaskFrom::x)
    return relu_gradient_at_x<T>(g, x, mean, k, bias);
  else
    return g;
}

// Calls f(std::bool_constant<flag>{}): a kernel's compile-time switch (the forward's kRelu,
// the channels-last backward's kAddend).
template <class F>
void with_flag(bool flag, F&& f) {
  if (flag)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// The backward's relu mask (run_batch_norm_backward picks it): from y (the forward's output),
// or from x where the forward's bias is given and the per-channel inputs give the forward's
// coefficients exactly (P the compute type: the saved statistics are what stage 3 used).
struct ReluMask {
  MaskFrom from = MaskFrom::none;
  const DeviceTensor* y = nullptr;      // MaskFrom::y only
  const DeviceTensor* scale = nullptr;  // MaskFrom::x only
  const DeviceTensor* bias = nullptr;   // MaskFrom::x only

  // The kernels' pointers: null where `from` does not read the tensor.
  template <class T>
  const T* y_data() const {
    return y ? y->as<const T>() : nullptr;
  }
  template <class P>
  const P* scale_data() const {
    return scale ? scale->as<const P>() : nullptr;
  }
  template <class P>
  const P* bias_data() const {
    return bias ? bias->as<const P>() : nullptr;
  }
};

// Calls f(std::integral_constant<MaskFrom, from>{}), picking the backward kernels' kMask.
template <class F>
void with_mask(MaskFrom from, F&& f) {
  switch (from) {
    case MaskFrom::none:
      return f(std::integral_constant<MaskFrom, MaskFrom::none>{});
    case MaskFrom::y:
      return f(std::integral_constant<MaskFrom, MaskFrom::y>{});
    case MaskFrom::x:
      return f(std::integral_constant<MaskFrom, MaskFrom::x>{});
  }
}

// Stage 1's output: `buffer` holds, per channel c and chunk j, at c * chunks + j, a
// Moments<C> (forward) or two C sums, dy then dy * x_hat (backward, at 2 (c * chunks + j)).
struct Partials {
  BufferRange buffer;  // a temporary of the node (its arena gap, or the encoder's overflow)
  int64_t chunks = 0;
};

// The backward's dy: one tensor or two terms, and where stage 1 writes the dy it used (null:
// nowhere). Stage 3 reads `used` when stage 1 wrote it.
struct DyTerms {
  const DeviceTensor* dy = nullptr;
  const DeviceTensor* addend = nullptr;
  const DeviceTensor* used = nullptr;

  template <class T>
  const T* addend_data() const {
    return addend ? addend->as<const T>() : nullptr;
  }
  template <class T>
  T* used_data() const {
    return used ? used->as<T>() : nullptr;
  }
};

// ---- channels-last stages 1 and 3 (kernels/batch_norm/channels_last.cu) ------------------------
// x, y, dy, dx: dense channels-last [N, C, D...] (rank >= 3), at least one element per
// channel; T a device float type (double, float, __half, __nv_bfloat16); P the device type of
// the per-channel tensors (T, or float for __half / __nv_bfloat16 T: mixed precision).
// mask: a fused relu's (ReluMask; its y null: no relu). dy: DyTerms (stage 3 takes its dy and
// addend; the caller passes `used` as dy once stage 1 wrote it).
// Buffers are allocated as the encoder's temporaries.

template <class T>
Partials channels_last_stats(Context& ctx, const DeviceTensor& x);
template <class T>
void channels_last_apply(Context& ctx, const DeviceTensor& x, const DeviceTensor& y,
                         const BufferRange& coef, bool relu, const DeviceTensor* residual);
template <class T, class P>
Partials channels_last_backward_sums(Context& ctx, const DeviceTensor& x, const DyTerms& dy,
                                     const ReluMask& mask, const DeviceTensor& saved_mean,
                                     const DeviceTensor& saved_inv_std);
// coef: with MaskFrom::x, bias holds the forward's (bn_backward_finalize).
template <class T>
void channels_last_backward_dx(Context& ctx, const DeviceTensor& x, const DyTerms& dy,
                               const ReluMask& mask, const DeviceTensor& dx,
                               const BufferRange& coef);

}  // namespace fusebox::cuda::bn
