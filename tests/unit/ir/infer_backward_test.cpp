// Shape inference and normalisation for expand, the backward ops and the optimizer
// updates: output types, attributes normalised as the forward op's, and an error
// naming the node, the input and the shapes for every mismatch.
#include <cmath>

#include "infer_testing.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

using Types = std::vector<TensorType>;

TensorType f64(Shape s) {
  return {DType::f64, std::move(s)};
}
TensorType i64(Shape s) {
  return {DType::i64, std::move(s)};
}

// ---- expand -------------------------------------------------------------------

TEST(InferExpand, BroadcastsToTheGivenShape) {
  EXPECT_EQ(infer(OpKind::expand, ExpandAttrs{{2, 3, 4}}, {f32({3, 1})}).out(), f32({2, 3, 4}));
  EXPECT_EQ(infer(OpKind::expand, ExpandAttrs{{5}}, {typed(DType::i64, {})}).out(), i64({5}));
  EXPECT_EQ(infer(OpKind::expand, ExpandAttrs{{2, 0}}, {f32({1, 1})}).out(), f32({2, 0}));
  EXPECT_EQ(infer(OpKind::expand, ExpandAttrs{{3}}, {f32({3})}).out(), f32({3}));
}

TEST(InferExpandErrors, ShapeMustBeABroadcastOfX) {
  EXPECT_TRUE(fails_with(OpKind::expand, ExpandAttrs{{2, 4}}, {f32({3, 1})},
                         {"x [3, 1] does not broadcast to shape [2, 4] (dim 0 of x: 3 vs 2)"}));
  // numpy broadcast_to is one-way: x's 3 cannot shrink to 1.
  EXPECT_TRUE(fails_with(OpKind::expand, ExpandAttrs{{1, 1}}, {f32({3, 1})}, {"dim 0 of x: 3"}));
  EXPECT_TRUE(fails_with(OpKind::expand, ExpandAttrs{{4}}, {f32({1, 4})},
                         {"x [1, 4] has more dims than shape [4]"}));
  EXPECT_TRUE(fails_with(OpKind::expand, ExpandAttrs{{-1, 4}}, {f32({4})},
                         {"shape [-1, 4] has a negative extent"}));
  EXPECT_TRUE(fails_with(OpKind::expand, {}, {f32({4})}, {"needs ExpandAttrs"}));
}

// ---- unary / binary -------------------------------------------------------------

TEST(InferUnaryBackward, GradientHasXsType) {
  for (OpKind op : {OpKind::relu, OpKind::gelu, OpKind::clip, OpKind::rsqrt, OpKind::erf}) {
    Inferred r =
        infer(OpKind::unary_backward, UnaryBackwardAttrs{.op = op}, {f64({2, 3}), f64({2, 3})});
    EXPECT_EQ(r.types, (Types{f64({2, 3})})) << op_name(op);
  }
}

TEST(InferUnaryBackwardErrors, OpShapesAndAttrs) {
  const std::vector<In> ok = {f32({2, 3}), f32({2, 3})};
  EXPECT_TRUE(fails_with(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::add}, ok,
                         {"op add is not a unary op with a derivative"}));
  EXPECT_TRUE(fails_with(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::identity}, ok,
                         {"op identity"}));
  EXPECT_TRUE(fails_with(OpKind::unary_backward, UnaryBackwardAttrs{}, {f32({2, 3}), f32({3, 2})},
                         {"input 0 (dy) is f32[2, 3] but must be f32[3, 2]"}));
  EXPECT_TRUE(fails_with(OpKind::unary_backward, UnaryBackwardAttrs{}, {f64({2, 3}), f32({2, 3})},
                         {"input 0 (dy) is f64[2, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::unary_backward, UnaryBackwardAttrs{}, {i64({2}), i64({2})},
                         {"input 1 (x) is i64", "floating-point"}));
  EXPECT_TRUE(fails_with(OpKind::unary_backward,
                         UnaryBackwardAttrs{.op = OpKind::clip, .min = 2, .max = 1}, ok,
                         {"min 2 is greater than max 1"}));
  EXPECT_TRUE(fails_with(OpKind::unary_backward,
                         UnaryBackwardAttrs{.op = OpKind::leaky_relu, .alpha = INFINITY}, ok,
                         {"alpha inf must be finite"}));
  EXPECT_TRUE(fails_with(OpKind::unary_backward, {}, ok, {"needs UnaryBackwardAttrs"}));
}

TEST(InferBinaryBackward, GradientsAtTheBroadcastShape) {
  Inferred r = infer(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::div},
                     {f32({2, 3, 4}), f32({3, 1}), f32({2, 1, 4})});
  EXPECT_EQ(r.types, (Types{f32({2, 3, 4}), f32({2, 3, 4})}));
  // pow's exponent may be an integer; both gradients take the base's dtype.
  r = infer(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::pow},
            {f64({3}), f64({3}), i64({})});
  EXPECT_EQ(r.types, (Types{f64({3}), f64({3})}));
}

TEST(InferBinaryBackwardErrors, OpShapesAndDtypes) {
  EXPECT_TRUE(fails_with(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::add},
                         {f32({3}), f32({3}), f32({3})},
                         {"op add is not one of div, max, min, pow"}));
  EXPECT_TRUE(fails_with(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::max},
                         {f32({2, 3}), f32({3, 1}), f32({1, 2})},
                         {"input 0 (dy) is f32[2, 3] but must be f32[3, 2]", "max output"}));
  EXPECT_TRUE(fails_with(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::min},
                         {f32({3}), f32({3}), f32({4})}, {"a [3] and b [4] do not broadcast"}));
  EXPECT_TRUE(fails_with(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::div},
                         {f32({3}), f32({3}), i64({3})}, {"input 2 (b) is i64 but input 1 (a)"}));
  EXPECT_TRUE(fails_with(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::pow},
                         {f32({3}), f32({3}), typed(DType::boolean, {3})},
                         {"input 2 (b) is bool"}));
}

// ---- normalisation ----------------------------------------------------------------

TEST(InferBatchNormBackward, PerChannelGradients) {
  Inferred r = infer(OpKind::batch_norm_backward, BatchNormAttrs{.training = true},
                     {f32({2, 3, 4}), f32({2, 3, 4}), f32({3}), f32({3}), f32({3})});
  EXPECT_EQ(r.types, (Types{f32({2, 3, 4}), f32({3}), f32({3})}));
  // Monostate: the default attributes (the inference form).
  r = infer(OpKind::batch_norm_backward, {},
            {f64({5, 2}), f64({5, 2}), f64({2}), f64({2}), f64({2})});
  EXPECT_FALSE(r.attrs<BatchNormAttrs>().training);
  EXPECT_EQ(r.out(2), f64({2}));
}

// Mixed precision: bf16 / f16 dy and x with f32 scale and saved statistics give dx in x's
// dtype and dscale / dbias in f32.
TEST(InferBatchNormBackward, LowPrecisionXWithF32Params) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    const Inferred r =
        infer(OpKind::batch_norm_backward, BatchNormAttrs{.training = true},
              {typed(low, {2, 3, 4}), typed(low, {2, 3, 4}), f32({3}), f32({3}), f32({3})});
    EXPECT_EQ(r.types, (Types{typed(low, {2, 3, 4}), f32({3}), f32({3})}));
  }
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, {},
                         {f32({2, 3}), f32({2, 3}), typed(DType::bf16, {3}),
                          typed(DType::bf16, {3}), typed(DType::bf16, {3})},
                         {"input 2 (scale) is bf16 but input 1 (x) is f32"}));
  EXPECT_TRUE(fails_with(
      OpKind::batch_norm_backward, {},
      {typed(DType::bf16, {2, 3}), typed(DType::bf16, {2, 3}), f32({3}), f32({3}),
       typed(DType::bf16, {3})},
      {"input 4 (saved_inv_std) is bf16 but input 2 (scale) is f32", "must share one dtype"}));
}

TEST(InferBatchNormBackwardErrors, Shapes) {
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, {},
                         {f32({2, 3, 4}), f32({2, 3, 4}), f32({3}), f32({4}), f32({3})},
                         {"input 3 (saved_mean) is [4] but must be [3]"}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, {},
                         {f32({2, 3, 5}), f32({2, 3, 4}), f32({3}), f32({3}), f32({3})},
                         {"input 0 (dy) is f32[2, 3, 5] but must be f32[2, 3, 4]"}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, {},
                         {f32({3}), f32({3}), f32({3}), f32({3}), f32({3})},
                         {"input 1 (x) must be [N, C, D...]"}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, {},
                         {f32({2, 3}), f32({2, 3}), f64({3}), f32({3}), f32({3})},
                         {"input 2 (scale) is f64 but input 1 (x) is f32"}));
}

// A fused relu: y (the forward's output 0, x's type) is input 5, exactly when relu is set.
TEST(InferBatchNormBackward, FusedReluTakesY) {
  const BatchNormAttrs relu{.training = true, .relu = true};
  Inferred r =
      infer(OpKind::batch_norm_backward, relu,
            {f32({2, 3, 4}), f32({2, 3, 4}), f32({3}), f32({3}), f32({3}), f32({2, 3, 4})});
  EXPECT_EQ(r.types, (Types{f32({2, 3, 4}), f32({3}), f32({3})}));
  EXPECT_TRUE(r.attrs<BatchNormAttrs>().relu);
  // Mixed precision: y has x's (low) dtype.
  r = infer(OpKind::batch_norm_backward, BatchNormAttrs{.relu = true},
            {typed(DType::bf16, {2, 3}), typed(DType::bf16, {2, 3}), f32({3}), f32({3}), f32({3}),
             typed(DType::bf16, {2, 3})});
  EXPECT_EQ(r.types, (Types{typed(DType::bf16, {2, 3}), f32({3}), f32({3})}));
}

TEST(InferBatchNormBackwardErrors, FusedReluY) {
  const BatchNormAttrs relu{.training = true, .relu = true};
  const std::vector<In> five = {f32({2, 3, 4}), f32({2, 3, 4}), f32({3}), f32({3}), f32({3})};
  EXPECT_TRUE(
      fails_with(OpKind::batch_norm_backward, relu, five, {"input 5 (y) is required with relu"}));
  std::vector<In> absent = five;
  absent.push_back(std::nullopt);
  EXPECT_TRUE(
      fails_with(OpKind::batch_norm_backward, relu, absent, {"input 5 (y) is required with relu"}));
  std::vector<In> wrong = five;
  wrong.push_back(f32({2, 3, 5}));
  EXPECT_TRUE(fails_with(
      OpKind::batch_norm_backward, relu, wrong,
      {"input 5 (y) is f32[2, 3, 5] but must be f32[2, 3, 4]", "like the forward's output y"}));
  wrong.back() = typed(DType::f16, {2, 3, 4});
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, relu, wrong,
                         {"input 5 (y) is f16[2, 3, 4] but must be f32[2, 3, 4]"}));
  std::vector<In> unfused = five;
  unfused.push_back(f32({2, 3, 4}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, BatchNormAttrs{.training = true}, unfused,
                         {"input 5 (y) is given but relu is false"}));
  unfused.push_back(f32({3}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, BatchNormAttrs{.training = true}, unfused,
                         {"input 5 (y) is given but relu is false"}));
  unfused.push_back(f32({3}));
  EXPECT_TRUE(fails_with(
      OpKind::batch_norm_backward, relu, unfused,
      {"input 7 (dy_addend) is f32[3] but must be f32[2, 3, 4]", "a second term of dy"}));
  unfused.back() = f32({2, 3, 4});
  unfused.push_back(f32({2, 3, 4}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, relu, unfused,
                         {"takes 5 to 8 inputs (dy, x, scale, saved_mean, saved_inv_std, y?, "
                          "bias?, dy_addend?)",
                          "but got 9"}));
}

// The forward's bias beside y (input 6, the per-channel dtype), with a fused relu only.
TEST(InferBatchNormBackward, FusedReluMayTakeTheBias) {
  const BatchNormAttrs relu{.training = true, .relu = true};
  const Inferred r = infer(OpKind::batch_norm_backward, relu,
                           {typed(DType::bf16, {2, 3, 4}), typed(DType::bf16, {2, 3, 4}), f32({3}),
                            f32({3}), f32({3}), typed(DType::bf16, {2, 3, 4}), f32({3})});
  EXPECT_EQ(r.types, (Types{typed(DType::bf16, {2, 3, 4}), f32({3}), f32({3})}));
  std::vector<In> in = {f32({2, 3, 4}), f32({2, 3, 4}), f32({3}), f32({3}),
                        f32({3}),       f32({2, 3, 4}), f32({4})};
  EXPECT_TRUE(
      fails_with(OpKind::batch_norm_backward, relu, in, {"input 6 (bias) is [4] but must be [3]"}));
  in.back() = typed(DType::bf16, {3});
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, relu, in,
                         {"input 6 (bias) is bf16[3] but must be f32[3]"}));
  in.back() = f32({3});
  in[5] = std::nullopt;
  EXPECT_TRUE(fails_with(OpKind::batch_norm_backward, BatchNormAttrs{.training = true}, in,
                         {"input 6 (bias) is given but relu is false"}));
}

TEST(InferLayerNormBackward, AxisNormalisedAndParamGradientShapes) {
  // No scale: the gradients take the normalised dims' shape.
  Inferred r =
      infer(OpKind::layer_norm_backward, NormAttrs{.axis = -2},
            {f32({2, 3, 4}), f32({2, 3, 4}), std::nullopt, f32({2, 1, 1}), f32({2, 1, 1})});
  EXPECT_EQ(r.attrs<NormAttrs>().axis, 1);
  EXPECT_EQ(r.types, (Types{f32({2, 3, 4}), f32({3, 4}), f32({3, 4})}));
  // A broadcast scale: the gradients take its shape.
  r = infer(OpKind::layer_norm_backward, NormAttrs{.axis = 1},
            {f32({2, 3, 4}), f32({2, 3, 4}), f32({1, 4}), f32({2, 1, 1}), f32({2, 1, 1})});
  EXPECT_EQ(r.types, (Types{f32({2, 3, 4}), f32({1, 4}), f32({1, 4})}));
  // f16 x: the statistics are f32 (stash type), the gradients f16.
  const TensorType h = typed(DType::f16, {4, 6});
  r = infer(OpKind::rms_norm_backward, {}, {h, h, typed(DType::f16, {6}), f32({4, 1})});
  EXPECT_EQ(r.types, (Types{h, typed(DType::f16, {6})}));
}

TEST(InferLayerNormBackwardErrors, StatisticsAndScale) {
  EXPECT_TRUE(
      fails_with(OpKind::layer_norm_backward, NormAttrs{.axis = 1},
                 {f32({2, 3, 4}), f32({2, 3, 4}), std::nullopt, f32({2, 3, 1}), f32({2, 1, 1})},
                 {"input 3 (mean) is f32[2, 3, 1] but must be f32[2, 1, 1]"}));
  EXPECT_TRUE(fails_with(OpKind::layer_norm_backward, NormAttrs{.axis = 1},
                         {f32({2, 3, 4}), f32({2, 3, 4}), f32({3}), f32({2, 1, 1}), f32({2, 1, 1})},
                         {"as the forward layer_norm of x f32[2, 3, 4]: ",
                          "scale [3] does not broadcast to the normalised dims [3, 4]"}));
  EXPECT_TRUE(fails_with(OpKind::rms_norm_backward, NormAttrs{.axis = 3},
                         {f32({2, 3}), f32({2, 3}), std::nullopt, f32({2, 1})},
                         {"as the forward rms_norm", "axis 3 is out of range for rank 2"}));
  EXPECT_TRUE(fails_with(OpKind::rms_norm_backward, {},
                         {f32({2, 3}), f32({2, 3}), std::nullopt, typed(DType::f16, {2, 1})},
                         {"input 3 (inv_rms) is f16[2, 1] but must be f32[2, 1]"}));
}

// ---- softmax, cross-entropy, reduce_max ------------------------------------------------

TEST(InferSoftmaxBackward, AxisNormalised) {
  Inferred r =
      infer(OpKind::log_softmax_backward, SoftmaxAttrs{-3}, {f32({2, 3, 4}), f32({2, 3, 4})});
  EXPECT_EQ(r.attrs<SoftmaxAttrs>().axis, 0);
  EXPECT_EQ(r.out(), f32({2, 3, 4}));
  EXPECT_TRUE(fails_with(OpKind::softmax_backward, SoftmaxAttrs{3}, {f32({2, 3}), f32({2, 3})},
                         {"as the forward softmax of y f32[2, 3]: axis 3 is out of range"}));
  EXPECT_TRUE(fails_with(OpKind::softmax_backward, {}, {f32({2, 2}), f32({2, 3})},
                         {"input 0 (dy) is f32[2, 2] but must be f32[2, 3]"}));
}

TEST(InferCrossEntropyBackward, LossShapes) {
  const TensorType logits = f32({4, 5, 2});
  Inferred r = infer(OpKind::cross_entropy_backward, CrossEntropyAttrs{},
                     {f32({}), logits, i64({4, 2}), f32({5})});
  EXPECT_EQ(r.types, (Types{logits}));
  r = infer(OpKind::cross_entropy_backward, CrossEntropyAttrs{.reduction = Reduction::none},
            {f32({4, 2}), logits, typed(DType::i32, {4, 2})});
  EXPECT_EQ(r.types, (Types{logits}));
  EXPECT_TRUE(fails_with(
      OpKind::cross_entropy_backward, CrossEntropyAttrs{.reduction = Reduction::none},
      {f32({}), logits, i64({4, 2})}, {"input 0 (dloss) is f32[] but must be f32[4, 2]", "loss"}));
  EXPECT_TRUE(fails_with(OpKind::cross_entropy_backward, {}, {f32({}), logits, i64({4, 3})},
                         {"as the forward cross_entropy of logits f32[4, 5, 2]",
                          "input 1 (labels) is [4, 3] but must be [4, 2]"}));
}

TEST(InferReduceMaxBackward, AxesNormalisedAndForwardShapes) {
  Inferred r = infer(OpKind::reduce_max_backward, ReduceAttrs{.axes = {-1, 0}, .keepdims = false},
                     {f32({3}), f32({2, 3, 4}), f32({3})});
  EXPECT_EQ(r.attrs<ReduceAttrs>().axes, (Ints{0, 2}));
  EXPECT_EQ(r.out(), f32({2, 3, 4}));
  r = infer(OpKind::reduce_max_backward, ReduceAttrs{}, {f32({1, 1}), f32({2, 3}), f32({1, 1})});
  EXPECT_EQ(r.attrs<ReduceAttrs>().axes, (Ints{0, 1}));
  EXPECT_TRUE(fails_with(OpKind::reduce_max_backward, ReduceAttrs{.axes = {1}},
                         {f32({2, 1}), f32({2, 3}), f32({2})},
                         {"input 2 (y) is f32[2] but must be f32[2, 1]"}));
  EXPECT_TRUE(fails_with(OpKind::reduce_max_backward, ReduceAttrs{.axes = {1}},
                         {i64({2, 1}), i64({2, 3}), i64({2, 1})}, {"input 1 (x) is i64"}));
  EXPECT_TRUE(fails_with(OpKind::reduce_max_backward, ReduceAttrs{.axes = {1, 1}},
                         {f32({2, 1}), f32({2, 3}), f32({2, 1})},
                         {"as the forward reduce_max", "names axis 1 twice"}));
}

// ---- pools, slice, pad -------------------------------------------------------------

TEST(InferPoolBackward, PoolNormalisedAsTheForward) {
  PoolBackwardAttrs a{.pool = {.kernel = {3, 3},
                               .strides = {2, 2},
                               .pads_begin = {1, 1},
                               .pads_end = {1, 1},
                               .ceil_mode = true,
                               .return_indices = true}};
  Inferred r = infer(OpKind::max_pool_backward, a, {f32({1, 2, 3, 3}), f32({1, 2, 5, 5})});
  EXPECT_EQ(r.out(), f32({1, 2, 5, 5}));
  const PoolBackwardAttrs& n = r.attrs<PoolBackwardAttrs>();
  EXPECT_EQ(n.input_shape, (Ints{1, 2, 5, 5}));  // filled from x
  EXPECT_EQ(n.pool.dilations, (Ints{1, 1}));
  EXPECT_FALSE(n.pool.return_indices);

  a = PoolBackwardAttrs{.pool = {.kernel = {2}, .strides = {2}}, .input_shape = {2, 3, 7}};
  r = infer(OpKind::avg_pool_backward, a, {f64({2, 3, 3})});
  EXPECT_EQ(r.out(), f64({2, 3, 7}));
  EXPECT_EQ(r.attrs<PoolBackwardAttrs>().pool.pads_end, (Ints{0}));
}

TEST(InferPoolBackwardErrors, ShapesAndForwardRules) {
  PoolBackwardAttrs a{.pool = {.kernel = {2, 2}}, .input_shape = {1, 1, 4, 4}};
  EXPECT_TRUE(
      fails_with(OpKind::avg_pool_backward, a, {f32({1, 1, 2, 2})},
                 {"input 0 (dy) is f32[1, 1, 2, 2] but must be f32[1, 1, 3, 3]", "output y"}));
  EXPECT_TRUE(fails_with(OpKind::max_pool_backward, a, {f32({1, 1, 3, 3}), f32({1, 1, 5, 5})},
                         {"input_shape [1, 1, 4, 4] does not match x [1, 1, 5, 5]"}));
  a.pool.dilations = {2, 2};
  EXPECT_TRUE(fails_with(OpKind::avg_pool_backward, a, {f32({1, 1, 2, 2})},
                         {"as the forward avg_pool of x f32[1, 1, 4, 4] (input_shape): ",
                          "avg_pool takes no dilation"}));
  a = PoolBackwardAttrs{.pool = {.kernel = {2}}, .input_shape = {1, -1, 4}};
  EXPECT_TRUE(fails_with(OpKind::avg_pool_backward, a, {f32({1, 1, 3})},
                         {"input_shape [1, -1, 4] has a negative extent"}));
  a = PoolBackwardAttrs{.pool = {}, .input_shape = {1, 1, 4}};
  EXPECT_TRUE(fails_with(OpKind::avg_pool_backward, a, {f32({1, 1, 3})}, {"kernel must be given"}));
}

TEST(InferSliceBackward, SliceNormalisedAgainstInputShape) {
  SliceBackwardAttrs a{.slice = {.starts = {-1}, .ends = {-100}, .axes = {-1}, .steps = {-2}},
                       .input_shape = {2, 5}};
  Inferred r = infer(OpKind::slice_backward, a, {f32({2, 3})});
  EXPECT_EQ(r.out(), f32({2, 5}));
  const SliceAttrs& s = r.attrs<SliceBackwardAttrs>().slice;
  EXPECT_TRUE(s.normalized);
  EXPECT_EQ(s.axes, (Ints{1}));
  EXPECT_EQ(s.starts, (Ints{4}));
  EXPECT_EQ(s.ends, (Ints{-1}));
  EXPECT_TRUE(fails_with(OpKind::slice_backward, a, {f32({2, 2})},
                         {"input 0 (dy) is f32[2, 2] but must be f32[2, 3]"}));
  a.slice.steps = {0};
  EXPECT_TRUE(
      fails_with(OpKind::slice_backward, a, {f32({2, 3})},
                 {"as the forward slice of x f32[2, 5] (input_shape): ", "steps [0] has a 0"}));
}

TEST(InferPadBackward, ForwardRulesOnInputShape) {
  PadBackwardAttrs a{.pad = {.pads = {1, -1, 2, 0}, .mode = PadMode::reflect},
                     .input_shape = {3, 4}};
  EXPECT_EQ(infer(OpKind::pad_backward, a, {f32({6, 3})}).out(), f32({3, 4}));
  EXPECT_TRUE(fails_with(OpKind::pad_backward, a, {f32({6, 4})},
                         {"input 0 (dy) is f32[6, 4] but must be f32[6, 3]"}));
  a.pad.pads = {3, 0, 0, 0};
  EXPECT_TRUE(fails_with(OpKind::pad_backward, a, {f32({6, 4})},
                         {"as the forward pad", "reflect pads [3, 0, 0, 0] exceed dim 0"}));
  a.pad.pads = {0, 0};
  EXPECT_TRUE(fails_with(OpKind::pad_backward, a, {f32({3, 4})}, {"needs 2 * rank = 4"}));
  EXPECT_TRUE(fails_with(OpKind::pad_backward, PadBackwardAttrs{.input_shape = {3}}, {i64({3})},
                         {"input 0 (dy) is i64"}));
}

// ---- optimizers ----------------------------------------------------------------------

TEST(InferOptimizer, OutputsHaveParamsType) {
  const TensorType p = f32({4, 3});
  Inferred r = infer(OpKind::sgd_update, {}, {p, p, p, f32({})});
  EXPECT_EQ(r.types, (Types{p, p}));
  EXPECT_EQ(r.attrs<SgdAttrs>().momentum, 0.0);
  r = infer(OpKind::adamw_update, AdamWAttrs{.weight_decay = 0.1},
            {f64({7}), f64({7}), f64({7}), f64({7}), f32({}), i64({})});
  EXPECT_EQ(r.types, (Types{f64({7}), f64({7}), f64({7})}));
}

TEST(InferOptimizerErrors, StatesScalarsAndHyperparameters) {
  const TensorType p = f32({4, 3});
  EXPECT_TRUE(
      fails_with(OpKind::sgd_update, {}, {p, f32({3, 4}), p, f32({})},
                 {"input 1 (grad) is f32[3, 4] but must be f32[4, 3] like input 0 (param)"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {p, p, p, f32({1})},
                         {"input 3 (lr) must be a scalar (shape []) but is [1]"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {p, p, p, i64({})},
                         {"input 3 (lr) is i64 but must be a float"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update,
                         SgdAttrs{.momentum = 0.9, .dampening = 0.1, .nesterov = true},
                         {p, p, p, f32({})}, {"nesterov needs momentum > 0 and dampening 0"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {i64({2}), i64({2}), i64({2}), f32({})},
                         {"input 0 (param) is i64"}));
  EXPECT_TRUE(fails_with(OpKind::adamw_update, {}, {p, p, p, p, f32({}), f32({})},
                         {"input 5 (step) is f32 but must be i64"}));
  EXPECT_TRUE(fails_with(OpKind::adamw_update, AdamWAttrs{.beta2 = 1.0},
                         {p, p, p, p, f32({}), i64({})},
                         {"beta1 0.9 and beta2 1 must be in [0, 1)"}));
  EXPECT_TRUE(fails_with(OpKind::adamw_update, AdamWAttrs{.epsilon = -1},
                         {p, p, p, p, f32({}), i64({})}, {"epsilon -1 must be finite and >= 0"}));
  EXPECT_TRUE(fails_with(OpKind::adamw_update, {}, {p, p, p, f64({4, 3}), f32({}), i64({})},
                         {"input 3 (v) is f64[4, 3]"}));
}

// ---- dump ------------------------------------------------------------------------------

TEST(InferBackwardDump, AttributesRendered) {
  Graph g;
  ValueId dy = g.add_input("dy", DType::f32, {1, 1, 2});
  g.add_node(OpKind::avg_pool_backward,
             PoolBackwardAttrs{.pool = {.kernel = {2}, .strides = {2}}, .input_shape = {1, 1, 4}},
             {dy}, "apb");
  ValueId x = g.add_input("x", DType::f32, {3});
  g.add_node(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::clip, .min = -1, .max = 1},
             {x, x}, "ub");
  ValueId lr = g.add_input("lr", DType::f32, {});
  g.add_node(OpKind::sgd_update, SgdAttrs{.momentum = 0.9}, {x, x, x, lr}, "sgd");
  const std::string text = g.dump();
  EXPECT_NE(text.find("{kernel=[2] strides=[2]"), std::string::npos) << text;
  EXPECT_NE(text.find("input_shape=[1, 1, 4]"), std::string::npos) << text;
  EXPECT_NE(text.find("{op=clip min=-1 max=1}"), std::string::npos) << text;
  EXPECT_NE(text.find("{momentum=0.9 dampening=0 weight_decay=0 nesterov=0}"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace fusebox::ir_test
