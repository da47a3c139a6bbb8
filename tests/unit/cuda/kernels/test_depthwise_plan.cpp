// The depthwise kernels' planning without a GPU (kernels/conv/engines/depthwise/plan.h): what
// they refuse and why, which loop takes a shape (rows kernels, ring kernels, the generic
// ones). test_depthwise.cpp runs the kernels against the CPU.
#include <gtest/gtest.h>

#include "backends/cuda/kernels/conv/engines/depthwise/plan.h"
#include "conv_geometry_2d.h"

namespace fusebox::cuda::testing {
namespace {

// A 2-D depthwise problem: N x C x H x W, C filters R x R.
ConvGeometry depthwise_geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t r,
                                int64_t stride) {
  ConvGeometry g = conv2d_geometry(n, c, c, h, w, r, stride, r / 2, r / 2);
  g.groups = c;
  return g;
}

std::string refusal(ConvOp op, const ConvGeometry& g, DType dtype = DType::bf16) {
  return depthwise::cannot_implement(op, g, dtype).value_or("");
}

TEST(DepthwisePlan, TakesDepthwiseProblemsAndSaysWhyItRefusesOthers) {
  const ConvGeometry g = depthwise_geometry(8, 96, 56, 56, 3, 1);
  for (ConvOp op : {ConvOp::fprop, ConvOp::dgrad, ConvOp::wgrad})
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) EXPECT_EQ(refusal(op, g, dtype), "");
  EXPECT_NE(refusal(ConvOp::fprop, g, DType::f64).find("dtype f64"), std::string::npos);
  ConvGeometry dense = g;
  dense.groups = 1;
  EXPECT_NE(refusal(ConvOp::fprop, dense).find("not depthwise"), std::string::npos);
  ConvGeometry multiplier = g;  // K = 2 C: a channel multiplier, not depthwise
  multiplier.out_channels = 2 * g.in_channels;
  EXPECT_NE(refusal(ConvOp::fprop, multiplier).find("not depthwise"), std::string::npos);
  // 16-byte channel vectors: 8 channels of 16 bits, 4 of f32.
  const ConvGeometry c12 = depthwise_geometry(8, 12, 56, 56, 3, 1);
  EXPECT_NE(refusal(ConvOp::fprop, c12).find("C = 12 not a multiple of 8"), std::string::npos);
  EXPECT_EQ(refusal(ConvOp::fprop, c12, DType::f32), "");
  EXPECT_EQ(depthwise::vector_width(DType::bf16), 8);
  EXPECT_EQ(depthwise::vector_width(DType::f32), 4);
  // A weight gradient keeps one accumulator vector per tap of a filter row.
  const ConvGeometry wide = depthwise_geometry(2, 16, 40, 40, 9, 1);
  EXPECT_NE(refusal(ConvOp::wgrad, wide).find("filter width 9 > 8"), std::string::npos);
  EXPECT_EQ(refusal(ConvOp::fprop, wide), "");
  // 32-bit indices: tensors under 2^31 elements.
  const ConvGeometry huge = depthwise_geometry(256, 1024, 128, 128, 3, 1);
  EXPECT_NE(refusal(ConvOp::fprop, huge).find("2^31"), std::string::npos);
}

TEST(DepthwisePlan, RowsKernelsTakeNarrowFiltersAtStrideOneOrTwo) {
  using Shape = std::pair<int, int>;
  for (int64_t r : {3, 5, 7})
    for (int64_t s : {1, 2}) {
      const ConvGeometry g = depthwise_geometry(2, 32, 30, 30, r, s);
      EXPECT_EQ(depthwise::rows_kernel_shape(g, ConvOp::fprop), Shape(int(r), int(s)));
      EXPECT_EQ(depthwise::rows_kernel_shape(g, ConvOp::wgrad), Shape(int(r), int(s)));
      // A strided dgrad skips taps per phase: the generic kernel.
      EXPECT_EQ(depthwise::rows_kernel_shape(g, ConvOp::dgrad),
                s == 1 ? Shape(int(r), 1) : Shape(0, 0));
    }
  EXPECT_EQ(depthwise::rows_kernel_shape(depthwise_geometry(2, 32, 30, 30, 4, 1), ConvOp::fprop),
            Shape(0, 0));
  EXPECT_EQ(depthwise::rows_kernel_shape(depthwise_geometry(2, 32, 30, 30, 3, 3), ConvOp::fprop),
            Shape(0, 0));
  ConvGeometry dilated = depthwise_geometry(2, 32, 30, 30, 3, 1);
  dilated.dilation[2] = 2;
  EXPECT_EQ(depthwise::rows_kernel_shape(dilated, ConvOp::fprop), Shape(0, 0));
}

TEST(DepthwisePlan, RingKernelsTakeTwoDimensionalRowsOfSevenOrMore) {
  const int v = depthwise::vector_width(DType::bf16);
  auto ring = [&](const ConvGeometry& g, ConvOp op) {
    return depthwise::ring_shape(g, op, depthwise::rows_kernel_shape(g, op), v);
  };
  const ConvGeometry g = depthwise_geometry(8, 96, 56, 56, 3, 1);  // 12 vectors: 4 divides
  EXPECT_TRUE(ring(g, ConvOp::fprop));
  EXPECT_TRUE(ring(g, ConvOp::dgrad));
  EXPECT_TRUE(ring(g, ConvOp::wgrad));
  // C / V not a multiple of 4 (C = 40: 5 vectors): the rows kernels.
  EXPECT_FALSE(ring(depthwise_geometry(8, 40, 56, 56, 3, 1), ConvOp::fprop));
  // Rows of fewer than 7 outputs: the rows kernels.
  EXPECT_FALSE(ring(depthwise_geometry(8, 96, 5, 5, 3, 1), ConvOp::fprop));
  // Strided: wgrad on the ring, fprop on the rows kernels.
  const ConvGeometry strided = depthwise_geometry(8, 96, 56, 56, 3, 2);
  EXPECT_TRUE(ring(strided, ConvOp::wgrad));
  EXPECT_FALSE(ring(strided, ConvOp::fprop));
  // An empty batch stays on the rows kernel (no block to launch).
  EXPECT_FALSE(ring(depthwise_geometry(0, 96, 56, 56, 3, 1), ConvOp::wgrad));
  // 3-D problems (dim 0 used) never take the ring.
  ConvGeometry volume = g;
  volume.spatial_rank = 3;
  volume.in[0] = volume.out[0] = 4, volume.filter[0] = 3, volume.pad_lo[0] = 1;
  EXPECT_FALSE(ring(volume, ConvOp::fprop));
}

}  // namespace
}  // namespace fusebox::cuda::testing
