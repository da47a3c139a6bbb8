// A 2-D convolution's geometry in the 3-D form the kernels' planners take (leading extents 1),
// for the plan tests that run without a GPU (test_*_plan.cpp).
#pragma once

#include <cstdint>

#include "backends/common/conv_geometry.h"

namespace fusebox::cuda::testing {

// N x C x H x W, K filters R x R, one stride for both dims, leading and trailing pads.
inline ConvGeometry conv2d_geometry(int64_t n, int64_t c, int64_t k, int64_t h, int64_t w,
                                    int64_t r, int64_t stride, int64_t pad_lo, int64_t pad_hi) {
  ConvGeometry g;
  g.spatial_rank = 2;
  g.batch = n, g.in_channels = c, g.out_channels = k;
  const int64_t extents[3] = {1, h, w};
  for (int d = 1; d < 3; ++d) {
    g.in[d] = extents[d], g.filter[d] = r, g.stride[d] = stride;
    g.pad_lo[d] = pad_lo, g.pad_hi[d] = pad_hi;
    g.out[d] = conv_output_extent(extents[d], r, stride, 1, pad_lo, pad_hi);
  }
  return g;
}

}  // namespace fusebox::cuda::testing
