// Shape inference and normalisation for reshape, flatten, transpose, concat, slice,
// pad, squeeze, unsqueeze, cast, constant and identity.
#include <cstdint>
#include <limits>

#include "infer_testing.h"

// Designated initialisers (ConvAttrs{.strides = ...}) leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// ---- reshape ----------------------------------------------------------------

TEST(InferReshape, ZeroCopiesAndMinusOneInfers) {
  Inferred r = infer(OpKind::reshape, ReshapeAttrs{{0, -1}}, {f32({2, 3, 4})});
  EXPECT_EQ(r.out(), f32({2, 12}));
  EXPECT_EQ(r.attrs<ReshapeAttrs>().shape, (Ints{2, 12}));
  EXPECT_TRUE(r.attrs<ReshapeAttrs>().allow_zero);  // the shape is literal from now on
  EXPECT_EQ(infer(OpKind::reshape, ReshapeAttrs{{-1}}, {f32({2, 3, 4})}).out(), f32({24}));
  EXPECT_EQ(infer(OpKind::reshape, ReshapeAttrs{{4, 0, 2}}, {f32({2, 3, 4})}).out(),
            f32({4, 3, 2}));
  // ONNX test_reshape_zero_and_negative_dim.
  EXPECT_EQ(infer(OpKind::reshape, ReshapeAttrs{{2, 0, 1, -1}}, {f32({2, 3, 4})}).out(),
            f32({2, 3, 1, 4}));
  EXPECT_EQ(infer(OpKind::reshape, ReshapeAttrs{{}}, {f32({1, 1})}).out(), f32({}));
}

TEST(InferReshape, AllowZeroKeepsZeros) {
  EXPECT_EQ(infer(OpKind::reshape, ReshapeAttrs{{0, 6}, true}, {f32({2, 0, 3})}).out(),
            f32({0, 6}));
  // Copying an empty dim, then re-inferring the literal result, stays [0, 6].
  EXPECT_EQ(infer(OpKind::reshape, ReshapeAttrs{{0, 6}, false}, {f32({0, 2, 3})}).out(),
            f32({0, 6}));
}

TEST(InferReshapeErrors, Shapes) {
  const std::vector<In> x = {f32({2, 3, 4})};
  EXPECT_TRUE(fails_with(OpKind::reshape, ReshapeAttrs{{-1, -1}}, x,
                         {"shape [-1, -1] has more than one -1"}));
  EXPECT_TRUE(fails_with(OpKind::reshape, ReshapeAttrs{{5, 5}}, x,
                         {"shape [5, 5] resolves to [5, 5] (25 elements) but x [2, 3, 4] has 24"}));
  EXPECT_TRUE(fails_with(OpKind::reshape, ReshapeAttrs{{5, -1}}, x,
                         {"shape [5, -1] does not fit x [2, 3, 4]: 24 elements are not a "
                          "multiple of 5"}));
  EXPECT_TRUE(fails_with(OpKind::reshape, ReshapeAttrs{{-2, 12}}, x,
                         {"shape [-2, 12] has extent -2 at index 0"}));
  EXPECT_TRUE(fails_with(OpKind::reshape, ReshapeAttrs{{0, 0}}, {f32({24})},
                         {"shape [0, 0] has 0 at index 1, which copies that dim of x [24], but x "
                          "has rank 1"}));
  EXPECT_TRUE(fails_with(OpKind::reshape, ReshapeAttrs{{0, -1}, true}, {f32({0, 3})},
                         {"holds both 0 (literal, allow_zero) and -1"}));
  EXPECT_TRUE(fails_with(OpKind::reshape, ReshapeAttrs{{0, -1}}, {f32({0, 3})},
                         {"the -1 cannot be inferred when the other extents multiply to 0"}));
  EXPECT_TRUE(fails_with(OpKind::reshape, ReshapeAttrs{{kMax, 4}}, x, {"overflows int64"}));
  EXPECT_TRUE(fails_with(OpKind::reshape, {}, x, {"needs ReshapeAttrs"}));
}

// ---- flatten, transpose -----------------------------------------------------

TEST(InferFlatten, Axes) {
  const std::vector<In> x = {f32({2, 3, 4, 5})};
  EXPECT_EQ(infer(OpKind::flatten, FlattenAttrs{2}, x).out(), f32({6, 20}));
  EXPECT_EQ(infer(OpKind::flatten, FlattenAttrs{0}, x).out(), f32({1, 120}));
  EXPECT_EQ(infer(OpKind::flatten, FlattenAttrs{4}, x).out(), f32({120, 1}));
  Inferred r = infer(OpKind::flatten, FlattenAttrs{-1}, x);
  EXPECT_EQ(r.out(), f32({24, 5}));
  EXPECT_EQ(r.attrs<FlattenAttrs>().axis, 3);
  EXPECT_EQ(infer(OpKind::flatten, {}, x).out(), f32({2, 60}));
  EXPECT_TRUE(fails_with(OpKind::flatten, FlattenAttrs{5}, x,
                         {"axis 5 is out of range for rank 4 (valid: -4 to 4)"}));
  EXPECT_TRUE(fails_with(OpKind::flatten, FlattenAttrs{-5}, x, {"axis -5 is out of range"}));
}

TEST(InferTranspose, PermSpeltOut) {
  Inferred r = infer(OpKind::transpose, TransposeAttrs{}, {f32({2, 3, 4})});
  EXPECT_EQ(r.out(), f32({4, 3, 2}));
  EXPECT_EQ(r.attrs<TransposeAttrs>().perm, (Ints{2, 1, 0}));
  EXPECT_EQ(infer(OpKind::transpose, TransposeAttrs{{0, 2, 1}}, {f32({2, 3, 4})}).out(),
            f32({2, 4, 3}));
  r = infer(OpKind::transpose, TransposeAttrs{{-1, 0, 1}}, {f32({2, 3, 4})});
  EXPECT_EQ(r.out(), f32({4, 2, 3}));
  EXPECT_EQ(r.attrs<TransposeAttrs>().perm, (Ints{2, 0, 1}));
  r = infer(OpKind::transpose, {}, {typed(DType::boolean, {})});
  EXPECT_EQ(r.out(), typed(DType::boolean, {}));
  EXPECT_TRUE(r.attrs<TransposeAttrs>().perm.empty());
}

TEST(InferTransposeErrors, NotAPermutation) {
  EXPECT_TRUE(fails_with(OpKind::transpose, TransposeAttrs{{0, 0, 1}}, {f32({2, 3, 4})},
                         {"perm [0, 0, 1] is not a permutation of the 3 dims of x [2, 3, 4]"}));
  EXPECT_TRUE(fails_with(OpKind::transpose, TransposeAttrs{{0, 3, 1}}, {f32({2, 3, 4})},
                         {"perm [0, 3, 1] is not a permutation"}));
  EXPECT_TRUE(fails_with(OpKind::transpose, TransposeAttrs{{1, 0}}, {f32({2, 3, 4})},
                         {"perm [1, 0] has 2 entries but x [2, 3, 4] has rank 3"}));
}

// ---- concat -----------------------------------------------------------------

TEST(InferConcat, SumsTheAxis) {
  Inferred r = infer(OpKind::concat, ConcatAttrs{-1}, {f32({2, 3}), f32({2, 5})});
  EXPECT_EQ(r.out(), f32({2, 8}));
  EXPECT_EQ(r.attrs<ConcatAttrs>().axis, 1);
  EXPECT_EQ(infer(OpKind::concat, ConcatAttrs{0}, {f32({1, 4}), f32({2, 4}), f32({0, 4})}).out(),
            f32({3, 4}));
  EXPECT_EQ(infer(OpKind::concat, ConcatAttrs{0}, {typed(DType::i64, {3})}).out(),
            typed(DType::i64, {3}));
  std::vector<In> many(100, f32({1, 2}));
  EXPECT_EQ(infer(OpKind::concat, ConcatAttrs{0}, many).out(), f32({100, 2}));
}

TEST(InferConcatErrors, Mismatches) {
  EXPECT_TRUE(fails_with(OpKind::concat, ConcatAttrs{1}, {f32({2, 3}), f32({3, 4})},
                         {"input 1 [3, 4] does not match input 0 [2, 3] outside axis 1"}));
  EXPECT_TRUE(fails_with(OpKind::concat, ConcatAttrs{1}, {f32({2, 3}), f32({2, 3, 1})},
                         {"input 1 [2, 3, 1] does not match input 0 [2, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::concat, ConcatAttrs{0}, {f32({2}), typed(DType::f16, {2})},
                         {"input 1 is f16 but input 0 is f32"}));
  EXPECT_TRUE(fails_with(OpKind::concat, ConcatAttrs{2}, {f32({2, 3}), f32({2, 3})},
                         {"axis 2 is out of range for rank 2"}));
  EXPECT_TRUE(fails_with(OpKind::concat, ConcatAttrs{0}, {}, {"takes at least 1 input but got 0"}));
  EXPECT_TRUE(fails_with(OpKind::concat, ConcatAttrs{0}, {f32({2}), std::nullopt},
                         {"input 1 is required but absent"}));
  EXPECT_TRUE(fails_with(OpKind::concat, ConcatAttrs{0}, {f32({})}, {"rank-0"}));
  EXPECT_TRUE(fails_with(OpKind::concat, {}, {f32({2})}, {"needs ConcatAttrs"}));
}

// ---- slice ------------------------------------------------------------------

TEST(InferSlice, OnnxBasics) {
  const std::vector<In> x = {f32({20, 10, 5})};
  EXPECT_EQ(infer(OpKind::slice, SliceAttrs{{0, 0}, {3, 10}, {0, 1}, {1, 1}}, x).out(),
            f32({3, 10, 5}));
  Inferred r = infer(OpKind::slice, SliceAttrs{{0, 0, 3}, {20, 10, 4}, {}, {}}, x);
  EXPECT_EQ(r.out(), f32({20, 10, 1}));
  EXPECT_EQ(r.attrs<SliceAttrs>().axes, (Ints{0, 1, 2}));
  EXPECT_EQ(r.attrs<SliceAttrs>().steps, (Ints{1, 1, 1}));
}

TEST(InferSlice, ClampsAndMakesAbsolute) {
  const std::vector<In> x = {f32({20, 10, 5})};
  Inferred r = infer(OpKind::slice, SliceAttrs{{1}, {1000}, {1}, {}}, x);
  EXPECT_EQ(r.out(), f32({20, 9, 5}));
  EXPECT_EQ(r.attrs<SliceAttrs>().ends, (Ints{10}));
  r = infer(OpKind::slice, SliceAttrs{{1000}, {1000}, {1}, {}}, x);
  EXPECT_EQ(r.out(), f32({20, 0, 5}));
  EXPECT_EQ(r.attrs<SliceAttrs>().starts, (Ints{10}));
  r = infer(OpKind::slice, SliceAttrs{{0}, {-1}, {1}, {}}, x);
  EXPECT_EQ(r.out(), f32({20, 9, 5}));
  EXPECT_EQ(r.attrs<SliceAttrs>().ends, (Ints{9}));
  r = infer(OpKind::slice, SliceAttrs{{-3}, {kMax}, {-1}, {}}, x);
  EXPECT_EQ(r.out(), f32({20, 10, 3}));
  EXPECT_EQ(r.attrs<SliceAttrs>().axes, (Ints{2}));
  EXPECT_EQ(r.attrs<SliceAttrs>().starts, (Ints{2}));
  EXPECT_EQ(r.attrs<SliceAttrs>().ends, (Ints{5}));
  r = infer(OpKind::slice, SliceAttrs{{kMin}, {-100}, {0}, {}}, x);  // both before 0
  EXPECT_EQ(r.out(), f32({0, 10, 5}));
  EXPECT_EQ(r.attrs<SliceAttrs>().starts, (Ints{0}));
  EXPECT_EQ(r.attrs<SliceAttrs>().ends, (Ints{0}));
  // Strided: 1, 4, 7.
  EXPECT_EQ(infer(OpKind::slice, SliceAttrs{{1}, {8}, {0}, {3}}, {f32({10})}).out(), f32({3}));
}

TEST(InferSlice, NegativeSteps) {
  // ONNX test_slice_neg_steps.
  Inferred r = infer(OpKind::slice, SliceAttrs{{20, 10, 4}, {0, 0, 1}, {0, 1, 2}, {-1, -3, -2}},
                     {f32({20, 10, 5})});
  EXPECT_EQ(r.out(), f32({19, 3, 2}));
  EXPECT_EQ(r.attrs<SliceAttrs>().starts, (Ints{19, 9, 4}));
  EXPECT_EQ(r.attrs<SliceAttrs>().ends, (Ints{0, 0, 1}));
}

TEST(InferSlice, FlipNormalisesEndToMinusOne) {
  // x[::-1]: end "before index 0" is -1, and re-inference (in infer()) keeps it.
  Inferred r = infer(OpKind::slice, SliceAttrs{{-1}, {kMin}, {0}, {-1}}, {f32({5})});
  EXPECT_EQ(r.out(), f32({5}));
  EXPECT_EQ(r.attrs<SliceAttrs>().starts, (Ints{4}));
  EXPECT_EQ(r.attrs<SliceAttrs>().ends, (Ints{-1}));
  // -6 counts from the end to -1 too; -5 stops before index 0 -> 4 elements.
  EXPECT_EQ(infer(OpKind::slice, SliceAttrs{{4}, {-6}, {0}, {-1}}, {f32({5})}).out(), f32({5}));
  EXPECT_EQ(infer(OpKind::slice, SliceAttrs{{4}, {-5}, {0}, {-1}}, {f32({5})}).out(), f32({4}));
  // An ONNX end of -1 with a negative step is dim - 1: empty. In the normalised form
  // (normalized = true) the same -1 means "before index 0".
  EXPECT_EQ(infer(OpKind::slice, SliceAttrs{{3}, {-1}, {0}, {-1}}, {f32({5})}).out(), f32({0}));
  EXPECT_EQ(infer(OpKind::slice, SliceAttrs{{3}, {-1}, {0}, {-1}, true}, {f32({5})}).out(),
            f32({4}));
  EXPECT_TRUE(r.attrs<SliceAttrs>().normalized);
  // Every other element backwards, |step| as large as it gets.
  EXPECT_EQ(infer(OpKind::slice, SliceAttrs{{kMax}, {kMin}, {0}, {-2}}, {f32({5})}).out(),
            f32({3}));
  EXPECT_EQ(infer(OpKind::slice, SliceAttrs{{4}, {kMin}, {0}, {kMin}}, {f32({5})}).out(), f32({1}));
}

TEST(InferSlice, EmptyAxis) {
  for (int64_t step : {1, -1}) {
    Inferred r = infer(OpKind::slice, SliceAttrs{{0}, {5}, {0}, {step}}, {f32({0, 3})});
    EXPECT_EQ(r.out(), f32({0, 3}));
    EXPECT_EQ(r.attrs<SliceAttrs>().starts, (Ints{0}));
    EXPECT_EQ(r.attrs<SliceAttrs>().ends, (Ints{0}));
  }
}

TEST(InferSliceErrors, Attrs) {
  const std::vector<In> x = {f32({20, 10, 5})};
  EXPECT_TRUE(fails_with(OpKind::slice, SliceAttrs{{0}, {3}, {0}, {0}}, x,
                         {"steps [0] has a 0 at index 0"}));
  EXPECT_TRUE(fails_with(OpKind::slice, SliceAttrs{{0, 0}, {3}, {}, {}}, x,
                         {"starts [0, 0] and ends [3] must have the same length"}));
  EXPECT_TRUE(fails_with(OpKind::slice, SliceAttrs{{0, 0}, {3, 3}, {0}, {}}, x,
                         {"axes [0] must have one entry per start (2)"}));
  EXPECT_TRUE(fails_with(OpKind::slice, SliceAttrs{{0}, {3}, {}, {1, 1}}, x,
                         {"steps [1, 1] must have one entry per start (1)"}));
  EXPECT_TRUE(fails_with(OpKind::slice, SliceAttrs{{0, 0}, {3, 3}, {1, -2}, {}}, x,
                         {"axes [1, -2] names axis 1 twice"}));
  EXPECT_TRUE(fails_with(OpKind::slice, SliceAttrs{{0}, {3}, {3}, {}}, x,
                         {"axes[0] 3 is out of range for rank 3"}));
}

// ---- pad --------------------------------------------------------------------

TEST(InferPad, GrowsAndCrops) {
  EXPECT_EQ(infer(OpKind::pad, PadAttrs{{1, 2, 3, 4}}, {f32({2, 3})}).out(), f32({6, 9}));
  EXPECT_EQ(infer(OpKind::pad, PadAttrs{{-1, 0, 0, -1}}, {f32({3, 4})}).out(), f32({2, 3}));
  EXPECT_EQ(infer(OpKind::pad, PadAttrs{{-3, 0, 0, 0}}, {f32({3, 4})}).out(), f32({0, 4}));
  // ONNX test_reflect_pad.
  PadAttrs reflect{{0, 0, 1, 1, 0, 0, 1, 1}, PadMode::reflect};
  EXPECT_EQ(infer(OpKind::pad, reflect, {f32({1, 3, 4, 5})}).out(), f32({1, 3, 6, 7}));
  EXPECT_EQ(infer(OpKind::pad, PadAttrs{{2, 0, 2, 0}, PadMode::reflect}, {f32({3, 4})}).out(),
            f32({7, 4}));
  EXPECT_EQ(infer(OpKind::pad, PadAttrs{{1, 1}, PadMode::edge}, {typed(DType::i32, {1})}).out(),
            typed(DType::i32, {3}));
  EXPECT_EQ(infer(OpKind::pad, PadAttrs{{}}, {f32({})}).out(), f32({}));
}

TEST(InferPadErrors, Extents) {
  EXPECT_TRUE(fails_with(OpKind::pad, PadAttrs{{-2, 0, -2, 0}}, {f32({3, 4})},
                         {"pads [-2, 0, -2, 0] crop dim 0 of x [3, 4] to a negative extent -1"}));
  EXPECT_TRUE(fails_with(OpKind::pad, PadAttrs{{1, 1}}, {f32({3, 4})},
                         {"pads [1, 1] has 2 values but x [3, 4] needs 2 * rank = 4"}));
  EXPECT_TRUE(
      fails_with(OpKind::pad, PadAttrs{{3, 0, 0, 0}, PadMode::reflect}, {f32({3, 4})},
                 {"reflect pads [3, 0, 0, 0] exceed dim 0 of x [3, 4]: at most 2 per side"}));
  EXPECT_TRUE(fails_with(OpKind::pad, PadAttrs{{0, 0, 0, 4}, PadMode::reflect}, {f32({3, 4})},
                         {"exceed dim 1"}));
  EXPECT_TRUE(fails_with(OpKind::pad, PadAttrs{{1, 0}, PadMode::reflect}, {f32({1})},
                         {"at most 0 per side"}));
  EXPECT_TRUE(fails_with(OpKind::pad, PadAttrs{{1, 0, 0, 0}, PadMode::edge}, {f32({0, 4})},
                         {"edge pads [1, 0, 0, 0] extend dim 0 of x [0, 4], which is empty"}));
  EXPECT_TRUE(fails_with(OpKind::pad, PadAttrs{{1, 1}, PadMode::constant, 0.5},
                         {typed(DType::i64, {3})}, {"value 0.5 cannot be stored in i64"}));
}

// ---- squeeze, unsqueeze -----------------------------------------------------

TEST(InferSqueeze, AxesExplicitAndSorted) {
  Inferred r = infer(OpKind::squeeze, AxesAttrs{}, {f32({1, 3, 1, 5})});
  EXPECT_EQ(r.out(), f32({3, 5}));
  EXPECT_EQ(r.attrs<AxesAttrs>().axes, (Ints{0, 2}));
  r = infer(OpKind::squeeze, AxesAttrs{{-2}}, {f32({1, 3, 1, 5})});
  EXPECT_EQ(r.out(), f32({1, 3, 5}));
  EXPECT_EQ(r.attrs<AxesAttrs>().axes, (Ints{2}));
  r = infer(OpKind::squeeze, AxesAttrs{{2, 0}}, {f32({1, 3, 1, 5})});
  EXPECT_EQ(r.attrs<AxesAttrs>().axes, (Ints{0, 2}));
  r = infer(OpKind::squeeze, {}, {f32({1, 1})});
  EXPECT_EQ(r.out(), f32({}));
  EXPECT_EQ(infer(OpKind::squeeze, {}, {f32({2, 3})}).out(), f32({2, 3}));
}

TEST(InferSqueezeErrors, ExtentNotOne) {
  EXPECT_TRUE(
      fails_with(OpKind::squeeze, AxesAttrs{{1}}, {f32({1, 3, 1, 5})},
                 {"axis 1 of x [1, 3, 1, 5] has extent 3, not 1, so it cannot be squeezed"}));
  EXPECT_TRUE(
      fails_with(OpKind::squeeze, AxesAttrs{{0, -4}}, {f32({1, 3, 1, 5})}, {"names axis 0 twice"}));
  EXPECT_TRUE(fails_with(OpKind::squeeze, AxesAttrs{{4}}, {f32({1, 3, 1, 5})},
                         {"axes[0] 4 is out of range for rank 4"}));
}

TEST(InferUnsqueeze, AxesIndexTheOutput) {
  EXPECT_EQ(infer(OpKind::unsqueeze, AxesAttrs{{0}}, {f32({3, 4})}).out(), f32({1, 3, 4}));
  Inferred r = infer(OpKind::unsqueeze, AxesAttrs{{-1}}, {f32({3, 4})});
  EXPECT_EQ(r.out(), f32({3, 4, 1}));
  EXPECT_EQ(r.attrs<AxesAttrs>().axes, (Ints{2}));
  r = infer(OpKind::unsqueeze, AxesAttrs{{2, 0}}, {f32({3, 4})});
  EXPECT_EQ(r.out(), f32({1, 3, 1, 4}));
  EXPECT_EQ(r.attrs<AxesAttrs>().axes, (Ints{0, 2}));
  // ONNX test_unsqueeze_unsorted_axes.
  EXPECT_EQ(infer(OpKind::unsqueeze, AxesAttrs{{5, 4, 2}}, {f32({3, 4, 5})}).out(),
            f32({3, 4, 1, 5, 1, 1}));
  EXPECT_EQ(infer(OpKind::unsqueeze, AxesAttrs{{0}}, {f32({})}).out(), f32({1}));
}

TEST(InferUnsqueezeErrors, Axes) {
  EXPECT_TRUE(fails_with(OpKind::unsqueeze, AxesAttrs{}, {f32({3, 4})},
                         {"axes must list at least one new dim"}));
  EXPECT_TRUE(fails_with(OpKind::unsqueeze, AxesAttrs{{3}}, {f32({3, 4})},
                         {"axes[0] 3 is out of range for rank 3"}));
  EXPECT_TRUE(
      fails_with(OpKind::unsqueeze, AxesAttrs{{2, -2}}, {f32({3, 4})}, {"names axis 2 twice"}));
  EXPECT_TRUE(fails_with(OpKind::unsqueeze, {}, {f32({3, 4})}, {"needs AxesAttrs"}));
}

// ---- cast, constant, identity -------------------------------------------------

TEST(InferCast, AnyToAny) {
  EXPECT_EQ(infer(OpKind::cast, CastAttrs{DType::i64}, {f32({2, 3})}).out(),
            typed(DType::i64, {2, 3}));
  EXPECT_EQ(infer(OpKind::cast, CastAttrs{DType::f16}, {typed(DType::boolean, {4})}).out(),
            typed(DType::f16, {4}));
  EXPECT_TRUE(fails_with(OpKind::cast, {}, {f32({2})}, {"needs CastAttrs"}));
}

TEST(InferConstant, TypeOfTheValue) {
  Tensor v = Tensor::zeros(DType::i32, {2, 2});
  EXPECT_EQ(infer(OpKind::constant, ConstantAttrs{v}, {}).out(), typed(DType::i32, {2, 2}));
  EXPECT_TRUE(
      fails_with(OpKind::constant, ConstantAttrs{v}, {f32({1})}, {"takes no inputs but got 1"}));
  EXPECT_TRUE(fails_with(OpKind::constant, ConstantAttrs{}, {}, {"value holds no tensor"}));
}

TEST(InferIdentity, AnyDtype) {
  EXPECT_EQ(infer(OpKind::identity, {}, {typed(DType::boolean, {3})}).out(),
            typed(DType::boolean, {3}));
}

}  // namespace
}  // namespace fusebox::ir_test
