// Internals shared by the layer_norm / rms_norm forward files: kernels/norm/forward.cu (the
// register and long-row paths, the planner, the launch) and kernels/norm/forward_staged.cu (the
// staged path). Include from .cu files only.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/norm/rows.cuh"

namespace fusebox::cuda::norm {

// The arguments of every forward kernel; S is the statistics' type (stats_t<T>). x is T;
// scale and bias are P and y is Y: T too, except in the mixed form (a cast before or after
// the norm folded into it, passes/fusion.h: fold_norm_casts), where P is f32 and one of T, Y
// is f32 and the other f16 or bf16 (or both f16 / both bf16 with f32 parameters).
template <class T, class S, class P = T, class Y = T>
struct ForwardArgs {
  const T* x;
  const P* scale;  // [cols] or null
  const P* bias;   // [cols] or null
  Y* y;
  S* mean;  // [rows] or null
  S* rstd;  // [rows] or null
  int64_t rows;
  int64_t cols;
  S eps;
  int threads_per_row;  // register and staged paths only
};

template <class T, class P = T, class Y = T>
using ForwardKernel = BoundKernel<void (*)(ForwardArgs<T, float, P, Y>)>;

// Steps 2-4 of the register and staged paths (kernels/norm/forward.cu) for the row a group holds in
// registers (v: kVecs vectors per thread, thread t's vectors k * R + t; valid: those in
// the row, none when the row is past the end): mean = group sum / cols (layer_norm only);
// var = group sum of (x - mean)^2 / cols, rstd = rsqrt(var + eps); the group's thread 0
// stores the statistics; y = (x - mean) * rstd * scale + bias, 16-byte streaming stores.
// Every thread of the block calls (group_sum's barriers); `parity` alternates per sum.
template <class T, bool kCentre, int kVecs, class P, class Y>
__device__ __forceinline__ void normalize_row(const ForwardArgs<T, float, P, Y>& a,
                                              const Packed (&v)[kVecs], const bool (&valid)[kVecs],
                                              int64_t row, bool active, int R, int t,
                                              SumSlots<1>& slots, int& parity) {
  constexpr int W = kVecWidth<T>;
  const float inv_cols = 1.0f / float(a.cols);
  float mean = 0.0f;
  if constexpr (kCentre) {
    float sum[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!valid[k]) continue;
#pragma unroll
      for (int w = 0; w < W; ++w) sum[0] += unpack<T>(v[k], w);
    }
    group_sum(sum, slots, R, parity);
    parity ^= 1;
    mean = sum[0] * inv_cols;
  }
  float sq[1] = {0.0f};
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    if (!valid[k]) continue;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float d = unpack<T>(v[k], w) - mean;
      sq[0] += d * d;
    }
  }
  group_sum(sq, slots, R, parity);
  parity ^= 1;
  const float rstd = rsqrtf(sq[0] * inv_cols + a.eps);
  if (!active) return;
  if (t == 0) {
    if (a.mean) a.mean[row] = mean;
    if (a.rstd) a.rstd[row] = rstd;
  }
  Y* y = a.y + row * a.cols;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    if (!valid[k]) continue;
    const int i = k * R + t;
    float scale[W], bias[W];
    if (a.scale) load_elems_ro<P>(a.scale, i, scale);
    if (a.bias) load_elems_ro<P>(a.bias, i, bias);
    float out[W];
#pragma unroll
    for (int w = 0; w < W; ++w) {
      float r = (unpack<T>(v[k], w) - mean) * rstd;
      if (a.scale) r *= scale[w];
      if (a.bias) r += bias[w];
      out[w] = r;
    }
    store_elems_stream<Y>(y, i, out);
  }
}

// The staged path's layout for aligned rows of `cols` elements (cols % W == 0), or
// plan.fast == false when none fits (kernels/norm/forward_staged.cu; f32, f16 and bf16).
template <class T, bool kCentre>
RowPlan plan_forward_staged(int64_t rows, int64_t cols, const DeviceProperties& props,
                            ForwardKernel<T>* kernel);

}  // namespace fusebox::cuda::norm
