// The patch weight gradient's planning without a GPU (kernels/conv/engines/patch_wgrad/plan.h):
// what it refuses and why, the row widths, the split into runs of output rows.
// test_implicit_gemm.cpp (PatchWgradMatchesCpu) runs the kernel on an H100/H200.
#include <gtest/gtest.h>

#include "backends/cuda/kernels/conv/engines/patch_wgrad/plan.h"
#include "conv_geometry_2d.h"

namespace fusebox::cuda::testing {
namespace {

// N x C x H x W, K filters R x R, one stride and pad for both dims.
ConvGeometry geometry(int64_t n, int64_t c, int64_t k, int64_t hw, int64_t r, int64_t stride,
                      int64_t pad) {
  return conv2d_geometry(n, c, k, hw, hw, r, stride, pad, pad);
}

std::string refusal(const ConvGeometry& g, DType dtype = DType::bf16, int cc = 90,
                    bool aligned = true) {
  return patch_wgrad::cannot_implement(g, dtype, cc, aligned).value_or("");
}

TEST(PatchWgradPlan, TakesRgbStemsAndSaysWhyItRefusesOthers) {
  const ConvGeometry stem = geometry(64, 3, 64, 224, 7, 2, 3);
  EXPECT_EQ(refusal(stem), "");
  EXPECT_EQ(refusal(stem, DType::f16), "");
  EXPECT_EQ(refusal(geometry(8, 1, 128, 100, 7, 1, 3)), "");
  EXPECT_NE(refusal(stem, DType::bf16, 89).find("compute capability 8.9"), std::string::npos);
  EXPECT_NE(refusal(stem, DType::f32).find("not f32"), std::string::npos);
  EXPECT_NE(refusal(stem, DType::bf16, 90, false).find("16-byte aligned"), std::string::npos);
  EXPECT_NE(refusal(geometry(64, 8, 64, 224, 7, 2, 3)).find("at most 4 channels, not 8"),
            std::string::npos);
  EXPECT_NE(refusal(geometry(64, 3, 32, 224, 7, 2, 3)).find("(K 32)"), std::string::npos);
  EXPECT_NE(refusal(geometry(64, 3, 64, 224, 3, 2, 1)).find("7x7"), std::string::npos);
  EXPECT_NE(refusal(geometry(4, 3, 64, 300, 7, 2, 3)).find("not 150"), std::string::npos);
  EXPECT_NE(refusal(geometry(4, 3, 64, 380, 7, 3, 3)).find("(OW 127, stride 3)"),
            std::string::npos);
  ConvGeometry grouped = stem;
  grouped.groups = 3;
  EXPECT_NE(refusal(grouped).find("no groups"), std::string::npos);
}

TEST(PatchWgradPlan, RowsAndSplits) {
  // ResNet-50's stem: output rows of 112 pixels, x rows of 229 from column -3.
  patch_wgrad::Plan p = patch_wgrad::make_plan(geometry(64, 3, 64, 224, 7, 2, 3), DType::bf16, 132);
  EXPECT_EQ(p.row_pixels, 112);
  EXPECT_EQ(p.x_row_pixels, 229);
  EXPECT_EQ(p.k_blocks, 1);
  EXPECT_EQ(p.rows, 64 * 112);
  EXPECT_EQ(p.splits, 132);
  EXPECT_EQ(p.partial_bytes, size_t(132) * 64 * 49 * 3 * sizeof(float));
  EXPECT_EQ(p.describe(), "patch wgrad 7x7 bf16 sm90, rows of 112 px, 132 splits");
  p = patch_wgrad::make_plan(geometry(1, 1, 128, 10, 7, 1, 3), DType::f16, 132);
  EXPECT_EQ(p.row_pixels, 16);
  EXPECT_EQ(p.k_blocks, 2);
  EXPECT_EQ(p.splits, 5);  // 10 rows: at least two a run
}

}  // namespace
}  // namespace fusebox::cuda::testing
