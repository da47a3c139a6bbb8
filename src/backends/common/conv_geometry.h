// The geometry of a convolution, shared by the CPU reference (cpu/conv_problem.h) and the
// CUDA backend (the direct kernels, kernels/conv/direct.cu, and the cuDNN problem,
// kernels/conv/problem.h): one rank-agnostic description of the forward, backward-data
// and backward-filter ops (CUTLASS style), built and checked once.
//
// x [N, C, D...], w [K, C/g, R...], y [N, K, O...] (for the backward ops dx, w / dw and
// dy), and along each spatial dim
//   O = floor((D + pad_lo + pad_hi - dilation * (R - 1) - 1) / stride) + 1;
// tap r of output position o reads input position o * stride - pad_lo + r * dilation
// (zero outside [0, D)). 1-D and 2-D problems are stored as 3-D ones with leading
// spatial extents of 1 (filter 1, stride 1, dilation 1, pads 0), so one code path serves
// all ranks; spatial_rank says how many dims the node has.
#pragma once

#include <cstdint>
#include <string>

#include "backends/common/index_math.h"
#include "fusebox/core/shape.h"
#include "fusebox/ir/ops.h"

namespace fusebox {

// O for input extent D, filter extent R and the window attributes (see above).
FUSEBOX_HOST_DEVICE constexpr int64_t conv_output_extent(int64_t in, int64_t filter, int64_t stride,
                                                         int64_t dilation, int64_t pad_lo,
                                                         int64_t pad_hi) {
  return floor_div(in + pad_lo + pad_hi - dilation * (filter - 1) - 1, stride) + 1;
}

// Plain arrays, not std::array: CUDA kernels take it by value and index it on the device.
struct ConvGeometry {
  int spatial_rank = 3;           // the node's spatial dims (1 to 3)
  int64_t batch = 0;              // N
  int64_t in_channels = 0;        // C
  int64_t out_channels = 0;       // K
  int64_t groups = 1;             // g
  int64_t in[3] = {1, 1, 1};      // D: x / dx spatial extents
  int64_t out[3] = {1, 1, 1};     // O: y / dy spatial extents
  int64_t filter[3] = {1, 1, 1};  // R: w / dw spatial extents
  int64_t stride[3] = {1, 1, 1};
  int64_t dilation[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0};
  // The node's high pads. The CPU and direct kernels never read them (taps past D read
  // zero, and O says where the last window ends); the cuDNN problem is built with them.
  int64_t pad_hi[3] = {0, 0, 0};

  FUSEBOX_HOST_DEVICE int64_t in_size() const { return in[0] * in[1] * in[2]; }
  FUSEBOX_HOST_DEVICE int64_t out_size() const { return out[0] * out[1] * out[2]; }
  FUSEBOX_HOST_DEVICE int64_t filter_size() const { return filter[0] * filter[1] * filter[2]; }
  FUSEBOX_HOST_DEVICE int64_t in_per_group() const { return in_channels / groups; }    // C/g
  FUSEBOX_HOST_DEVICE int64_t out_per_group() const { return out_channels / groups; }  // K/g
};

// Builds the geometry from the x, w and y shapes (see above) and the node's normalised
// attributes, checking that they agree with each other (O is what a convolution of D
// gives); a mismatch is an Error naming `where` (the node) and what disagrees. Shape
// inference has checked all this; the kernels check again because they index memory by it.
ConvGeometry make_conv_geometry(const ConvAttrs& attrs, const Shape& x, const Shape& w,
                                const Shape& y, const std::string& where);

}  // namespace fusebox
