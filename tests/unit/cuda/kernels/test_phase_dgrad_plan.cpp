// The phase dgrad's planning without a GPU (kernels/conv/engines/phase_dgrad/plan.h): what it
// refuses and why, the lattice, its tiles and how the persistent CTAs share the channel blocks.
// test_implicit_gemm.cpp (PhaseDgradMatchesCpu) runs the kernel on an H100/H200.
#include <gtest/gtest.h>

#include "backends/cuda/kernels/conv/engines/phase_dgrad/plan.h"
#include "conv_geometry_2d.h"

namespace fusebox::cuda::testing {
namespace {

// A 2-D backward-data problem (3-D form, leading extents 1): dx N x C x H x W, K filters
// R x R, leading pads 1, trailing pads `pad_hi`.
ConvGeometry dgrad_geometry(int64_t n, int64_t c, int64_t k, int64_t h, int64_t w, int64_t r = 3,
                            int64_t stride = 2, int64_t pad_hi = 1) {
  return conv2d_geometry(n, c, k, h, w, r, stride, 1, pad_hi);
}

std::string refusal(const ConvGeometry& g, DType dtype = DType::bf16, int cc = 90,
                    bool aligned = true) {
  return phase_dgrad::cannot_implement(g, dtype, cc, aligned).value_or("");
}

TEST(PhaseDgradPlan, TakesResNetLayer2AndSaysWhyItRefusesOthers) {
  const ConvGeometry g = dgrad_geometry(64, 128, 128, 56, 56);
  for (DType dtype : {DType::bf16, DType::f16}) EXPECT_EQ(refusal(g, dtype), "");
  EXPECT_EQ(refusal(dgrad_geometry(2, 192, 64, 15, 13, 3, 2, 0)), "");
  EXPECT_NE(refusal(g, DType::bf16, 80).find("compute capability 8.0"), std::string::npos);
  EXPECT_NE(refusal(g, DType::f32).find("not f32"), std::string::npos);
  EXPECT_NE(refusal(g, DType::bf16, 90, false).find("16-byte aligned"), std::string::npos);
  ConvGeometry grouped = g;
  grouped.groups = 2;
  EXPECT_NE(refusal(grouped).find("no groups"), std::string::npos);
  EXPECT_NE(refusal(dgrad_geometry(8, 64, 64, 56, 56, 3, 1)).find("stride 2"), std::string::npos);
  EXPECT_NE(refusal(dgrad_geometry(8, 64, 64, 56, 56, 5)).find("3x3"), std::string::npos);
  ConvGeometry unpadded = g;
  unpadded.pad_lo[2] = 0;
  EXPECT_NE(refusal(unpadded).find("leading pads 1"), std::string::npos);
  ConvGeometry dilated = g;
  dilated.dilation[1] = 2;
  EXPECT_NE(refusal(dilated).find("dilation 1"), std::string::npos);
  EXPECT_NE(refusal(dgrad_geometry(8, 96, 64, 56, 56)).find("C 96, K 64"), std::string::npos);
  // Layers 3 and 4 (256, 512 filters): the filter block would not fit.
  EXPECT_NE(refusal(dgrad_geometry(64, 256, 256, 28, 28)).find("at most 128 filters"),
            std::string::npos);
  ConvGeometry volumetric = g;
  volumetric.spatial_rank = 3;
  volumetric.in[0] = volumetric.out[0] = volumetric.filter[0] = 3;
  EXPECT_NE(refusal(volumetric).find("2-D"), std::string::npos);
  EXPECT_NE(refusal(dgrad_geometry(4096, 128, 128, 128, 128)).find("2^31"), std::string::npos);
}

TEST(PhaseDgradPlan, TilesTheLatticeAndSharesTheSmsOverChannelBlocks) {
  // ResNet-50's layer 2: 64 x 28 x 28 lattice points, two channel blocks of 66 CTAs.
  phase_dgrad::Plan p =
      phase_dgrad::make_plan(dgrad_geometry(64, 128, 128, 56, 56), DType::bf16, 132);
  EXPECT_EQ(p.lattice_h, 28);
  EXPECT_EQ(p.lattice_w, 28);
  EXPECT_EQ(p.tiles, 392);
  EXPECT_EQ(p.c_blocks, 2);
  EXPECT_EQ(p.ctas, 132);
  EXPECT_EQ(p.describe(), "phase dgrad 3x3s2 bf16 sm90, 392 x 2 tiles on 132 CTAs");
  // Odd extents: the lattice rounds up (dx's last row has only phase a = 0).
  p = phase_dgrad::make_plan(dgrad_geometry(3, 192, 64, 15, 13), DType::f16, 132);
  EXPECT_EQ(p.lattice_h, 8);
  EXPECT_EQ(p.lattice_w, 7);
  EXPECT_EQ(p.tiles, 2);  // 168 points
  EXPECT_EQ(p.c_blocks, 3);
  EXPECT_EQ(p.ctas, 6);  // no more CTAs than tiles for each block
  // Fewer SMs than a multiple of the blocks: 132 / 3 = 44 CTAs a block.
  p = phase_dgrad::make_plan(dgrad_geometry(64, 192, 128, 56, 56), DType::bf16, 132);
  EXPECT_EQ(p.ctas, 132);
  p = phase_dgrad::make_plan(dgrad_geometry(64, 320, 128, 56, 56), DType::bf16, 132);
  EXPECT_EQ(p.ctas, 130);  // 5 blocks x 26
}

}  // namespace
}  // namespace fusebox::cuda::testing
