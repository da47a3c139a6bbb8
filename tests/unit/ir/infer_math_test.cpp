// Shape inference for pointwise, binary, matmul, gemm, reductions and softmax.
#include <cmath>
#include <cstdint>
#include <limits>

#include "infer_testing.h"

// Designated initialisers (ConvAttrs{.strides = ...}) leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(InferUnary, EveryFloatOpKeepsType) {
  for (OpKind op : {OpKind::relu, OpKind::silu, OpKind::sigmoid, OpKind::tanh, OpKind::exp,
                    OpKind::log, OpKind::sqrt, OpKind::rsqrt, OpKind::reciprocal, OpKind::neg,
                    OpKind::abs, OpKind::erf, OpKind::sin, OpKind::cos}) {
    SCOPED_TRACE(op_name(op));
    EXPECT_EQ(infer(op, {}, {typed(DType::bf16, {2, 3})}).out(), typed(DType::bf16, {2, 3}));
  }
  EXPECT_EQ(infer(OpKind::leaky_relu, LeakyReluAttrs{0.2}, {f32({4})}).out(), f32({4}));
  EXPECT_EQ(infer(OpKind::gelu, GeluAttrs{true}, {f32({})}).out(), f32({}));
  EXPECT_EQ(infer(OpKind::clip, ClipAttrs{-1, 1}, {f32({2, 0})}).out(), f32({2, 0}));
}

TEST(InferUnary, DefaultableAttrsAcceptMonostate) {
  Inferred r = infer(OpKind::leaky_relu, {}, {f32({3})});
  EXPECT_DOUBLE_EQ(r.attrs<LeakyReluAttrs>().alpha, 0.01);
  EXPECT_FALSE(infer(OpKind::gelu, {}, {f32({3})}).attrs<GeluAttrs>().tanh_approximation);
  EXPECT_EQ(infer(OpKind::clip, {}, {f32({3})}).attrs<ClipAttrs>().max, kInf);
}

TEST(InferUnary, IntegerInputsWhereMeaningful) {
  for (OpKind op : {OpKind::relu, OpKind::neg, OpKind::abs, OpKind::clip}) {
    SCOPED_TRACE(op_name(op));
    EXPECT_EQ(infer(op, {}, {typed(DType::i32, {5})}).out(), typed(DType::i32, {5}));
  }
  EXPECT_TRUE(fails_with(OpKind::sigmoid, {}, {typed(DType::i32, {5})},
                         {"input 0 (x) is i32 but sigmoid needs a floating-point dtype"}));
  EXPECT_TRUE(fails_with(OpKind::abs, {}, {typed(DType::boolean, {5})},
                         {"input 0 (x) is bool but abs needs a numeric dtype"}));
}

TEST(InferUnaryErrors, AttrsAndArity) {
  EXPECT_TRUE(
      fails_with(OpKind::clip, ClipAttrs{2, 1}, {f32({3})}, {"min 2 is greater than max 1"}));
  EXPECT_TRUE(
      fails_with(OpKind::clip, ClipAttrs{std::nan(""), 1}, {f32({3})}, {"must not be NaN"}));
  EXPECT_TRUE(fails_with(OpKind::leaky_relu, LeakyReluAttrs{kInf}, {f32({3})},
                         {"alpha inf must be finite"}));
  EXPECT_TRUE(fails_with(OpKind::relu, ClipAttrs{}, {f32({3})},
                         {"takes no attributes but the node holds ClipAttrs"}));
  EXPECT_TRUE(fails_with(OpKind::relu, {}, {f32({3}), f32({3})}, {"takes 1 input (x) but got 2"}));
  EXPECT_TRUE(fails_with(OpKind::exp, {}, {std::nullopt}, {"input 0 (x) is required but absent"}));
}

// ---- binary -----------------------------------------------------------------

TEST(InferBinary, NumpyBroadcasting) {
  EXPECT_EQ(infer(OpKind::add, {}, {f32({2, 3, 4}), f32({3, 1})}).out(), f32({2, 3, 4}));
  EXPECT_EQ(infer(OpKind::mul, {}, {f32({}), f32({5})}).out(), f32({5}));
  EXPECT_EQ(infer(OpKind::sub, {}, {f32({4, 1}), f32({1, 6})}).out(), f32({4, 6}));
  EXPECT_EQ(infer(OpKind::div, {}, {f32({0, 3}), f32({1, 3})}).out(), f32({0, 3}));
  EXPECT_EQ(infer(OpKind::max, {}, {typed(DType::i64, {2}), typed(DType::i64, {2})}).out(),
            typed(DType::i64, {2}));
  EXPECT_EQ(infer(OpKind::min, {}, {f32({1}), f32({})}).out(), f32({1}));
}

TEST(InferBinary, PowExponentMayHaveAnotherDtype) {
  EXPECT_EQ(infer(OpKind::pow, {}, {f32({2, 3}), typed(DType::i64, {})}).out(), f32({2, 3}));
  EXPECT_EQ(infer(OpKind::pow, {}, {typed(DType::i32, {3}), f32({3})}).out(),
            typed(DType::i32, {3}));
  EXPECT_TRUE(fails_with(OpKind::pow, {}, {f32({3}), typed(DType::boolean, {3})},
                         {"input 1 (exponent) is bool but pow needs a numeric dtype"}));
}

TEST(InferBinaryErrors, BroadcastAndDtypes) {
  EXPECT_TRUE(fails_with(OpKind::add, {}, {f32({2, 3}), f32({4})},
                         {"a [2, 3] and b [4] do not broadcast (dim -1: 3 vs 4)"}));
  EXPECT_TRUE(fails_with(OpKind::mul, {}, {f32({5, 2, 3}), f32({4, 1, 3})},
                         {"a [5, 2, 3] and b [4, 1, 3] do not broadcast (dim -3: 5 vs 4)"}));
  EXPECT_TRUE(fails_with(OpKind::add, {}, {f32({3}), typed(DType::f16, {3})},
                         {"input 1 (b) is f16 but input 0 (a) is f32: they must match"}));
  EXPECT_TRUE(fails_with(OpKind::add, {}, {typed(DType::boolean, {3}), typed(DType::boolean, {3})},
                         {"input 0 (a) is bool"}));
  EXPECT_TRUE(fails_with(OpKind::add, {}, {f32({3}), f32({3}), f32({3})},
                         {"takes 2 inputs (a, b) but got 3"}));
}

// ---- matmul -----------------------------------------------------------------

TEST(InferMatmul, NumpyRules) {
  EXPECT_EQ(infer(OpKind::matmul, {}, {f32({2, 3}), f32({3, 4})}).out(), f32({2, 4}));
  EXPECT_EQ(infer(OpKind::matmul, {}, {f32({3}), f32({3})}).out(), f32({}));
  EXPECT_EQ(infer(OpKind::matmul, {}, {f32({3}), f32({3, 4})}).out(), f32({4}));
  EXPECT_EQ(infer(OpKind::matmul, {}, {f32({2, 3}), f32({3})}).out(), f32({2}));
  EXPECT_EQ(infer(OpKind::matmul, {}, {f32({3}), f32({2, 3, 4})}).out(), f32({2, 4}));
  EXPECT_EQ(infer(OpKind::matmul, {}, {f32({2, 3, 4}), f32({4})}).out(), f32({2, 3}));
  EXPECT_EQ(infer(OpKind::matmul, {}, {f32({5, 1, 2, 3}), f32({4, 3, 6})}).out(),
            f32({5, 4, 2, 6}));
  EXPECT_EQ(infer(OpKind::matmul, {}, {f32({7, 2, 3}), f32({3, 6})}).out(), f32({7, 2, 6}));
}

TEST(InferMatmulErrors, Mismatches) {
  EXPECT_TRUE(fails_with(OpKind::matmul, {}, {f32({2, 3}), f32({4, 5})},
                         {"a [2, 3] and b [4, 5] do not multiply: a has 3 columns (K) but b "
                          "has 4 rows"}));
  EXPECT_TRUE(fails_with(OpKind::matmul, {}, {f32({3}), f32({4})}, {"a has 3 columns"}));
  EXPECT_TRUE(fails_with(OpKind::matmul, {}, {f32({2, 2, 3}), f32({3, 3, 4})},
                         {"the batch dims of a [2, 2, 3] and b [3, 3, 4] do not broadcast"}));
  EXPECT_TRUE(fails_with(OpKind::matmul, {}, {f32({}), f32({3})}, {"rank >= 1", "a []"}));
  EXPECT_TRUE(fails_with(OpKind::matmul, {}, {typed(DType::i32, {2, 2}), typed(DType::i32, {2, 2})},
                         {"needs a floating-point dtype"}));
}

// ---- gemm -------------------------------------------------------------------

TEST(InferGemm, Transposes) {
  const std::vector<std::pair<GemmAttrs, std::vector<In>>> cases = {
      {GemmAttrs{}, {f32({3, 4}), f32({4, 5})}},
      {GemmAttrs{.trans_a = true}, {f32({4, 3}), f32({4, 5})}},
      {GemmAttrs{.trans_b = true}, {f32({3, 4}), f32({5, 4})}},
      {GemmAttrs{.trans_a = true, .trans_b = true}, {f32({4, 3}), f32({5, 4})}},
  };
  for (const auto& [attrs, in] : cases)
    EXPECT_EQ(infer(OpKind::gemm, attrs, in).out(), f32({3, 5}));
}

TEST(InferGemm, BiasBroadcastsToMN) {
  for (Shape c : {Shape{5}, Shape{3, 1}, Shape{}, Shape{3, 5}, Shape{1, 5}}) {
    EXPECT_EQ(infer(OpKind::gemm, {}, {f32({3, 4}), f32({4, 5}), f32(c)}).out(), f32({3, 5}));
  }
  EXPECT_TRUE(fails_with(OpKind::gemm, {}, {f32({3, 4}), f32({4, 5}), f32({4, 5})},
                         {"c [4, 5] does not broadcast to [M, N] = [3, 5]"}));
  EXPECT_TRUE(fails_with(OpKind::gemm, {}, {f32({3, 4}), f32({4, 5}), f32({2, 3, 5})},
                         {"c [2, 3, 5] does not broadcast"}));
}

TEST(InferGemmErrors, KAndRanks) {
  EXPECT_TRUE(
      fails_with(OpKind::gemm, {}, {f32({3, 4}), f32({5, 6})},
                 {"a [3, 4] (trans_a 0) gives K = 4 but b [5, 6] (trans_b 0) gives K = 5"}));
  EXPECT_TRUE(fails_with(OpKind::gemm, GemmAttrs{.trans_b = true}, {f32({3, 4}), f32({4, 5})},
                         {"(trans_b 1) gives K = 5"}));
  EXPECT_TRUE(fails_with(OpKind::gemm, {}, {f32({2, 3, 4}), f32({4, 5})},
                         {"input 0 (a) must be [M, K] (rank 2) but is [2, 3, 4]"}));
  EXPECT_TRUE(fails_with(OpKind::gemm, GemmAttrs{.trans_b = true}, {f32({3, 4}), f32({4})},
                         {"input 1 (b) must be [N, K] (trans_b)"}));
}

// ---- reductions -------------------------------------------------------------

TEST(InferReduce, AxesNormalisedAndSorted) {
  Inferred r = infer(OpKind::reduce_sum, ReduceAttrs{{-1}, true}, {f32({2, 3, 4})});
  EXPECT_EQ(r.out(), f32({2, 3, 1}));
  EXPECT_EQ(r.attrs<ReduceAttrs>().axes, (Ints{2}));
  r = infer(OpKind::reduce_mean, ReduceAttrs{{2, 0}, false}, {f32({2, 3, 4})});
  EXPECT_EQ(r.out(), f32({3}));
  EXPECT_EQ(r.attrs<ReduceAttrs>().axes, (Ints{0, 2}));
}

TEST(InferReduce, EmptyAxesMeanEveryDim) {
  Inferred r = infer(OpKind::reduce_max, ReduceAttrs{{}, true}, {f32({2, 3, 4})});
  EXPECT_EQ(r.out(), f32({1, 1, 1}));
  EXPECT_EQ(r.attrs<ReduceAttrs>().axes, (Ints{0, 1, 2}));
  EXPECT_EQ(infer(OpKind::reduce_sum, ReduceAttrs{{}, false}, {f32({2, 3})}).out(), f32({}));
  // Monostate: all defaults (every dim, keepdims).
  r = infer(OpKind::reduce_sum, {}, {typed(DType::i64, {2, 3})});
  EXPECT_EQ(r.out(), typed(DType::i64, {1, 1}));
  EXPECT_EQ(r.attrs<ReduceAttrs>().axes, (Ints{0, 1}));
  // A scalar reduces over nothing.
  EXPECT_EQ(infer(OpKind::reduce_sum, {}, {f32({})}).out(), f32({}));
}

TEST(InferReduceErrors, Axes) {
  EXPECT_TRUE(fails_with(OpKind::reduce_sum, ReduceAttrs{{1, -2}, true}, {f32({2, 3, 4})},
                         {"axes [1, -2] names axis 1 twice"}));
  EXPECT_TRUE(fails_with(OpKind::reduce_sum, ReduceAttrs{{3}, true}, {f32({2, 3, 4})},
                         {"axes[0] 3 is out of range for rank 3 (valid: -3 to 2)"}));
  EXPECT_TRUE(fails_with(OpKind::reduce_mean, ReduceAttrs{}, {typed(DType::i32, {2})},
                         {"needs a floating-point dtype"}));
  // An empty reduced axis gives the identity (test_op_empty.cpp checks the values).
  for (OpKind op : {OpKind::reduce_sum, OpKind::reduce_mean, OpKind::reduce_max})
    EXPECT_EQ(infer(op, ReduceAttrs{{1}, true}, {f32({2, 0})}).out(), f32({2, 1})) << op_name(op);
}

TEST(InferSoftmax, AxisNormalised) {
  Inferred r = infer(OpKind::softmax, SoftmaxAttrs{-1}, {f32({2, 3})});
  EXPECT_EQ(r.out(), f32({2, 3}));
  EXPECT_EQ(r.attrs<SoftmaxAttrs>().axis, 1);
  r = infer(OpKind::log_softmax, {}, {typed(DType::f16, {4, 5, 6})});
  EXPECT_EQ(r.out(), typed(DType::f16, {4, 5, 6}));
  EXPECT_EQ(r.attrs<SoftmaxAttrs>().axis, 2);
  EXPECT_TRUE(fails_with(OpKind::softmax, SoftmaxAttrs{2}, {f32({2, 3})},
                         {"axis 2 is out of range for rank 2 (valid: -2 to 1)"}));
  EXPECT_TRUE(fails_with(OpKind::log_softmax, {}, {f32({})}, {"out of range for rank 0"}));
  EXPECT_TRUE(fails_with(OpKind::softmax, {}, {typed(DType::i64, {3})},
                         {"input 0 (x) is i64 but softmax needs a floating-point dtype"}));
}

// ---- attention ---------------------------------------------------------------

TEST(InferAttention, BiasBroadcastsToTheScores) {
  const AttentionAttrs a{0.5, false, true};
  for (const Shape& bias : {Shape{2, 3, 4, 6}, Shape{2, 1, 1, 6}, Shape{4, 1}, Shape{}}) {
    SCOPED_TRACE(shape_str(bias));
    const Inferred r = infer(OpKind::attention, a,
                             {f32({2, 3, 4, 8}), f32({2, 3, 6, 8}), f32({2, 3, 6, 5}), f32(bias)});
    ASSERT_EQ(r.types.size(), 2u);
    EXPECT_EQ(r.types[0].shape, (Shape{2, 3, 4, 5}));
  }
}

TEST(InferAttentionErrors, Bias) {
  const In q = f32({2, 3, 4, 8}), k = f32({2, 3, 6, 8}), v = f32({2, 3, 6, 5});
  EXPECT_TRUE(fails_with(OpKind::attention, AttentionAttrs{}, {q, k, v, f32({4, 5})},
                         {"bias", "[4, 5] does not broadcast to the scores [2, 3, 4, 6]"}));
  EXPECT_TRUE(fails_with(OpKind::attention, AttentionAttrs{}, {q, k, v, f32({1, 2, 3, 4, 6})},
                         {"does not broadcast to the scores"}));
  EXPECT_TRUE(fails_with(OpKind::attention, AttentionAttrs{}, {q, k, v, typed(DType::boolean, {6})},
                         {"bias", "floating-point"}));
  EXPECT_TRUE(fails_with(OpKind::attention, AttentionAttrs{1.0, false, false, true}, {q, k, v},
                         {"bias_grad is attention_backward's attribute"}));
  // attention_backward: dbias needs a bias.
  EXPECT_TRUE(fails_with(
      OpKind::attention_backward, AttentionAttrs{1.0, false, true, true},
      {f32({2, 4, 5}), f32({2, 4, 8}), f32({2, 6, 8}), f32({2, 6, 5}), f32({2, 4, 5}), f32({2, 4})},
      {"bias_grad without a bias input"}));
}

}  // namespace
}  // namespace fusebox::ir_test
