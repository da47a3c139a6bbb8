// Internals shared by the layer_norm / rms_norm forward files: norm.cu (the register and
// long-row paths, the planner, the launch) and norm_forward_staged.cu (the staged path).
// Include from .cu files only.
#pragma once

#include <cstdint>

#include "backends/cuda/norm_rows.cuh"

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

// The staged path's layout for aligned rows of `cols` elements (cols % W == 0), or
// plan.fast == false when none fits (norm_forward_staged.cu; f32, f16 and bf16).
template <class T, bool kCentre>
RowPlan plan_forward_staged(int64_t rows, int64_t cols, const DeviceProperties& props,
                            ForwardKernel<T>* kernel);

}  // namespace fusebox::cuda::norm
