// Pointwise ops on the CPU backend against closed forms evaluated in f64.
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>

#include "ops_test_util.h"

namespace fusebox::testing {
namespace {

struct UnaryCase {
  OpKind op;
  Attrs attrs;
  double lo, hi;  // input range
  std::function<double(double)> ref;
};

double sigmoid_ref(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

std::vector<UnaryCase> unary_cases() {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return {
      {OpKind::relu, {}, -3, 3, [](double x) { return x > 0 ? x : 0.0; }},
      {OpKind::leaky_relu, LeakyReluAttrs{0.2}, -3, 3,
       [](double x) { return x > 0 ? x : 0.2 * x; }},
      {OpKind::gelu, GeluAttrs{false}, -4, 4,
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {OpKind::gelu, GeluAttrs{true}, -4, 4,
       [k](double x) { return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x))); }},
      {OpKind::silu, {}, -6, 6, [](double x) { return x * sigmoid_ref(x); }},
      {OpKind::sigmoid, {}, -6, 6, sigmoid_ref},
      {OpKind::tanh, {}, -3, 3, [](double x) { return std::tanh(x); }},
      {OpKind::exp, {}, -5, 5, [](double x) { return std::exp(x); }},
      {OpKind::log, {}, 0.01, 10, [](double x) { return std::log(x); }},
      {OpKind::sqrt, {}, 0, 10, [](double x) { return std::sqrt(x); }},
      {OpKind::rsqrt, {}, 0.01, 10, [](double x) { return 1 / std::sqrt(x); }},
      {OpKind::reciprocal, {}, 0.1, 10, [](double x) { return 1 / x; }},
      {OpKind::neg, {}, -3, 3, [](double x) { return -x; }},
      {OpKind::abs, {}, -3, 3, [](double x) { return std::fabs(x); }},
      {OpKind::erf, {}, -3, 3, [](double x) { return std::erf(x); }},
      {OpKind::sin, {}, -6, 6, [](double x) { return std::sin(x); }},
      {OpKind::cos, {}, -6, 6, [](double x) { return std::cos(x); }},
      {OpKind::floor, {}, -3, 3, [](double x) { return std::floor(x); }},
      {OpKind::ceil, {}, -3, 3, [](double x) { return std::ceil(x); }},
      {OpKind::round, {}, -3, 3, [](double x) { return std::nearbyint(x); }},
      {OpKind::clip, ClipAttrs{-0.5, 0.75}, -2, 2,
       [](double x) { return std::min(std::max(x, -0.5), 0.75); }},
      {OpKind::identity, {}, -3, 3, [](double x) { return x; }},
  };
}

TEST(CpuUnary, MatchesClosedFormsForEveryFloatType) {
  uint64_t seed = 1;
  for (const UnaryCase& c : unary_cases()) {
    for (DType t : kFloatTypes) {
      SCOPED_TRACE(cat(op_name(c.op), " ", dtype_name(t)));
      const Shape shape = {3, 5, 7};
      Tensor x = random_tensor(t, shape, seed++, c.lo, c.hi);
      std::vector<double> want;
      for (double v : x.to_doubles()) want.push_back(c.ref(v));
      std::vector<Tensor> y = run_op(c.op, c.attrs, {x});
      ASSERT_EQ(y.size(), 1u);
      EXPECT_TRUE(close_to(y[0], t, shape, want));
    }
  }
}

TEST(CpuUnary, LargeTensorSplitAcrossThreads) {
  const Shape shape = {301, 257};
  Tensor x = random_tensor(DType::f32, shape, 7, -8, 8);
  std::vector<double> want;
  for (double v : x.to_doubles()) want.push_back(sigmoid_ref(v));
  EXPECT_TRUE(close_to(run_op(OpKind::sigmoid, {}, {x})[0], DType::f32, shape, want));
}

TEST(CpuUnary, SigmoidAndSiluSaturateWithoutNaN) {
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(dtype_label(t));
    Tensor x = Tensor::from_doubles(t, {4}, {-1000, -100, 100, 1000});
    EXPECT_TRUE(close_to(run_op(OpKind::sigmoid, {}, {x})[0], t, {4}, {0, 0, 1, 1}));
    EXPECT_TRUE(close_to(run_op(OpKind::silu, {}, {x})[0], t, {4}, {0, 0, 100, 1000}));
  }
}

TEST(CpuUnary, NaNPropagatesThroughReluAndClip) {
  Tensor x = Tensor::from_doubles(DType::f32, {2}, {NAN, -1});
  EXPECT_TRUE(std::isnan(run_op(OpKind::relu, {}, {x})[0].get(0)));
  EXPECT_TRUE(std::isnan(run_op(OpKind::clip, ClipAttrs{0, 1}, {x})[0].get(0)));
}

TEST(CpuUnary, IntegerOps) {
  for (DType t : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_label(t));
    const std::vector<double> v = {-9, -3, -1, 0, 1, 2, 8};
    Tensor x = Tensor::from_doubles(t, {7}, v);
    EXPECT_TRUE(all_close(run_op(OpKind::relu, {}, {x})[0],
                          Tensor::from_doubles(t, {7}, {0, 0, 0, 0, 1, 2, 8}), 0, 0));
    EXPECT_TRUE(all_close(run_op(OpKind::neg, {}, {x})[0],
                          Tensor::from_doubles(t, {7}, {9, 3, 1, 0, -1, -2, -8}), 0, 0));
    EXPECT_TRUE(all_close(run_op(OpKind::abs, {}, {x})[0],
                          Tensor::from_doubles(t, {7}, {9, 3, 1, 0, 1, 2, 8}), 0, 0));
    // Fractional bounds round inwards: [-2.5, 1.5] clips integers to [-2, 1].
    EXPECT_TRUE(all_close(run_op(OpKind::clip, ClipAttrs{-2.5, 1.5}, {x})[0],
                          Tensor::from_doubles(t, {7}, {-2, -2, -1, 0, 1, 1, 1}), 0, 0));
    // An infinite bound leaves that side open.
    EXPECT_TRUE(all_close(run_op(OpKind::clip, ClipAttrs{-INFINITY, 0}, {x})[0],
                          Tensor::from_doubles(t, {7}, {-9, -3, -1, 0, 0, 0, 0}), 0, 0));
  }
  // Negating the most negative integer wraps (two's complement), it does not trap.
  const int32_t lowest = std::numeric_limits<int32_t>::min();
  Tensor m = Tensor::from_vector<int32_t>({1}, {lowest});
  EXPECT_EQ(run_op(OpKind::neg, {}, {m})[0].data<int32_t>()[0], lowest);
}

TEST(CpuUnary, IdentityCopiesEveryDtype) {
  for (DType t : {DType::boolean, DType::i64, DType::f16}) {
    Tensor x = random_tensor(t, {5, 3}, 11, -100, 100);
    EXPECT_TRUE(all_close(run_op(OpKind::identity, {}, {x})[0], x, 0, 0));
  }
}

// ---- binary --------------------------------------------------------------------

struct BinaryCase {
  OpKind op;
  double lo, hi;  // operand range (a and b)
  std::function<double(double, double)> ref;
};

std::vector<BinaryCase> float_binary_cases() {
  return {
      {OpKind::add, -3, 3, [](double a, double b) { return a + b; }},
      {OpKind::sub, -3, 3, [](double a, double b) { return a - b; }},
      {OpKind::mul, -3, 3, [](double a, double b) { return a * b; }},
      {OpKind::div, 0.5, 3, [](double a, double b) { return a / b; }},
      {OpKind::max, -3, 3, [](double a, double b) { return std::max(a, b); }},
      {OpKind::min, -3, 3, [](double a, double b) { return std::min(a, b); }},
      {OpKind::pow, 0.5, 2, [](double a, double b) { return std::pow(a, b); }},
  };
}

// Reference: y[c] = f(a[bcast(c)], b[bcast(c)]) for every output coordinate c.
std::vector<double> broadcast_reference(const Tensor& a, const Tensor& b, const Shape& out,
                                        const std::function<double(double, double)>& f) {
  std::vector<double> y;
  for (int64_t i = 0; i < numel(out); ++i) {
    std::vector<int64_t> c = unravel(i, out);
    y.push_back(f(a.get(broadcast_index(c, a.shape())), b.get(broadcast_index(c, b.shape()))));
  }
  return y;
}

struct ShapePair {
  Shape a, b, out;
};

const std::vector<ShapePair> kBroadcasts = {
    {{3, 1, 5}, {4, 1}, {3, 4, 5}},  // both sides broadcast
    {{4, 1}, {3, 1, 5}, {3, 4, 5}},
    {{}, {2, 3}, {2, 3}},  // rank-0 scalar operand
    {{2, 3}, {}, {2, 3}},
    {{}, {}, {}},                 // both scalars
    {{7, 9}, {7, 9}, {7, 9}},     // same shape
    {{2, 3, 4}, {4}, {2, 3, 4}},  // trailing vector
    {{2, 1, 4}, {1, 3, 1}, {2, 3, 4}},
    {{5, 1}, {1, 1}, {5, 1}},
};

TEST(CpuBinary, BroadcastsLikeNumpyForEveryOpAndFloatType) {
  uint64_t seed = 100;
  for (const BinaryCase& c : float_binary_cases()) {
    for (DType t : kFloatTypes) {
      for (const ShapePair& s : kBroadcasts) {
        SCOPED_TRACE(
            cat(op_name(c.op), " ", dtype_name(t), " ", shape_str(s.a), " with ", shape_str(s.b)));
        Tensor a = random_tensor(t, s.a, seed++, c.lo, c.hi);
        Tensor b = random_tensor(t, s.b, seed++, c.op == OpKind::pow ? -2 : c.lo, c.hi);
        std::vector<Tensor> y = run_op(c.op, {}, {a, b});
        EXPECT_TRUE(close_to(y[0], t, s.out, broadcast_reference(a, b, s.out, c.ref)));
      }
    }
  }
}

TEST(CpuBinary, LargeBroadcastSplitAcrossThreads) {
  Tensor a = random_tensor(DType::f32, {64, 1, 129}, 5);
  Tensor b = random_tensor(DType::f32, {33, 129}, 6);
  const Shape out = {64, 33, 129};
  auto add = [](double u, double v) { return u + v; };
  EXPECT_TRUE(close_to(run_op(OpKind::add, {}, {a, b})[0], DType::f32, out,
                       broadcast_reference(a, b, out, add)));
}

TEST(CpuBinary, MaxAndMinPropagateNaN) {
  Tensor a = Tensor::from_doubles(DType::f32, {3}, {NAN, 1, 2});
  Tensor b = Tensor::from_doubles(DType::f32, {3}, {0, NAN, 1});
  for (OpKind op : {OpKind::max, OpKind::min}) {
    Tensor y = run_op(op, {}, {a, b})[0];
    EXPECT_TRUE(std::isnan(y.get(0)));
    EXPECT_TRUE(std::isnan(y.get(1)));
    EXPECT_EQ(y.get(2), op == OpKind::max ? 2.0 : 1.0);
  }
}

TEST(CpuBinary, IntegerArithmeticTruncatesDivision) {
  for (DType t : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_label(t));
    Tensor a = Tensor::from_doubles(t, {2, 3}, {7, -7, 9, 0, -1, 100});
    Tensor b = Tensor::from_doubles(t, {3}, {2, 2, -4});
    auto check = [&](OpKind op, std::vector<double> want) {
      EXPECT_TRUE(all_close(run_op(op, {}, {a, b})[0], Tensor::from_doubles(t, {2, 3}, want), 0, 0))
          << op_name(op);
    };
    check(OpKind::add, {9, -5, 5, 2, 1, 96});
    check(OpKind::sub, {5, -9, 13, -2, -3, 104});
    check(OpKind::mul, {14, -14, -36, 0, -2, -400});
    check(OpKind::div, {3, -3, -2, 0, 0, -25});  // toward zero, not floor
    check(OpKind::max, {7, 2, 9, 2, 2, 100});
    check(OpKind::min, {2, -7, -4, 0, -1, -4});
  }
  // Overflow wraps (two's complement), as the hardware does, instead of being undefined.
  const int32_t top = std::numeric_limits<int32_t>::max();
  Tensor a = Tensor::from_vector<int32_t>({}, {top});
  Tensor one = Tensor::from_vector<int32_t>({}, {1});
  EXPECT_EQ(run_op(OpKind::add, {}, {a, one})[0].data<int32_t>()[0],
            std::numeric_limits<int32_t>::min());
}

TEST(CpuBinary, IntegerDivisionByZeroNamesTheNode) {
  Tensor a = Tensor::from_vector<int64_t>({3}, {1, 2, 3});
  Tensor b = Tensor::from_vector<int64_t>({3}, {1, 0, 1});
  try {
    run_op(OpKind::div, {}, {a, b});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "div 'node'");
    EXPECT_NE(std::string(e.what()).find("division by zero"), std::string::npos) << e.what();
  }
}

TEST(CpuBinary, FloatDivisionByZeroGivesInfinity) {
  Tensor a = Tensor::from_doubles(DType::f32, {3}, {1, -1, 0});
  Tensor b = Tensor::from_doubles(DType::f32, {3}, {0, 0, 0});
  Tensor y = run_op(OpKind::div, {}, {a, b})[0];
  EXPECT_EQ(y.get(0), INFINITY);
  EXPECT_EQ(y.get(1), -INFINITY);
  EXPECT_TRUE(std::isnan(y.get(2)));
}

TEST(CpuBinary, PowWithAnotherExponentDtype) {
  // f32 base, i64 exponent (broadcast): the result is f32.
  Tensor base = Tensor::from_doubles(DType::f32, {2, 2}, {2, -3, 0.5, 10});
  Tensor e = Tensor::from_vector<int64_t>({2}, {3, -2});
  EXPECT_TRUE(close_to(run_op(OpKind::pow, {}, {base, e})[0], DType::f32, {2, 2},
                       {8, 1.0 / 9, 0.125, 0.01}));
  // f16 base, f32 exponent.
  Tensor hb = Tensor::from_doubles(DType::f16, {3}, {4, 9, 2});
  Tensor he = Tensor::from_doubles(DType::f32, {3}, {0.5, 0.5, -1});
  EXPECT_TRUE(close_to(run_op(OpKind::pow, {}, {hb, he})[0], DType::f16, {3}, {2, 3, 0.5}));
  // Integer base and exponent stay integers.
  Tensor ib = Tensor::from_vector<int64_t>({3}, {2, -3, 7});
  Tensor ie = Tensor::from_vector<int32_t>({3}, {10, 3, 0});
  EXPECT_TRUE(all_close(run_op(OpKind::pow, {}, {ib, ie})[0],
                        Tensor::from_vector<int64_t>({3}, {1024, -27, 1}), 0, 0));
}

}  // namespace
}  // namespace fusebox::testing
