// The halo weight gradient's planning without a GPU (kernels/conv/engines/halo_wgrad/plan.h): what
// it refuses and why, row segments and their padded width, the split into runs of rows.
// test_implicit_gemm.cpp (HaloWgradMatchesCpu) runs the kernel on an H100/H200.
#include <gtest/gtest.h>

#include "backends/cuda/kernels/conv/engines/halo_wgrad/plan.h"
#include "conv_geometry_2d.h"

namespace fusebox::cuda::testing {
namespace {

// A 2-D problem (3-D form, leading extents 1): N x C x H x W, K filters R x R.
ConvGeometry geometry(int64_t n, int64_t c, int64_t k, int64_t h, int64_t w, int64_t r,
                      int64_t stride, int64_t pad) {
  return conv2d_geometry(n, c, k, h, w, r, stride, pad, pad);
}

std::string refusal(const ConvGeometry& g, DType dtype = DType::bf16, int cc = 90,
                    bool aligned = true) {
  return halo_wgrad::cannot_implement(g, dtype, cc, aligned).value_or("");
}

TEST(HaloWgradPlan, TakesResNet3x3LayersAndSaysWhyItRefusesOthers) {
  for (int64_t c : {64, 128, 256, 512})
    for (DType dtype : {DType::bf16, DType::f16})
      EXPECT_EQ(refusal(geometry(64, c, c, 56 * 64 / c, 56 * 64 / c, 3, 1, 1), dtype), "");
  const ConvGeometry g = geometry(64, 64, 64, 56, 56, 3, 1, 1);
  EXPECT_NE(refusal(g, DType::bf16, 80).find("compute capability 8.0"), std::string::npos);
  EXPECT_NE(refusal(g, DType::f32).find("not f32"), std::string::npos);
  EXPECT_NE(refusal(g, DType::bf16, 90, false).find("16-byte aligned"), std::string::npos);
  ConvGeometry grouped = g;
  grouped.groups = 2;
  EXPECT_NE(refusal(grouped).find("no groups"), std::string::npos);
  EXPECT_NE(refusal(geometry(64, 64, 64, 56, 56, 3, 2, 1)).find("stride 1"), std::string::npos);
  EXPECT_NE(refusal(geometry(64, 64, 64, 56, 56, 5, 1, 2)).find("3x3"), std::string::npos);
  EXPECT_NE(refusal(geometry(64, 64, 64, 56, 56, 3, 1, 0)).find("pads 1"), std::string::npos);
  ConvGeometry dilated = g;
  dilated.dilation[2] = 2;
  EXPECT_NE(refusal(dilated).find("dilation 1"), std::string::npos);
  EXPECT_NE(refusal(geometry(8, 3, 64, 56, 56, 3, 1, 1)).find("C 3, K 64"), std::string::npos);
  EXPECT_NE(refusal(geometry(8, 64, 96, 56, 56, 3, 1, 1)).find("multiples of 64"),
            std::string::npos);
  ConvGeometry volumetric = g;
  volumetric.spatial_rank = 3;
  volumetric.in[0] = volumetric.out[0] = volumetric.filter[0] = 3;
  EXPECT_NE(refusal(volumetric).find("2-D"), std::string::npos);
  EXPECT_NE(refusal(geometry(4096, 512, 512, 64, 64, 3, 1, 1)).find("2^31"), std::string::npos);
}

TEST(HaloWgradPlan, SegmentsPadRowsToWgmmaStepsAndSplitsFillTheDevice) {
  // ResNet-50's layer 1: one row of 64 padded pixels, one channel block, a run per SM.
  halo_wgrad::Plan p =
      halo_wgrad::make_plan(geometry(64, 64, 64, 56, 56, 3, 1, 1), DType::bf16, 132);
  EXPECT_EQ(p.segments, 1);
  EXPECT_EQ(p.segment_width, 56);
  EXPECT_EQ(p.row_pixels, 64);
  EXPECT_EQ(p.k_blocks * p.c_blocks, 1);
  EXPECT_EQ(p.rows, 64 * 56);
  EXPECT_EQ(p.splits, 132);
  EXPECT_EQ(p.partial_bytes, size_t(132) * 64 * 9 * 64 * sizeof(float));
  EXPECT_EQ(p.describe(), "halo wgrad 3x3 bf16 sm90, rows of 64 px, 132 splits");
  // Layer 2: 28 columns padded to 32; four channel blocks share the SMs.
  p = halo_wgrad::make_plan(geometry(64, 128, 128, 28, 28, 3, 1, 1), DType::f16, 132);
  EXPECT_EQ(p.row_pixels, 32);
  EXPECT_EQ(p.k_blocks * p.c_blocks, 4);
  EXPECT_EQ(p.splits, 33);
  // Rows wider than 64 pixels: equal segments (112 -> 2 x 56, 70 -> 2 x 35 padded to 48).
  p = halo_wgrad::make_plan(geometry(2, 64, 64, 112, 112, 3, 1, 1), DType::bf16, 132);
  EXPECT_EQ(p.segments, 2);
  EXPECT_EQ(p.segment_width, 56);
  EXPECT_EQ(p.rows, 2 * 112 * 2);
  p = halo_wgrad::make_plan(geometry(3, 128, 64, 9, 70, 3, 1, 1), DType::bf16, 132);
  EXPECT_EQ(p.segments, 2);
  EXPECT_EQ(p.segment_width, 35);
  EXPECT_EQ(p.row_pixels, 48);
  EXPECT_EQ(p.splits, 27);  // 54 rows: at least two a run
  EXPECT_NE(p.describe().find("(2 segments)"), std::string::npos);
  // More channel blocks than SMs: one run a block. A one-row problem: one run.
  p = halo_wgrad::make_plan(geometry(64, 1024, 1024, 7, 7, 3, 1, 1), DType::bf16, 132);
  EXPECT_EQ(p.k_blocks * p.c_blocks, 256);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.row_pixels, 16);
  p = halo_wgrad::make_plan(geometry(1, 64, 64, 1, 5, 3, 1, 1), DType::bf16, 132);
  EXPECT_EQ(p.splits, 1);
}

TEST(HaloWgradPlan, HeuristicPrefersItForOneFilterBlock) {
  EXPECT_TRUE(halo_wgrad::preferred(geometry(64, 64, 64, 56, 56, 3, 1, 1)));
  EXPECT_TRUE(halo_wgrad::preferred(geometry(8, 256, 64, 20, 20, 3, 1, 1)));
  EXPECT_FALSE(halo_wgrad::preferred(geometry(64, 128, 128, 28, 28, 3, 1, 1)));
  EXPECT_FALSE(halo_wgrad::preferred(geometry(64, 64, 128, 56, 56, 3, 1, 1)));
}

}  // namespace
}  // namespace fusebox::cuda::testing
