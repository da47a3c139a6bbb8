// Shape inference and normalisation for conv, its backward ops and the pools.
#include "infer_testing.h"

// Designated initialisers (ConvAttrs{.strides = ...}) leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

// ---- conv -------------------------------------------------------------------

TEST(InferConv, SamePadding2dAndNormalisedAttrs) {
  Inferred r = infer(OpKind::conv, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}},
                     {f32({1, 3, 32, 32}), f32({8, 3, 3, 3}), f32({8})});
  ASSERT_EQ(r.types.size(), 1u);
  EXPECT_EQ(r.out(), f32({1, 8, 32, 32}));
  const ConvAttrs& a = r.attrs<ConvAttrs>();
  EXPECT_EQ(a.strides, (Ints{1, 1}));
  EXPECT_EQ(a.dilations, (Ints{1, 1}));
  EXPECT_EQ(a.pads_begin, (Ints{1, 1}));
  EXPECT_EQ(a.pads_end, (Ints{1, 1}));
}

TEST(InferConv, MonostateMeansDefaults) {
  Inferred r = infer(OpKind::conv, {}, {f32({2, 3, 5, 5}), f32({4, 3, 3, 3})});
  EXPECT_EQ(r.out(), f32({2, 4, 3, 3}));
  const ConvAttrs& a = r.attrs<ConvAttrs>();
  EXPECT_EQ(a.strides, (Ints{1, 1}));
  EXPECT_EQ(a.pads_end, (Ints{0, 0}));
  EXPECT_EQ(a.groups, 1);
}

TEST(InferConv, OneDimStridedAsymmetricPads) {
  // O = floor((10 + 1 + 0 - 2 - 1) / 2) + 1 = 5
  Inferred r = infer(OpKind::conv, ConvAttrs{.strides = {2}, .pads_begin = {1}, .pads_end = {0}},
                     {f32({2, 4, 10}), f32({6, 4, 3})});
  EXPECT_EQ(r.out(), f32({2, 6, 5}));
  EXPECT_EQ(r.attrs<ConvAttrs>().dilations, (Ints{1}));
}

TEST(InferConv, ThreeDimMixedStrideDilationPads) {
  // d0: (8+0+1 - 2*2 - 1)/1 + 1 = 5; d1: (9+1+0 - 2 - 1)/2 + 1 = 4; d2: (10+2+2 - 2 - 1)/3 + 1 = 4
  ConvAttrs a{
      .strides = {1, 2, 3}, .dilations = {2, 1, 1}, .pads_begin = {0, 1, 2}, .pads_end = {1, 0, 2}};
  Inferred r = infer(OpKind::conv, a, {f32({1, 2, 8, 9, 10}), f32({4, 2, 3, 3, 3})});
  EXPECT_EQ(r.out(), f32({1, 4, 5, 4, 4}));
}

TEST(InferConv, OnnxStridesAndAsymmetricPadding) {
  // test_conv_with_strides_and_asymmetric_padding: ONNX pads [1, 0, 1, 0].
  ConvAttrs a{.strides = {2, 2}, .pads_begin = {1, 0}, .pads_end = {1, 0}};
  EXPECT_EQ(infer(OpKind::conv, a, {f32({1, 1, 7, 5}), f32({1, 1, 3, 3})}).out(),
            f32({1, 1, 4, 2}));
}

TEST(InferConv, AsymmetricPadsAndStridePerDim) {
  // d0: (5+0+2-3)/2 + 1 = 3; d1: (5+1+0-3)/1 + 1 = 4
  ConvAttrs a{.strides = {2, 1}, .pads_begin = {0, 1}, .pads_end = {2, 0}};
  EXPECT_EQ(infer(OpKind::conv, a, {f32({1, 1, 5, 5}), f32({1, 1, 3, 3})}).out(),
            f32({1, 1, 3, 4}));
}

TEST(InferConv, DilationPerDim) {
  // d0: 10 - 2*2 - 1 = 5 -> 6; d1: 10 - 3*2 - 1 = 3 -> 4
  EXPECT_EQ(
      infer(OpKind::conv, ConvAttrs{.dilations = {2, 3}}, {f32({1, 1, 10, 10}), f32({1, 1, 3, 3})})
          .out(),
      f32({1, 1, 6, 4}));
}

TEST(InferConv, GroupedAndDepthwise) {
  EXPECT_EQ(
      infer(OpKind::conv, ConvAttrs{.groups = 4}, {f32({2, 8, 7, 7}), f32({12, 2, 3, 3})}).out(),
      f32({2, 12, 5, 5}));
  ConvAttrs dw{.strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}, .groups = 16};
  EXPECT_EQ(infer(OpKind::conv, dw, {f32({1, 16, 10, 10}), f32({16, 1, 3, 3})}).out(),
            f32({1, 16, 5, 5}));
}

TEST(InferConv, KeepsHalfDtype) {
  TensorType x = typed(DType::f16, {1, 2, 4, 4}), w = typed(DType::f16, {3, 2, 1, 1});
  EXPECT_EQ(infer(OpKind::conv, {}, {x, w, typed(DType::f16, {3})}).out(),
            typed(DType::f16, {1, 3, 4, 4}));
}

TEST(InferConv, AbsentBiasIsFine) {
  EXPECT_EQ(infer(OpKind::conv, {}, {f32({1, 2, 4, 4}), f32({3, 2, 1, 1}), std::nullopt}).out(),
            f32({1, 3, 4, 4}));
}

TEST(InferConvErrors, ChannelMismatch) {
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 3, 8, 8}), f32({8, 4, 3, 3})},
                         {"x has 3 channels but w expects 4 (w [8, 4, 3, 3], groups 1)"}));
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.groups = 2},
                         {f32({1, 6, 8, 8}), f32({8, 2, 3, 3})},
                         {"x has 6 channels but w expects 4 (w [8, 2, 3, 3], groups 2)"}));
}

TEST(InferConvErrors, GroupsMustDivideBothChannelCounts) {
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.groups = 4},
                         {f32({1, 6, 8, 8}), f32({8, 2, 3, 3})},
                         {"x has 6 channels, which groups 4 does not divide", "[1, 6, 8, 8]"}));
  EXPECT_TRUE(fails_with(
      OpKind::conv, ConvAttrs{.groups = 3}, {f32({1, 6, 8, 8}), f32({8, 2, 3, 3})},
      {"w has 8 output channels (K), which groups 3 does not divide", "w [8, 2, 3, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.groups = 0},
                         {f32({1, 6, 8, 8}), f32({8, 6, 3, 3})}, {"groups 0 must be >= 1"}));
}

TEST(InferConvErrors, EmptyOutput) {
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 1, 2, 2}), f32({1, 1, 3, 3})},
                         {"x [1, 1, 2, 2]", "spatial dim 0 padded to 2 (2 + 0 + 0)",
                          "smaller than the dilated kernel 3", "output would be empty"}));
  // Dilation makes the kernel reach 5 > 4.
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.dilations = {1, 2}},
                         {f32({1, 1, 4, 4}), f32({1, 1, 3, 3})},
                         {"spatial dim 1", "dilated kernel 5 (kernel 3, dilation 2)"}));
  // An empty image: padding alone would make windows (PyTorch refuses it too); a batch of 0
  // is fine and gives an empty y.
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.pads_begin = {2, 2}, .pads_end = {2, 2}},
                         {f32({1, 1, 0, 4}), f32({1, 1, 3, 3})},
                         {"x [1, 1, 0, 4] has an empty spatial dim: no pixel to convolve"}));
  EXPECT_EQ(infer(OpKind::conv, {}, {f32({0, 1, 4, 4}), f32({2, 1, 3, 3})}).out(),
            f32({0, 2, 2, 2}));
}

TEST(InferConvErrors, BadStridesDilationsPads) {
  const std::vector<In> in = {f32({1, 1, 8, 8}), f32({1, 1, 3, 3})};
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.strides = {1, 0}}, in,
                         {"strides [1, 0] must all be >= 1"}));
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.strides = {-1, 1}}, in,
                         {"strides [-1, 1] must all be >= 1"}));
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.dilations = {0, 1}}, in,
                         {"dilations [0, 1] must all be >= 1"}));
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.pads_begin = {-1, 0}}, in,
                         {"pads_begin [-1, 0] must all be >= 0"}));
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.pads_end = {0, -2}}, in,
                         {"pads_end [0, -2] must all be >= 0"}));
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.pads_begin = {1}}, in,
                         {"pads_begin [1] has 1 values but there are 2 spatial dims"}));
  EXPECT_TRUE(fails_with(OpKind::conv, ConvAttrs{.strides = {1, 1, 1}}, in,
                         {"strides [1, 1, 1] has 3 values"}));
}

TEST(InferConvErrors, Ranks) {
  EXPECT_TRUE(
      fails_with(OpKind::conv, {}, {f32({1, 3, 8}), f32({8, 3, 3, 3})},
                 {"x [1, 3, 8] must be [N, C, D...] with 2 spatial dims", "w [8, 3, 3, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 3}), f32({8, 3})},
                         {"input 1 (w) must be [K, C/groups, R...]", "but is [8, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 3, 8, 8, 8, 8}), f32({8, 3, 3, 3, 3, 3})},
                         {"input 1 (w)", "1 to 3 spatial dims", "[8, 3, 3, 3, 3, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 3, 8, 8}), f32({8, 3, 0, 3})},
                         {"w [8, 3, 0, 3] has a zero extent"}));
}

TEST(InferConvErrors, BiasAndDtypes) {
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 3, 8, 8}), f32({8, 3, 3, 3}), f32({7})},
                         {"input 2 (bias) is [7] but must be [8]"}));
  EXPECT_TRUE(fails_with(OpKind::conv, {},
                         {f32({1, 3, 8, 8}), f32({8, 3, 3, 3}), typed(DType::f16, {8})},
                         {"input 2 (bias) is f16 but input 0 (x) is f32"}));
  EXPECT_TRUE(fails_with(OpKind::conv, {},
                         {typed(DType::i64, {1, 3, 8, 8}), typed(DType::i64, {8, 3, 3, 3})},
                         {"input 0 (x) is i64 but conv needs a floating-point dtype"}));
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 3, 8, 8}), typed(DType::bf16, {8, 3, 3, 3})},
                         {"input 1 (w) is bf16 but input 0 (x) is f32"}));
}

TEST(InferConvErrors, ArityAndAttrs) {
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 3, 8, 8})},
                         {"takes 2 to 4 inputs (x, w, bias?, residual?) but got 1"}));
  EXPECT_TRUE(fails_with(OpKind::conv, {}, {f32({1, 3, 8, 8}), std::nullopt},
                         {"input 1 (w) is required but absent"}));
  EXPECT_TRUE(fails_with(OpKind::conv, GemmAttrs{}, {f32({1, 3, 8, 8}), f32({8, 3, 3, 3})},
                         {"needs ConvAttrs but the node holds GemmAttrs"}));
}

// ---- conv_backward_data -----------------------------------------------------

ConvBackwardDataAttrs backward_data(Ints input_spatial, int64_t stride = 2, int64_t pad = 1,
                                    int64_t groups = 1) {
  ConvBackwardDataAttrs a;
  a.conv = ConvAttrs{.strides = {stride, stride},
                     .pads_begin = {pad, pad},
                     .pads_end = {pad, pad},
                     .groups = groups};
  a.input_spatial = std::move(input_spatial);
  return a;
}

TEST(InferConvBackwardData, GivesDxAndAcceptsOutputPaddingBelowStride) {
  // Forward: (7 + 2 - 3) / 2 + 1 = 4 and (8 + 2 - 3) / 2 + 1 = 4 (output_padding 1).
  for (int64_t d : {7, 8}) {
    Inferred r = infer(OpKind::conv_backward_data, backward_data({d, d}),
                       {f32({2, 8, 4, 4}), f32({8, 3, 3, 3})});
    EXPECT_EQ(r.out(), f32({2, 3, d, d}));
    EXPECT_EQ(r.attrs<ConvBackwardDataAttrs>().conv.dilations, (Ints{1, 1}));
  }
}

TEST(InferConvBackwardData, GroupsAndBias) {
  // C = 2 * 3 = 6; forward (7 - 3) / 1 + 1 = 5.
  Inferred r = infer(OpKind::conv_backward_data, backward_data({7, 7}, 1, 0, 3),
                     {f32({1, 6, 5, 5}), f32({6, 2, 3, 3}), f32({6})});
  EXPECT_EQ(r.out(), f32({1, 6, 7, 7}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, backward_data({7, 7}),
                         {f32({2, 8, 4, 4}), f32({8, 3, 3, 3}), f32({8})},
                         {"input 2 (bias) is [8] but must be [3]"}));
}

TEST(InferConvBackwardData, OneDim) {
  ConvBackwardDataAttrs a;
  a.input_spatial = {10};
  EXPECT_EQ(infer(OpKind::conv_backward_data, a, {f32({1, 4, 8}), f32({4, 2, 3})}).out(),
            f32({1, 2, 10}));
}

TEST(InferConvBackwardDataErrors, ForwardSizeMustMatchDy) {
  // Output padding 2 == stride: forward gives (9 + 2 - 3) / 2 + 1 = 5, not 4.
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, backward_data({9, 9}),
                         {f32({2, 8, 4, 4}), f32({8, 3, 3, 3})},
                         {"input_spatial [9, 9] gives a forward conv output of [5, 5]",
                          "dy [2, 8, 4, 4] has spatial [4, 4]", "output_padding"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, backward_data({1, 1}, 1, 0),
                         {f32({2, 8, 4, 4}), f32({8, 3, 3, 3})},
                         {"input_spatial [1, 1]", "smaller than the dilated kernel 3"}));
}

TEST(InferConvBackwardDataErrors, ChannelsRankAttrs) {
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, backward_data({7, 7}),
                         {f32({2, 5, 4, 4}), f32({8, 3, 3, 3})},
                         {"dy has 5 channels but w has K = 8", "w [8, 3, 3, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, backward_data({7}),
                         {f32({2, 8, 4, 4}), f32({8, 3, 3, 3})},
                         {"input_spatial [7] has 1 values but w [8, 3, 3, 3] has 2 spatial"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, backward_data({0, 7}),
                         {f32({2, 8, 4, 4}), f32({8, 3, 3, 3})},
                         {"input_spatial [0, 7] must all be >= 1"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, backward_data({7, 7}, 2, 1, 3),
                         {f32({2, 8, 4, 4}), f32({8, 3, 3, 3})},
                         {"w has 8 output channels (K), which groups 3 does not divide"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, {}, {f32({2, 8, 4, 4}), f32({8, 3, 3, 3})},
                         {"needs ConvBackwardDataAttrs but the node holds no attributes"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_data, backward_data({7, 7}),
                         {f32({2, 8, 4}), f32({8, 3, 3, 3})},
                         {"dy [2, 8, 4] must be [N, K, O...] with 2 spatial dims"}));
}

// ---- conv_backward_filter ---------------------------------------------------

ConvBackwardFilterAttrs backward_filter(Ints filter_spatial, int64_t stride = 2, int64_t pad = 1,
                                        int64_t groups = 1) {
  ConvBackwardFilterAttrs a;
  a.conv = ConvAttrs{.strides = {stride, stride},
                     .pads_begin = {pad, pad},
                     .pads_end = {pad, pad},
                     .groups = groups};
  a.filter_spatial = std::move(filter_spatial);
  return a;
}

TEST(InferConvBackwardFilter, GivesDw) {
  Inferred r = infer(OpKind::conv_backward_filter, backward_filter({3, 3}),
                     {f32({2, 3, 7, 7}), f32({2, 8, 4, 4})});
  EXPECT_EQ(r.out(), f32({8, 3, 3, 3}));
  EXPECT_EQ(r.attrs<ConvBackwardFilterAttrs>().conv.pads_end, (Ints{1, 1}));
  // Grouped: C/groups = 2.
  EXPECT_EQ(infer(OpKind::conv_backward_filter, backward_filter({3, 3}, 1, 0, 3),
                  {f32({1, 6, 7, 7}), f32({1, 9, 5, 5})})
                .out(),
            f32({9, 2, 3, 3}));
}

TEST(InferConvBackwardFilterErrors, DyMustMatchForwardConv) {
  EXPECT_TRUE(fails_with(OpKind::conv_backward_filter, backward_filter({5, 5}),
                         {f32({2, 3, 7, 7}), f32({2, 8, 4, 4})},
                         {"dy [2, 8, 4, 4] has spatial [4, 4] but conv(x [2, 3, 7, 7], "
                          "filter_spatial [5, 5]) gives [3, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_filter, backward_filter({3, 3}),
                         {f32({2, 3, 7, 7}), f32({3, 8, 4, 4})},
                         {"dy has batch 3 but x has batch 2"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_filter, backward_filter({3, 3}, 1, 0, 3),
                         {f32({1, 6, 7, 7}), f32({1, 8, 5, 5})},
                         {"dy has 8 channels (K), which groups 3 does not divide"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_filter, backward_filter({3}),
                         {f32({2, 3, 7, 7}), f32({2, 8, 4, 4})},
                         {"filter_spatial [3] has 1 values but x [2, 3, 7, 7] has 2 spatial"}));
  EXPECT_TRUE(fails_with(OpKind::conv_backward_filter, backward_filter({3, 3}),
                         {f32({2, 3, 7, 7}), typed(DType::f64, {2, 8, 4, 4})},
                         {"input 1 (dy) is f64 but input 0 (x) is f32"}));
}

// ---- pools ------------------------------------------------------------------

TEST(InferPool, MaxPoolNormalisesAndHalves) {
  Inferred r = infer(OpKind::max_pool, PoolAttrs{.kernel = {2, 2}, .strides = {2, 2}},
                     {f32({1, 3, 32, 32})});
  ASSERT_EQ(r.types.size(), 1u);
  EXPECT_EQ(r.out(), f32({1, 3, 16, 16}));
  const PoolAttrs& a = r.attrs<PoolAttrs>();
  EXPECT_EQ(a.dilations, (Ints{1, 1}));
  EXPECT_EQ(a.pads_begin, (Ints{0, 0}));
  EXPECT_EQ(a.pads_end, (Ints{0, 0}));
}

TEST(InferPool, OneAndThreeDims) {
  EXPECT_EQ(infer(OpKind::avg_pool, PoolAttrs{.kernel = {2}}, {f32({1, 3, 32})}).out(),
            f32({1, 3, 31}));
  EXPECT_EQ(
      infer(OpKind::max_pool, PoolAttrs{.kernel = {2, 2, 2}}, {f32({1, 3, 32, 32, 32})}).out(),
      f32({1, 3, 31, 31, 31}));
}

TEST(InferPool, PadsAndDilations) {
  // ONNX test_maxpool_2d_pads and test_maxpool_2d_dilations.
  PoolAttrs pads{.kernel = {3, 3}, .pads_begin = {2, 2}, .pads_end = {2, 2}};
  EXPECT_EQ(infer(OpKind::max_pool, pads, {f32({1, 3, 28, 28})}).out(), f32({1, 3, 30, 30}));
  EXPECT_EQ(infer(OpKind::avg_pool, pads, {f32({1, 3, 28, 28})}).out(), f32({1, 3, 30, 30}));
  PoolAttrs dil{.kernel = {2, 2}, .dilations = {2, 2}};
  EXPECT_EQ(infer(OpKind::max_pool, dil, {f32({1, 1, 4, 4})}).out(), f32({1, 1, 2, 2}));
}

TEST(InferPool, CeilMode) {
  // ONNX test_maxpool_2d_ceil: (4 - 3) / 2 = 0.5 -> 1 -> 2 windows (floor: 1).
  PoolAttrs a{.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = true};
  EXPECT_EQ(infer(OpKind::max_pool, a, {f32({1, 1, 4, 4})}).out(), f32({1, 1, 2, 2}));
  EXPECT_EQ(infer(OpKind::avg_pool, a, {f32({1, 1, 4, 4})}).out(), f32({1, 1, 2, 2}));
  a.ceil_mode = false;
  EXPECT_EQ(infer(OpKind::max_pool, a, {f32({1, 1, 4, 4})}).out(), f32({1, 1, 1, 1}));
  // D 6, kernel 3, stride 2, pads 1: (8 - 3) / 2 = 2.5 -> ceil 3 -> 4 windows (floor: 3).
  PoolAttrs b{.kernel = {3}, .strides = {2}, .pads_begin = {1}, .pads_end = {1}, .ceil_mode = true};
  EXPECT_EQ(infer(OpKind::max_pool, b, {f32({1, 1, 6})}).out(), f32({1, 1, 4}));
}

TEST(InferPool, CeilModeDropsAWindowStartingInEndPadding) {
  // D 5, kernel 2, stride 2, pads 1: (7 - 2) / 2 = 2.5 -> ceil 3, but window 3 would
  // start at 6 >= 5 + 1 (in the end padding): dropped, 3 windows (PyTorch gives 3).
  PoolAttrs a{.kernel = {2}, .strides = {2}, .pads_begin = {1}, .pads_end = {1}, .ceil_mode = true};
  EXPECT_EQ(infer(OpKind::max_pool, a, {f32({1, 1, 5})}).out(), f32({1, 1, 3}));
}

TEST(InferPool, ReturnIndicesAddsI64Output) {
  PoolAttrs a{.kernel = {2, 2}, .strides = {2, 2}, .return_indices = true};
  Inferred r = infer(OpKind::max_pool, a, {typed(DType::f16, {1, 3, 6, 6})});
  ASSERT_EQ(r.types.size(), 2u);
  EXPECT_EQ(r.out(0), typed(DType::f16, {1, 3, 3, 3}));
  EXPECT_EQ(r.out(1), typed(DType::i64, {1, 3, 3, 3}));
}

TEST(InferPoolErrors, KernelAndVectors) {
  EXPECT_TRUE(fails_with(OpKind::max_pool, PoolAttrs{}, {f32({1, 3, 8, 8})},
                         {"kernel must be given (2 values"}));
  EXPECT_TRUE(fails_with(OpKind::max_pool, {}, {f32({1, 3, 8, 8})},
                         {"needs PoolAttrs but the node holds no attributes"}));
  EXPECT_TRUE(fails_with(OpKind::max_pool, PoolAttrs{.kernel = {2}}, {f32({1, 3, 8, 8})},
                         {"kernel [2] has 1 values but there are 2 spatial dims"}));
  EXPECT_TRUE(fails_with(OpKind::max_pool, PoolAttrs{.kernel = {2, 0}}, {f32({1, 3, 8, 8})},
                         {"kernel [2, 0] must all be >= 1"}));
  EXPECT_TRUE(fails_with(OpKind::avg_pool, PoolAttrs{.kernel = {2, 2}, .strides = {0, 1}},
                         {f32({1, 3, 8, 8})}, {"strides [0, 1] must all be >= 1"}));
  EXPECT_TRUE(fails_with(OpKind::avg_pool, PoolAttrs{.kernel = {2, 2}, .pads_begin = {0, -1}},
                         {f32({1, 3, 8, 8})}, {"pads_begin [0, -1] must all be >= 0"}));
  EXPECT_TRUE(fails_with(OpKind::max_pool, PoolAttrs{.kernel = {2, 2}, .pads_end = {1, 1, 1}},
                         {f32({1, 3, 8, 8})}, {"pads_end [1, 1, 1] has 3 values"}));
}

TEST(InferPoolErrors, Geometry) {
  EXPECT_TRUE(
      fails_with(OpKind::max_pool, PoolAttrs{.kernel = {3, 3}}, {f32({1, 1, 2, 2})},
                 {"x [1, 1, 2, 2]", "smaller than the dilated kernel 3", "output would be empty"}));
  EXPECT_TRUE(fails_with(
      OpKind::max_pool, PoolAttrs{.kernel = {2, 2}, .pads_begin = {2, 0}, .pads_end = {0, 0}},
      {f32({1, 1, 4, 4})}, {"pads_begin [2, 0]", "smaller than the dilated kernel (2"}));
  EXPECT_TRUE(fails_with(OpKind::avg_pool, PoolAttrs{.kernel = {2, 2}, .dilations = {2, 2}},
                         {f32({1, 1, 8, 8})}, {"avg_pool takes no dilation", "[2, 2]"}));
  EXPECT_TRUE(fails_with(OpKind::avg_pool, PoolAttrs{.kernel = {2, 2}, .return_indices = true},
                         {f32({1, 1, 8, 8})}, {"return_indices is for max_pool only"}));
  EXPECT_TRUE(fails_with(OpKind::max_pool, PoolAttrs{.kernel = {2}}, {f32({1, 8})},
                         {"input 0 (x) must be [N, C, D...]", "but is [1, 8]"}));
  EXPECT_TRUE(fails_with(OpKind::max_pool, PoolAttrs{.kernel = {2, 2}},
                         {typed(DType::i32, {1, 1, 4, 4})},
                         {"input 0 (x) is i32 but max_pool needs a floating-point dtype"}));
  EXPECT_TRUE(fails_with(OpKind::avg_pool,
                         PoolAttrs{.kernel = {3}, .pads_begin = {2}, .pads_end = {2}},
                         {f32({1, 1, 0})}, {"x [1, 1, 0] has an empty spatial dim"}));
}

TEST(InferGlobalAvgPool, KeepsSpatialDimsAsOne) {
  EXPECT_EQ(infer(OpKind::global_avg_pool, {}, {f32({2, 3, 7, 7})}).out(), f32({2, 3, 1, 1}));
  EXPECT_EQ(infer(OpKind::global_avg_pool, {}, {f32({2, 3, 5})}).out(), f32({2, 3, 1}));
  EXPECT_TRUE(fails_with(OpKind::global_avg_pool, {}, {f32({2, 3})},
                         {"input 0 (x) must be [N, C, D...] (rank 3 or more) but is [2, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::global_avg_pool, {}, {f32({2, 3, 0})},
                         {"x [2, 3, 0] has an empty spatial dim"}));
}

}  // namespace
}  // namespace fusebox::ir_test
