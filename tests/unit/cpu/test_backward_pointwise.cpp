// unary_backward, binary_backward and expand: gradient checks in f64 against central
// differences of the forward op (gradient_check.h: h = 1e-6, rtol 1e-6, atol 1e-7),
// inputs kept away from kinks; the conventions at the kinks explicitly; and the
// f32 / f16 / bf16 kernels against the f64 one on the same (rounded) values.
#include <cmath>
#include <limits>

#include "gradient_check.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cpu::test {
namespace {

using namespace fusebox::testing;

struct UnaryCase {
  const char* name;
  OpKind op;
  Attrs forward;             // the forward op's attributes
  UnaryBackwardAttrs attrs;  // the same, for the backward op
  double lo, hi, gap;        // x uniform in [lo, hi), |x| >= gap
};

std::vector<UnaryCase> unary_cases() {
  constexpr double inf = std::numeric_limits<double>::infinity();
  return {
      {"relu", OpKind::relu, {}, {.op = OpKind::relu}, -2, 2, 0.05},
      {"leaky_relu",
       OpKind::leaky_relu,
       LeakyReluAttrs{0.2},
       {.op = OpKind::leaky_relu, .alpha = 0.2},
       -2,
       2,
       0.05},
      {"gelu", OpKind::gelu, GeluAttrs{false}, {.op = OpKind::gelu}, -3, 3, 0},
      {"gelu_tanh",
       OpKind::gelu,
       GeluAttrs{true},
       {.op = OpKind::gelu, .tanh_approximation = true},
       -3,
       3,
       0},
      {"silu", OpKind::silu, {}, {.op = OpKind::silu}, -4, 4, 0},
      {"sigmoid", OpKind::sigmoid, {}, {.op = OpKind::sigmoid}, -4, 4, 0},
      {"tanh", OpKind::tanh, {}, {.op = OpKind::tanh}, -2, 2, 0},
      {"exp", OpKind::exp, {}, {.op = OpKind::exp}, -2, 2, 0},
      {"log", OpKind::log, {}, {.op = OpKind::log}, 0.2, 3, 0},
      {"sqrt", OpKind::sqrt, {}, {.op = OpKind::sqrt}, 0.2, 3, 0},
      {"rsqrt", OpKind::rsqrt, {}, {.op = OpKind::rsqrt}, 0.2, 3, 0},
      {"reciprocal", OpKind::reciprocal, {}, {.op = OpKind::reciprocal}, -2, 2, 0.3},
      {"neg", OpKind::neg, {}, {.op = OpKind::neg}, -2, 2, 0},
      {"abs", OpKind::abs, {}, {.op = OpKind::abs}, -2, 2, 0.05},
      {"erf", OpKind::erf, {}, {.op = OpKind::erf}, -2, 2, 0},
      {"sin", OpKind::sin, {}, {.op = OpKind::sin}, -6, 6, 0},
      {"cos", OpKind::cos, {}, {.op = OpKind::cos}, -6, 6, 0},
      {"clip",
       OpKind::clip,
       ClipAttrs{-0.5, 0.7},
       {.op = OpKind::clip, .min = -0.5, .max = 0.7},
       -1.5,
       1.5,
       0},
      {"clip_below_only",
       OpKind::clip,
       ClipAttrs{-0.5, inf},
       {.op = OpKind::clip, .min = -0.5},
       -1.5,
       1.5,
       0},
  };
}

// x for a case: in range, |x| >= gap, and at least 0.01 away from clip's bounds.
Tensor unary_input(const UnaryCase& c, const Shape& shape, uint64_t seed) {
  Tensor x = away_from_zero(shape, seed, c.lo, c.hi, c.gap);
  for (int64_t i = 0; i < x.numel(); ++i) {
    for (double bound : {c.attrs.min, c.attrs.max}) {
      if (std::fabs(x.get(i) - bound) < 0.01) x.set(i, bound + 0.02);
    }
  }
  return x;
}

TEST(UnaryBackward, MatchesFiniteDifferencesOfEveryForwardOp) {
  uint64_t seed = 100;
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor x = unary_input(c, {3, 5}, ++seed);
    const Tensor dy = random_tensor(DType::f64, {3, 5}, ++seed);
    const Tensor dx = run_op(OpKind::unary_backward, c.attrs, {dy, x}).at(0);
    EXPECT_TRUE(matches_numeric(dx, c.op, c.forward, {x}, 0, dy));
  }
}

TEST(UnaryBackward, ConventionsAtTheKinks) {
  const Tensor x = Tensor::from_vector<double>({5}, {-1.0, 0.0, 1.0, -0.5, 0.7});
  const Tensor dy = Tensor::from_vector<double>({5}, {2.0, 3.0, 5.0, 7.0, 11.0});
  auto grad = [&](UnaryBackwardAttrs a) {
    return run_op(OpKind::unary_backward, a, {dy, x}).at(0).to_doubles();
  };
  // relu'(0) = 0, abs'(0) = 0, leaky_relu'(0) = alpha (PyTorch).
  EXPECT_EQ(grad({.op = OpKind::relu}), (std::vector<double>{0, 0, 5, 0, 11}));
  EXPECT_EQ(grad({.op = OpKind::abs}), (std::vector<double>{-2, 0, 5, -7, 11}));
  EXPECT_EQ(grad({.op = OpKind::leaky_relu, .alpha = 0.5}),
            (std::vector<double>{1, 1.5, 5, 3.5, 11}));
  // clip's bounds are inclusive: -0.5 and 0.7 pass, -1 and 1 do not.
  EXPECT_EQ(grad({.op = OpKind::clip, .min = -0.5, .max = 0.7}),
            (std::vector<double>{0, 3, 0, 7, 11}));
}

// The f32 / f16 / bf16 kernels compute in f32 and round once: the f64 kernel on the
// same rounded values, rounded, within a few ulps (more for f32, whose compute type
// has no spare precision: 1 - tanh^2 and the like cancel).
TEST(UnaryBackward, LowPrecisionDtypesFollowF64) {
  uint64_t seed = 300;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (const UnaryCase& c : unary_cases()) {
      SCOPED_TRACE(cat(c.name, " ", dtype_name(t)));
      const Tensor x = unary_input(c, {2, 7}, ++seed).cast(t);
      const Tensor dy = random_tensor(t, {2, 7}, ++seed);
      const Tensor got = run_op(OpKind::unary_backward, c.attrs, {dy, x}).at(0);
      const Tensor want =
          run_op(OpKind::unary_backward, c.attrs, {dy.cast(DType::f64), x.cast(DType::f64)}).at(0);
      EXPECT_TRUE(close_to(got, t, {2, 7}, want.to_doubles(), t == DType::f32 ? 20 : 2));
    }
  }
}

// ---- binary --------------------------------------------------------------------------

// Checks da and db (summed back to the operands' shapes) against the forward's numeric
// gradient with respect to a and b.
void check_binary(OpKind op, const Tensor& a, const Tensor& b, uint64_t seed, bool check_b = true) {
  Shape out;
  ASSERT_TRUE(broadcast_shapes(a.shape(), b.shape(), &out));
  const Tensor dy = random_tensor(DType::f64, out, seed);
  const std::vector<Tensor> grads =
      run_op(OpKind::binary_backward, BinaryBackwardAttrs{op}, {dy, a, b});
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads[0].shape(), out);
  EXPECT_EQ(grads[1].shape(), out);
  EXPECT_TRUE(matches_numeric(sum_to(grads[0], a.shape()), op, {}, {a, b}, 0, dy)) << "da";
  if (check_b) {
    EXPECT_TRUE(matches_numeric(sum_to(grads[1], b.shape()), op, {}, {a, b}, 1, dy)) << "db";
  }
}

TEST(BinaryBackward, DivWithBroadcasting) {
  check_binary(OpKind::div, random_tensor(DType::f64, {3, 1}, 1),
               away_from_zero({1, 4}, 2, -2, 2, 0.3), 3);
  check_binary(OpKind::div, random_tensor(DType::f64, {2, 3}, 4),
               away_from_zero({2, 3}, 5, -2, 2, 0.3), 6);
}

TEST(BinaryBackward, MaxMinAwayFromTies) {
  // a and b interleave on a grid of 0.02 with noise below 0.005: every pair differs by
  // more than 0.005.
  const Tensor a = distinct_values({3, 4}, 7, -1.0, 0.02);
  const Tensor b = distinct_values({4}, 8, -0.99, 0.02);
  const Tensor b_full = distinct_values({3, 4}, 9, -0.99, 0.02);
  for (OpKind op : {OpKind::max, OpKind::min}) {
    SCOPED_TRACE(op_name(op));
    check_binary(op, a, b, 10);
    check_binary(op, a, b_full, 11);
  }
}

TEST(BinaryBackward, MaxMinTiesGoToA) {
  const Tensor a = Tensor::from_vector<double>({4}, {1, 2, 3, NAN});
  const Tensor b = Tensor::from_vector<double>({4}, {1, 5, 0, 1});
  const Tensor dy = Tensor::from_vector<double>({4}, {10, 20, 30, 40});
  std::vector<Tensor> g =
      run_op(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::max}, {dy, a, b});
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{10, 0, 30, 40}));  // tie, NaN: a
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{0, 20, 0, 0}));
  g = run_op(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::min}, {dy, a, b});
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{10, 20, 0, 40}));
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{0, 0, 30, 0}));
}

TEST(BinaryBackward, Pow) {
  check_binary(OpKind::pow, random_tensor(DType::f64, {2, 3}, 12, 0.3, 2.0),
               random_tensor(DType::f64, {3}, 13, -2.0, 2.5), 14);
  // Scalar exponent broadcast over a.
  check_binary(OpKind::pow, random_tensor(DType::f64, {4}, 15, 0.3, 2.0),
               random_tensor(DType::f64, {}, 16, 0.5, 3.0), 17);
}

TEST(BinaryBackward, PowAtZeroBaseAndZeroExponent) {
  const Tensor a = Tensor::from_vector<double>({4}, {0, 0, 2, 0});
  const Tensor b = Tensor::from_vector<double>({4}, {2, 0, 0, 1});
  const Tensor dy = Tensor::from_vector<double>({4}, {1, 1, 1, 1});
  const std::vector<Tensor> g =
      run_op(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::pow}, {dy, a, b});
  // da = b a^(b-1): 0 at (0, 2); 0 where b == 0 (not 0 * 0^-1 = NaN); 1 at (0, 1).
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{0, 0, 0, 1}));
  // db = log(a) a^b: 0 where a == 0 and b >= 0; log(2) at (2, 0).
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{0, 0, std::log(2.0), 0}));
}

TEST(BinaryBackward, PowIntegerExponent) {
  const Tensor a = Tensor::from_vector<double>({3}, {1.5, -2.0, 0.5});
  const Tensor b = Tensor::from_vector<int64_t>({3}, {2, 3, -1});
  const Tensor dy = Tensor::from_vector<double>({3}, {1, 2, 3});
  const std::vector<Tensor> g =
      run_op(OpKind::binary_backward, BinaryBackwardAttrs{OpKind::pow}, {dy, a, b});
  EXPECT_TRUE(close_to(g[0], DType::f64, {3}, {2 * 1.5, 2 * 3 * 4.0, 3 * -1 / 0.25}));
  EXPECT_TRUE(std::isnan(g[1].get(1)));  // log of a negative base
  EXPECT_NEAR(g[1].get(0), std::log(1.5) * 2.25, 1e-12);
  // The gradient with respect to a is still the forward's.
  EXPECT_TRUE(matches_numeric(g[0], OpKind::pow, {}, {a, b}, 0, dy));
}

TEST(BinaryBackward, LowPrecisionDtypesFollowF64) {
  uint64_t seed = 500;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (OpKind op : {OpKind::div, OpKind::max, OpKind::min, OpKind::pow}) {
      SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t)));
      const Tensor a = random_tensor(t, {3, 4}, ++seed, 0.3, 2.0);
      const Tensor b = random_tensor(t, {4}, ++seed, 0.5, 2.0);
      const Tensor dy = random_tensor(t, {3, 4}, ++seed);
      const std::vector<Tensor> got =
          run_op(OpKind::binary_backward, BinaryBackwardAttrs{op}, {dy, a, b});
      const std::vector<Tensor> want =
          run_op(OpKind::binary_backward, BinaryBackwardAttrs{op},
                 {dy.cast(DType::f64), a.cast(DType::f64), b.cast(DType::f64)});
      for (size_t k = 0; k < 2; ++k)
        EXPECT_TRUE(close_to(got[k], t, {3, 4}, want[k].to_doubles(), 4)) << "output " << k;
    }
  }
}

// ---- expand --------------------------------------------------------------------------

TEST(Expand, BroadcastsValuesOfAnyDtype) {
  for (DType t : {DType::f64, DType::f32, DType::f16, DType::i64, DType::i32, DType::boolean}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = random_tensor(t, {3, 1}, 20, -5, 5);
    const Shape to = {2, 3, 4};
    const Tensor y = run_op(OpKind::expand, ExpandAttrs{to}, {x}).at(0);
    ASSERT_EQ(y.shape(), to);
    ASSERT_EQ(y.dtype(), t);
    for (int64_t i = 0; i < y.numel(); ++i)
      ASSERT_EQ(y.get(i), x.get(broadcast_index(unravel(i, to), x.shape()))) << "at " << i;
  }
  // A scalar, an unchanged shape and an empty result.
  EXPECT_EQ(run_op(OpKind::expand, ExpandAttrs{{3}}, {Tensor::scalar(DType::f32, 2.5)})
                .at(0)
                .to_doubles(),
            (std::vector<double>{2.5, 2.5, 2.5}));
  const Tensor x = random_tensor(DType::f32, {2, 3}, 21);
  EXPECT_TRUE(all_close(run_op(OpKind::expand, ExpandAttrs{{2, 3}}, {x}).at(0), x, 0, 0));
  const Tensor row = random_tensor(DType::f32, {1, 3}, 24);
  EXPECT_EQ(run_op(OpKind::expand, ExpandAttrs{{0, 3}}, {row}).at(0).shape(), (Shape{0, 3}));
}

// expand's gradient is the sum over the broadcast dims (what autodiff emits for it).
TEST(Expand, GradientIsTheSumOverBroadcastDims) {
  const Tensor x = random_tensor(DType::f64, {3, 1}, 22);
  const Tensor w = random_tensor(DType::f64, {2, 3, 4}, 23);
  EXPECT_TRUE(all_close(sum_to(w, {3, 1}),
                        numeric_gradient(OpKind::expand, ExpandAttrs{{2, 3, 4}}, {x}, 0, w),
                        kFdRtol, kFdAtol));
}

}  // namespace
}  // namespace fusebox::cpu::test
