// Internals shared by the layer_norm / rms_norm forward files: kernels/norm/forward.cu (the
// register and long-row paths, the planner, the launch) and kernels/norm/forward_staged.cu (the
// staged path). Include from .cu files only.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/norm/rows.cuh"

namespace fusebox::cuda::norm {

// The arguments of every forward kernel; S is the statistics' type (stats_t<T>).
template <class T, class S>
struct ForwardArgs {
  const T* x;
  const T* scale;  // [cols] or null
  const T* bias;   // [cols] or null
  T* y;
  S* mean;  // [rows] or null
  S* rstd;  // [rows] or null
  int64_t rows;
  int64_t cols;
  S eps;
  int threads_per_row;  // register and staged paths only
};

template <class T>
using ForwardKernel = BoundKernel<void (*)(ForwardArgs<T, float>)>;

// Steps 2-4 of the register and staged paths (kernels/norm/forward.cu) for the row a group holds in
// registers (v: kVecs vectors per thread, thread t's vectors k * R + t; valid: those in
// the row, none when the row is past the end): mean = group sum / cols (layer_norm only);
// var = group sum of (x - mean)^2 / cols, rstd = rsqrt(var + eps); the group's thread 0
// stores the statistics; y = (x - mean) * rstd * scale + bias, 16-byte streaming stores.
// Every thread of the block calls (group_sum's barriers); `parity` alternates per sum.
template <class T, bool kCentre, int kVecs>
__device__ __forceinline__ void normalize_row(const ForwardArgs<T, float>& a,
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
  T* y = a.y + row * a.cols;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    if (!valid[k]) continue;
    const int i = k * R + t;
    Packed scale{}, bias{};
    if (a.scale) scale = load_packed_ro(a.scale, i);
    if (a.bias) bias = load_packed_ro(a.bias, i);
    float out[W];
#pragma unroll
    for (int w = 0; w < W; ++w) {
      float r = (unpack<T>(v[k], w) - mean) * rstd;
      if (a.scale) r *= unpack<T>(scale, w);
      if (a.bias) r += unpack<T>(bias, w);
      out[w] = r;
    }
    store_packed_stream(y, i, pack<T>(out));
  }
}

// The staged path's layout for aligned rows of `cols` elements (cols % W == 0), or
// plan.fast == false when none fits (kernels/norm/forward_staged.cu; f32, f16 and bf16).
template <class T, bool kCentre>
RowPlan plan_forward_staged(int64_t rows, int64_t cols, const DeviceProperties& props,
                            ForwardKernel<T>* kernel);

}  // namespace fusebox::cuda::norm
