// The CUTLASS Hopper convolutions' planning without a GPU (kernels/conv/engines/cutlass/plan.h):
// what they refuse and why, how our epilogue maps onto theirs, the tile choice and the weight
// gradient's batch chunks. test_implicit_gemm.cpp runs the kernels on an H100.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "backends/cuda/kernels/conv/engines/cutlass/plan.h"
#include "conv_geometry_2d.h"

namespace fusebox::cuda::testing {
namespace {

using cutlass_conv::Epilogue;
using cutlass_conv::Facts;
using cutlass_conv::Tile;

// A 2-D problem (3-D form, leading extents 1): N x C x H x W, K filters R x R.
ConvGeometry geometry(int64_t n, int64_t c, int64_t k, int64_t hw, int64_t r, int64_t stride,
                      int64_t pad) {
  return conv2d_geometry(n, c, k, hw, hw, r, stride, pad, pad);
}

const Facts kH100{90, true};

TEST(CutlassConvPlan, TakesResNetShapesAndSaysWhyItRefusesOthers) {
  const ConvGeometry g = geometry(64, 64, 64, 56, 3, 1, 1);
  for (ConvOp op : {ConvOp::fprop, ConvOp::dgrad, ConvOp::wgrad}) {
    EXPECT_FALSE(cutlass_conv::cannot_implement(op, g, DType::bf16, kH100));
    EXPECT_FALSE(cutlass_conv::cannot_implement(op, g, DType::f16, kH100));
  }
  auto refusal = [&](ConvOp op, const ConvGeometry& geo, DType dtype, Facts facts) {
    return cutlass_conv::cannot_implement(op, geo, dtype, facts).value_or("");
  };
  EXPECT_NE(refusal(ConvOp::fprop, g, DType::bf16, {80, true}).find("compute capability 8.0"),
            std::string::npos);
  EXPECT_NE(refusal(ConvOp::fprop, g, DType::f32, kH100).find("dtype f32"), std::string::npos);
  EXPECT_NE(refusal(ConvOp::fprop, g, DType::bf16, {90, false}).find("16 bytes"),
            std::string::npos);
  ConvGeometry grouped = g;
  grouped.groups = 2;
  EXPECT_NE(refusal(ConvOp::fprop, grouped, DType::bf16, kH100).find("2 groups"),
            std::string::npos);
  const ConvGeometry stem = geometry(64, 3, 64, 224, 7, 2, 3);
  EXPECT_NE(refusal(ConvOp::fprop, stem, DType::bf16, kH100).find("C=3"), std::string::npos);
  const ConvGeometry strided = geometry(64, 128, 128, 56, 3, 2, 1);
  EXPECT_FALSE(cutlass_conv::cannot_implement(ConvOp::fprop, strided, DType::bf16, kH100));
  EXPECT_FALSE(cutlass_conv::cannot_implement(ConvOp::wgrad, strided, DType::bf16, kH100));
  EXPECT_FALSE(cutlass_conv::cannot_implement(ConvOp::dgrad, strided, DType::bf16, kH100));
  const ConvGeometry wide_pad = geometry(2, 64, 64, 40, 3, 1, 17);
  EXPECT_NE(refusal(ConvOp::fprop, wide_pad, DType::bf16, kH100).find("padding"),
            std::string::npos);
  ConvGeometry dilated = geometry(2, 64, 64, 80, 3, 1, 1);
  dilated.dilation[2] = 16;  // reach (3 - 1) * 16 = 32
  EXPECT_NE(refusal(ConvOp::fprop, dilated, DType::bf16, kH100).find("reach"), std::string::npos);
}

TEST(CutlassConvPlan, EpilogueMapsOntoOneClampAfterBiasAndResidual) {
  const ActivationFn none{}, relu{ActivationFn::relu}, gelu{ActivationFn::gelu};
  const ActivationFn clip{ActivationFn::clip, 0.0, 6.0};
  Epilogue e;
  ASSERT_FALSE(cutlass_conv::map_epilogue(true, relu, false, none, &e));
  EXPECT_TRUE(e.bias);
  EXPECT_FALSE(e.residual);
  EXPECT_EQ(e.lower, 0.0f);
  EXPECT_EQ(e.upper, std::numeric_limits<float>::max());
  ASSERT_FALSE(cutlass_conv::map_epilogue(false, clip, false, none, &e));
  EXPECT_EQ(e.lower, 0.0f);
  EXPECT_EQ(e.upper, 6.0f);
  // ResNet's block end: relu(conv + bias + residual).
  ASSERT_FALSE(cutlass_conv::map_epilogue(true, none, true, relu, &e));
  EXPECT_TRUE(e.residual);
  EXPECT_EQ(e.lower, 0.0f);
  EXPECT_FALSE(e.plain());
  ASSERT_FALSE(cutlass_conv::map_epilogue(false, none, false, none, &e));
  EXPECT_EQ(e.lower, std::numeric_limits<float>::lowest());
  // Nothing to add or clamp: the plain instances (no source, no bias) run it.
  EXPECT_TRUE(e.plain());
  ASSERT_FALSE(cutlass_conv::map_epilogue(false, relu, false, none, &e));
  EXPECT_FALSE(e.plain());
  ASSERT_FALSE(cutlass_conv::map_epilogue(true, none, false, none, &e));
  EXPECT_FALSE(e.plain());
  ASSERT_FALSE(cutlass_conv::map_epilogue(false, none, true, none, &e));
  EXPECT_FALSE(e.plain());
  // An activation before the residual add, or one that is not a clamp: not CUTLASS's.
  EXPECT_TRUE(cutlass_conv::map_epilogue(true, relu, true, none, &e));
  EXPECT_TRUE(cutlass_conv::map_epilogue(true, gelu, false, none, &e));
}

TEST(CutlassConvPlan, TilesAndWgradChunks) {
  // K = 64 outputs: the 128x64 tile wastes nothing of N.
  const ConvGeometry narrow = geometry(64, 64, 64, 56, 3, 1, 1);
  EXPECT_EQ(cutlass_conv::make_plan(ConvOp::fprop, narrow, DType::bf16, {}, 132).tile,
            Tile::t128x64);
  const ConvGeometry wide = geometry(64, 512, 512, 28, 3, 1, 1);
  EXPECT_EQ(cutlass_conv::make_plan(ConvOp::fprop, wide, DType::bf16, {}, 132).tile,
            Tile::t128x128);
  // A forced tile the op has; one it has not is ignored.
  EXPECT_EQ(cutlass_conv::make_plan(ConvOp::fprop, wide, DType::bf16, {}, 132, Tile::t128x64).tile,
            Tile::t128x64);
  EXPECT_EQ(cutlass_conv::make_plan(ConvOp::fprop, wide, DType::bf16, {}, 132, Tile::t64x128).tile,
            Tile::t128x128);
  // wgrad of the 64-channel 3x3 layer: five 64x128 tiles, so the batch is cut into chunks of
  // 10 images for about a quarter wave, every chunk's sums in f32.
  const ConvGeometry l1 = geometry(64, 64, 64, 56, 3, 1, 1);
  const cutlass_conv::Plan w = cutlass_conv::make_plan(ConvOp::wgrad, l1, DType::bf16, {}, 132);
  EXPECT_FALSE(w.gemm);
  EXPECT_EQ(w.tile, Tile::t64x128);
  EXPECT_EQ(w.chunk_images, 10);
  EXPECT_EQ(w.chunks, 7);
  EXPECT_EQ(w.partial_bytes, size_t(7) * 64 * 64 * 9 * sizeof(float));
  EXPECT_NE(w.describe().find("7 chunks"), std::string::npos) << w.describe();
  // Layer 3's 256-channel 3x3: 36 tiles of 128x128, past a quarter wave: one chunk.
  const cutlass_conv::Plan l3 = cutlass_conv::make_plan(
      ConvOp::wgrad, geometry(64, 256, 256, 14, 3, 1, 1), DType::bf16, {}, 132);
  EXPECT_EQ(l3.tile, Tile::t128x128);
  EXPECT_EQ(l3.chunks, 1);
  // Chunks always cover the batch, the last possibly short.
  for (int64_t n : {1, 3, 7, 50, 64, 129}) {
    const cutlass_conv::Plan p = cutlass_conv::make_plan(
        ConvOp::wgrad, geometry(n, 256, 512, 7, 3, 1, 1), DType::f16, {}, 132);
    EXPECT_GE(p.chunks * p.chunk_images, n);
    EXPECT_LT((p.chunks - 1) * p.chunk_images, n);
  }
}

TEST(CutlassConvPlan, PointwiseWgradIsABatchedGemmOverPixelChunks) {
  // The 64x64 1x1 layer at 56x56: one output tile, so 200704 pixels are cut into a quarter
  // wave (33) of chunks of whole K steps (6144 pixels, the last 4096).
  const ConvGeometry small = geometry(64, 64, 64, 56, 1, 1, 0);
  const cutlass_conv::Plan p = cutlass_conv::make_plan(ConvOp::wgrad, small, DType::bf16, {}, 132);
  EXPECT_TRUE(p.gemm);
  EXPECT_EQ(p.tile, Tile::t64x128);
  EXPECT_EQ(p.chunk_rows, 6144);
  EXPECT_EQ(p.chunks, 33);
  EXPECT_EQ(p.partial_bytes, size_t(33) * 64 * 64 * sizeof(float));
  EXPECT_NE(p.describe().find("gemm, 33 chunks"), std::string::npos) << p.describe();
  // Layer 2's 512 -> 128 at 28x28 (50176 pixels): 4 tiles of 128x128 in 9 chunks of 5632
  // pixels, about a quarter of the SMs.
  const cutlass_conv::Plan l2 = cutlass_conv::make_plan(
      ConvOp::wgrad, geometry(64, 512, 128, 28, 1, 1, 0), DType::bf16, {}, 132);
  EXPECT_TRUE(l2.gemm);
  EXPECT_EQ(l2.tile, Tile::t128x128);
  EXPECT_EQ(l2.chunks, 9);
  EXPECT_EQ(l2.chunk_rows, 5632);
  // 64 filters (128 -> 64 at 56x56): the narrow tile, two of them, 17 chunks.
  const cutlass_conv::Plan l1 = cutlass_conv::make_plan(
      ConvOp::wgrad, geometry(64, 256, 64, 56, 1, 1, 0), DType::bf16, {}, 132);
  EXPECT_EQ(l1.tile, Tile::t64x128);
  EXPECT_EQ(l1.chunks, 17);
  // Enough 128x128 tiles for every SM (2048 x 2048: 256) keep that tile.
  EXPECT_EQ(cutlass_conv::make_plan(ConvOp::wgrad, geometry(64, 2048, 2048, 28, 1, 1, 0),
                                    DType::bf16, {}, 132)
                .tile,
            Tile::t128x128);
  // Few pixels and few output tiles (layer 3's 1024 -> 256, 12544 pixels: 32 of 64x128):
  // the conv kernel's whole-image chunks, 16 tiles of 128x128 over a quarter wave: 3 chunks
  // of 22 images (a 3x3 wgrad takes a whole wave, above).
  const cutlass_conv::Plan l3 = cutlass_conv::make_plan(
      ConvOp::wgrad, geometry(64, 1024, 256, 14, 1, 1, 0), DType::bf16, {}, 132);
  EXPECT_FALSE(l3.gemm);
  EXPECT_EQ(l3.tile, Tile::t128x128);
  EXPECT_EQ(l3.chunk_images, 22);
  EXPECT_EQ(l3.chunks, 3);
  EXPECT_EQ(l3.partial_bytes, size_t(3) * 1024 * 256 * sizeof(float));
  // Few pixels but output tiles for every SM (layer 4's 2048 -> 512 at 7x7: 64 of 128x128,
  // 128 of 64x128): one unsplit GEMM writing dw, no f32 slices.
  const cutlass_conv::Plan l4 = cutlass_conv::make_plan(
      ConvOp::wgrad, geometry(64, 2048, 512, 7, 1, 1, 0), DType::bf16, {}, 132);
  EXPECT_TRUE(l4.gemm);
  EXPECT_EQ(l4.tile, Tile::t64x128);
  EXPECT_EQ(l4.chunks, 1);
  EXPECT_EQ(l4.chunk_rows, 64 * 7 * 7);
  EXPECT_EQ(l4.partial_bytes, 0u);
  EXPECT_NE(l4.describe().find("gemm, dw written directly"), std::string::npos) << l4.describe();
  // 2048 x 1024: 128 tiles of 128x128 already; a forced tile is kept where it fills the GPU,
  // and where it does not, the chunked plans run it.
  const ConvGeometry wide = geometry(64, 1024, 2048, 7, 1, 1, 0);
  EXPECT_EQ(cutlass_conv::direct_wgrad_tile(wide, 132), Tile::t128x128);
  EXPECT_EQ(cutlass_conv::direct_wgrad_tile(wide, 132, Tile::t64x128), Tile::t64x128);
  EXPECT_EQ(
      cutlass_conv::direct_wgrad_tile(geometry(64, 2048, 512, 7, 1, 1, 0), 132, Tile::t128x128),
      std::nullopt);
  // The narrow tile where the wide one's 128 would leave a quarter of 200 SMs idle; neither
  // on 400 SMs (256 of 64x128).
  EXPECT_EQ(cutlass_conv::direct_wgrad_tile(wide, 200), Tile::t64x128);
  EXPECT_EQ(cutlass_conv::direct_wgrad_tile(wide, 400), std::nullopt);
  EXPECT_EQ(cutlass_conv::direct_wgrad_tile(geometry(64, 1024, 2048, 14, 1, 2, 0), 132),
            std::nullopt);  // not pointwise (the caller gathers x first)
  // Chunks are whole K steps and cover the pixels, the last possibly short.
  for (const auto [n, hw] :
       {std::pair<int64_t, int64_t>{64, 57}, {11, 57}, {64, 23}, {3, 105}, {1, 200}, {1, 1000}}) {
    const ConvGeometry g = geometry(n, 24, 40, hw, 1, 1, 0);
    const cutlass_conv::Plan q = cutlass_conv::make_plan(ConvOp::wgrad, g, DType::f16, {}, 132);
    const int64_t rows = n * hw * hw;
    EXPECT_TRUE(q.gemm);
    EXPECT_EQ(q.chunk_rows % 64, 0);
    EXPECT_GE(q.chunks * q.chunk_rows, rows);
    EXPECT_LT((q.chunks - 1) * q.chunk_rows, rows);
    EXPECT_EQ(q.partial_bytes, size_t(q.chunks) * 40 * 24 * sizeof(float));
  }
}

// The stride phases reproduce a strided dgrad exactly: 1-D problems (in the last dim, one
// channel) computed directly and as unit-stride dgrads of each phase's sub-filter, the way
// CUTLASS's dgrad reads them (dx[j] = sum over t of dy[j + pad' - t dil'] w'[t], dy outside
// [0, O) zero), on random strides, filters, dilations and pads.
TEST(CutlassConvPlan, DgradPhasesReproduceStridedDgrad) {
  std::mt19937 rng(12);
  int checked = 0;
  for (int i = 0; i < 400; ++i) {
    ConvGeometry g;
    g.batch = 1, g.in_channels = 8, g.out_channels = 8;
    g.stride[2] = 2 + int64_t(rng() % 3);
    g.filter[2] = 1 + int64_t(rng() % 5);
    g.dilation[2] = 1 + int64_t(rng() % 2);
    g.pad_lo[2] = int64_t(rng() % 4), g.pad_hi[2] = int64_t(rng() % 4);
    g.in[2] = 5 + int64_t(rng() % 20);
    g.out[2] = conv_output_extent(g.in[2], g.filter[2], g.stride[2], g.dilation[2], g.pad_lo[2],
                                  g.pad_hi[2]);
    if (g.out[2] <= 0) continue;
    std::vector<cutlass_conv::DgradPhase> phases;
    if (cutlass_conv::dgrad_phases(g, &phases)) continue;  // a refusal: not CUTLASS's then
    ASSERT_EQ(int64_t(phases.size()), g.stride[2]);
    std::vector<double> dy(size_t(g.out[2])), w(size_t(g.filter[2]));
    for (double& v : dy) v = double(rng() % 17) - 8;
    for (double& v : w) v = double(rng() % 13) - 6;
    std::vector<double> want(size_t(g.in[2]), 0.0), got(size_t(g.in[2]), -999.0);
    for (int64_t o = 0; o < g.out[2]; ++o)
      for (int64_t r = 0; r < g.filter[2]; ++r) {
        const int64_t d = o * g.stride[2] - g.pad_lo[2] + r * g.dilation[2];
        if (d >= 0 && d < g.in[2]) want[size_t(d)] += dy[size_t(o)] * w[size_t(r)];
      }
    for (const cutlass_conv::DgradPhase& p : phases) {
      const ConvGeometry q = cutlass_conv::phase_geometry(g, p);
      for (int64_t j = 0; j < p.extent[2]; ++j) {
        double sum = 0;
        for (int64_t t = 0; !p.empty() && t < p.taps[2]; ++t) {
          const int64_t o = j + q.pad_lo[2] - t * q.dilation[2];
          if (o >= 0 && o < g.out[2])
            sum += dy[size_t(o)] * w[size_t(p.first_tap[2] + t * p.step[2])];
        }
        got[size_t(p.phase[2] + g.stride[2] * j)] = sum;
      }
      if (!p.empty()) {
        // The unit-stride problem reads exactly dy's extent.
        EXPECT_EQ(
            conv_output_extent(q.in[2], q.filter[2], 1, q.dilation[2], q.pad_lo[2], q.pad_hi[2]),
            g.out[2]);
      }
    }
    EXPECT_EQ(got, want) << "stride " << g.stride[2] << " filter " << g.filter[2] << " dilation "
                         << g.dilation[2] << " pads " << g.pad_lo[2] << "/" << g.pad_hi[2] << " in "
                         << g.in[2];
    ++checked;
  }
  EXPECT_GT(checked, 200);
  // ResNet's 3x3 stride-2 layer: four phases of 1, 2, 2 and 4 taps; its 1x1 stride-2 layer:
  // one phase with the tap, three empty (dx cleared first).
  const ConvGeometry g3 = geometry(64, 128, 128, 56, 3, 2, 1);
  EXPECT_FALSE(cutlass_conv::cannot_implement(ConvOp::dgrad, g3, DType::bf16, kH100));
  const cutlass_conv::Plan p3 = cutlass_conv::make_plan(ConvOp::dgrad, g3, DType::bf16, {}, 132);
  ASSERT_EQ(p3.phases.size(), 4u);
  EXPECT_FALSE(p3.zero_fill);
  EXPECT_EQ(p3.phases[0].taps[1] * p3.phases[0].taps[2], 1);
  EXPECT_EQ(p3.phases[3].taps[1] * p3.phases[3].taps[2], 4);
  EXPECT_NE(p3.describe().find("4 phases"), std::string::npos) << p3.describe();
  const ConvGeometry g1 = geometry(64, 256, 512, 56, 1, 2, 0);
  const cutlass_conv::Plan p1 = cutlass_conv::make_plan(ConvOp::dgrad, g1, DType::bf16, {}, 132);
  EXPECT_TRUE(p1.zero_fill);
  int empty = 0;
  for (const cutlass_conv::DgradPhase& p : p1.phases) empty += p.empty();
  EXPECT_EQ(empty, 3);
}

}  // namespace
}  // namespace fusebox::cuda::testing
