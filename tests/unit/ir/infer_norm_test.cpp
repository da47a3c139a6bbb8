// Shape inference for batch_norm, layer_norm, rms_norm and cross_entropy.
#include "infer_testing.h"

// Designated initialisers (ConvAttrs{.strides = ...}) leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

std::vector<In> bn_inputs(Shape x, Shape c = {3}) {
  return {f32(x), f32(c), f32(c), f32(c), f32(c)};
}

TEST(InferBatchNorm, InferenceHasOneOutput) {
  Inferred r = infer(OpKind::batch_norm, BatchNormAttrs{}, bn_inputs({2, 3, 4, 4}));
  ASSERT_EQ(r.types.size(), 1u);
  EXPECT_EQ(r.out(), f32({2, 3, 4, 4}));
  // [N, C] is fine too, and monostate means inference with defaults.
  r = infer(OpKind::batch_norm, {}, bn_inputs({5, 3}));
  EXPECT_EQ(r.types, (std::vector<TensorType>{f32({5, 3})}));
  EXPECT_FALSE(r.attrs<BatchNormAttrs>().training);
}

TEST(InferBatchNorm, TrainingHasFiveOutputs) {
  Inferred r = infer(OpKind::batch_norm, BatchNormAttrs{.training = true}, bn_inputs({2, 3, 4}));
  EXPECT_EQ(r.types,
            (std::vector<TensorType>{f32({2, 3, 4}), f32({3}), f32({3}), f32({3}), f32({3})}));
}

// A fused relu changes no output type, in either form, and stays set.
TEST(InferBatchNorm, FusedReluKeepsTheOutputs) {
  Inferred r = infer(OpKind::batch_norm, BatchNormAttrs{.relu = true}, bn_inputs({2, 3, 4, 4}));
  EXPECT_EQ(r.types, (std::vector<TensorType>{f32({2, 3, 4, 4})}));
  EXPECT_TRUE(r.attrs<BatchNormAttrs>().relu);
  r = infer(OpKind::batch_norm, BatchNormAttrs{.training = true, .relu = true},
            bn_inputs({2, 3, 4}));
  EXPECT_EQ(r.types,
            (std::vector<TensorType>{f32({2, 3, 4}), f32({3}), f32({3}), f32({3}), f32({3})}));
  EXPECT_TRUE(r.attrs<BatchNormAttrs>().relu);
}

// Mixed precision (PyTorch AMP, cuDNN): f16 / bf16 x with f32 scale, bias and running
// statistics. y keeps x's dtype; the per-channel outputs take the parameters' (f32).
TEST(InferBatchNorm, LowPrecisionXWithF32Params) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    std::vector<In> in = bn_inputs({2, 3, 4, 4});
    in[0] = typed(low, {2, 3, 4, 4});
    Inferred r = infer(OpKind::batch_norm, BatchNormAttrs{}, in);
    EXPECT_EQ(r.types, (std::vector<TensorType>{typed(low, {2, 3, 4, 4})}));
    r = infer(OpKind::batch_norm, BatchNormAttrs{.training = true}, in);
    EXPECT_EQ(r.types, (std::vector<TensorType>{typed(low, {2, 3, 4, 4}), f32({3}), f32({3}),
                                                f32({3}), f32({3})}));
  }
}

TEST(InferBatchNormErrors, MixedPrecisionCombinations) {
  // f32 x with bf16 parameters: only low-precision x may have wider parameters.
  std::vector<In> in = {f32({2, 3, 4}), typed(DType::bf16, {3}), typed(DType::bf16, {3}),
                        typed(DType::bf16, {3}), typed(DType::bf16, {3})};
  EXPECT_TRUE(fails_with(OpKind::batch_norm, {}, in,
                         {"input 1 (scale) is bf16 but input 0 (x) is f32",
                          "x's dtype, or f32 when x is f16 or bf16"}));
  // f64 parameters for bf16 x: f32 is the one wider dtype allowed.
  in = bn_inputs({2, 3, 4});
  in[0] = typed(DType::bf16, {2, 3, 4});
  in[2] = typed(DType::f64, {3});
  EXPECT_TRUE(
      fails_with(OpKind::batch_norm, {}, in, {"input 2 (bias) is f64 but input 0 (x) is bf16"}));
  // Parameters of mixed dtypes among themselves (each alone would be fine).
  in = bn_inputs({2, 3, 4});
  in[0] = typed(DType::bf16, {2, 3, 4});
  in[3] = typed(DType::bf16, {3});
  EXPECT_TRUE(
      fails_with(OpKind::batch_norm, BatchNormAttrs{.training = true}, in,
                 {"input 3 (mean) is bf16 but input 1 (scale) is f32", "must share one dtype"}));
}

TEST(InferBatchNormErrors, Params) {
  std::vector<In> in = bn_inputs({2, 3, 4, 4});
  in[3] = f32({4});
  EXPECT_TRUE(fails_with(OpKind::batch_norm, {}, in,
                         {"input 3 (mean) is [4] but must be [3] ([C], one per channel of x "
                          "[2, 3, 4, 4])"}));
  in = bn_inputs({2, 3, 4, 4});
  in[4] = typed(DType::f16, {3});
  EXPECT_TRUE(
      fails_with(OpKind::batch_norm, {}, in, {"input 4 (var) is f16 but input 0 (x) is f32"}));
  in = bn_inputs({2, 3, 4, 4});
  in[1] = f32({1, 3});
  EXPECT_TRUE(fails_with(OpKind::batch_norm, {}, in, {"input 1 (scale) is [1, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm, {}, bn_inputs({3}),
                         {"input 0 (x) must be [N, C, D...] (rank 2 or more) but is [3]"}));
  in = bn_inputs({2, 3, 4, 4});
  in.pop_back();
  EXPECT_TRUE(fails_with(OpKind::batch_norm, {}, in,
                         {"takes 5 to 7 inputs (x, scale, bias, mean, var, residual?, "
                          "batch_stats?) but got 4"}));
  in = bn_inputs({2, 3, 4, 4});
  in.push_back(f32({2, 3, 4, 5}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm, {}, in,
                         {"input 5 (residual) is [2, 3, 4, 5] but must be [2, 3, 4, 4]"}));
  in.back() = typed(DType::f16, {2, 3, 4, 4});
  EXPECT_TRUE(
      fails_with(OpKind::batch_norm, {}, in, {"input 5 (residual) is f16 but input 0 (x) is f32"}));
  in = bn_inputs({2, 3, 4, 4});
  in[2] = std::nullopt;
  EXPECT_TRUE(fails_with(OpKind::batch_norm, {}, in, {"input 2 (bias) is required but absent"}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm, BatchNormAttrs{.epsilon = -1}, bn_inputs({2, 3, 4, 4}),
                         {"epsilon -1 must be finite and >= 0"}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm, BatchNormAttrs{.training = true}, bn_inputs({0, 3, 4}),
                         {"training needs batch statistics"}));
  EXPECT_TRUE(fails_with(OpKind::batch_norm, BatchNormAttrs{.sync = true}, bn_inputs({2, 3, 4}),
                         {"sync (statistics over every rank's batch) needs the training form"}));
}

TEST(InferLayerNorm, OutputsAndStatisticsShape) {
  Inferred r = infer(OpKind::layer_norm, NormAttrs{}, {f32({2, 3, 4}), f32({4}), f32({4})});
  EXPECT_EQ(r.types, (std::vector<TensorType>{f32({2, 3, 4}), f32({2, 3, 1}), f32({2, 3, 1})}));
  EXPECT_EQ(r.attrs<NormAttrs>().axis, 2);
  r = infer(OpKind::layer_norm, NormAttrs{.axis = 1}, {f32({2, 3, 4}), f32({3, 4})});
  EXPECT_EQ(r.out(1), f32({2, 1, 1}));
  EXPECT_EQ(r.attrs<NormAttrs>().axis, 1);
  // Axis 0 normalises everything.
  EXPECT_EQ(infer(OpKind::layer_norm, NormAttrs{.axis = 0}, {f32({2, 3})}).out(2), f32({1, 1}));
}

TEST(InferLayerNorm, ScaleAndBiasBroadcastToNormalisedDims) {
  for (Shape s : {Shape{4}, Shape{1, 4}, Shape{3, 1}, Shape{}}) {
    EXPECT_EQ(
        infer(OpKind::layer_norm, NormAttrs{.axis = 1}, {f32({2, 3, 4}), f32(s), f32(s)}).out(),
        f32({2, 3, 4}));
  }
  // Scale absent, bias given.
  EXPECT_EQ(infer(OpKind::layer_norm, {}, {f32({2, 4}), std::nullopt, f32({4})}).out(),
            f32({2, 4}));
  EXPECT_TRUE(fails_with(OpKind::layer_norm, NormAttrs{.axis = 1}, {f32({2, 3, 4}), f32({3})},
                         {"scale [3] does not broadcast to the normalised dims [3, 4] of x [2, 3, "
                          "4] (axis 1)"}));
  EXPECT_TRUE(fails_with(OpKind::layer_norm, NormAttrs{.axis = 2},
                         {f32({2, 3, 4}), f32({4}), f32({1, 4})},
                         {"bias [1, 4] does not broadcast to the normalised dims [4]"}));
}

TEST(InferLayerNorm, StatisticsDtypeFollowsOnnxStashType) {
  Inferred r = infer(OpKind::layer_norm, {}, {typed(DType::f16, {2, 8}), typed(DType::f16, {8})});
  EXPECT_EQ(r.out(0), typed(DType::f16, {2, 8}));
  EXPECT_EQ(r.out(1), typed(DType::f32, {2, 1}));
  EXPECT_EQ(r.out(2), typed(DType::f32, {2, 1}));
  r = infer(OpKind::layer_norm, {}, {typed(DType::bf16, {2, 8})});
  EXPECT_EQ(r.out(1).dtype, DType::f32);
  r = infer(OpKind::layer_norm, {}, {typed(DType::f64, {2, 8})});
  EXPECT_EQ(r.out(1).dtype, DType::f64);
}

TEST(InferLayerNormErrors, Misc) {
  EXPECT_TRUE(fails_with(OpKind::layer_norm, NormAttrs{.axis = 3}, {f32({2, 3, 4})},
                         {"axis 3 is out of range for rank 3"}));
  EXPECT_TRUE(fails_with(OpKind::layer_norm, {}, {f32({2, 4}), typed(DType::f16, {4})},
                         {"input 1 (scale) is f16 but input 0 (x) is f32"}));
  EXPECT_TRUE(fails_with(OpKind::layer_norm, {}, {f32({})}, {"input 0 (x) must be"}));
  EXPECT_TRUE(fails_with(OpKind::layer_norm, {}, {f32({2, 0})}, {"hold no elements"}));
  EXPECT_TRUE(fails_with(OpKind::layer_norm, {}, {typed(DType::i32, {2, 4})},
                         {"needs a floating-point dtype"}));
}

TEST(InferRmsNorm, TwoOutputs) {
  Inferred r = infer(OpKind::rms_norm, NormAttrs{.axis = -2},
                     {typed(DType::bf16, {2, 3, 4}), typed(DType::bf16, {3, 4})});
  EXPECT_EQ(r.types,
            (std::vector<TensorType>{typed(DType::bf16, {2, 3, 4}), typed(DType::f32, {2, 1, 1})}));
  EXPECT_EQ(r.attrs<NormAttrs>().axis, 1);
  EXPECT_TRUE(fails_with(OpKind::rms_norm, {}, {f32({2, 4}), f32({4}), f32({4})},
                         {"takes 1 to 2 inputs (x, scale?) but got 3"}));
  EXPECT_TRUE(fails_with(OpKind::rms_norm, {}, {f32({2, 4}), f32({5})},
                         {"scale [5] does not broadcast to the normalised dims [4]"}));
}

TEST(InferCrossEntropy, LossAndLogProb) {
  Inferred r =
      infer(OpKind::cross_entropy, CrossEntropyAttrs{}, {f32({4, 10}), typed(DType::i64, {4})});
  EXPECT_EQ(r.types, (std::vector<TensorType>{f32({}), f32({4, 10})}));
  r = infer(
      OpKind::cross_entropy, CrossEntropyAttrs{.reduction = Reduction::none},
      {typed(DType::f16, {2, 5, 3, 3}), typed(DType::i32, {2, 3, 3}), typed(DType::f16, {5})});
  EXPECT_EQ(r.types, (std::vector<TensorType>{typed(DType::f16, {2, 3, 3}),
                                              typed(DType::f16, {2, 5, 3, 3})}));
  r = infer(OpKind::cross_entropy, {}, {f32({4, 10}), typed(DType::i64, {4})});
  EXPECT_EQ(r.attrs<CrossEntropyAttrs>().reduction, Reduction::mean);
}

TEST(InferCrossEntropyErrors, LabelsAndWeight) {
  EXPECT_TRUE(fails_with(OpKind::cross_entropy, {}, {f32({4, 10}), f32({4})},
                         {"input 1 (labels) is f32 but must be i64 or i32"}));
  EXPECT_TRUE(fails_with(OpKind::cross_entropy, {}, {f32({4, 10}), typed(DType::i64, {4, 1})},
                         {"input 1 (labels) is [4, 1] but must be [4] ([N, D...]: logits [4, "
                          "10] without dim 1)"}));
  EXPECT_TRUE(fails_with(OpKind::cross_entropy, {}, {f32({2, 5, 3}), typed(DType::i64, {2, 5})},
                         {"input 1 (labels) is [2, 5] but must be [2, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::cross_entropy, {},
                         {f32({4, 10}), typed(DType::i64, {4}), f32({9})},
                         {"input 2 (weight) is [9] but must be [10]"}));
  EXPECT_TRUE(fails_with(OpKind::cross_entropy, {}, {f32({10}), typed(DType::i64, {})},
                         {"input 0 (logits) must be [N, C, D...]"}));
  EXPECT_TRUE(fails_with(OpKind::cross_entropy, {}, {f32({4, 0}), typed(DType::i64, {4})},
                         {"logits [4, 0] has no classes"}));
}

}  // namespace
}  // namespace fusebox::ir_test
