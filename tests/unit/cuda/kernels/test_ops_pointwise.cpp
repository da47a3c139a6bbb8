// CUDA unary and binary pointwise kernels against the CPU backend: every op, every dtype
// the CPU takes, odd sizes (1, 7, 4099, 65536 + 3), strided / broadcast / misaligned
// operands, poisoned outputs, and integer division by zero reported through the error
// flags.
#include <cmath>
#include <limits>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

const Shape kSizes[] = {{1}, {7}, {4099}, {65539}, {3, 5, 7}};

struct UnaryCase {
  OpKind op;
  Attrs attrs;
  double lo, hi;  // input range
};

std::vector<UnaryCase> float_unary_cases() {
  return {
      {OpKind::relu, {}, -2, 2},
      {OpKind::leaky_relu, LeakyReluAttrs{0.1}, -2, 2},
      {OpKind::gelu, GeluAttrs{false}, -4, 4},
      {OpKind::gelu, GeluAttrs{true}, -4, 4},
      {OpKind::silu, {}, -6, 6},
      {OpKind::sigmoid, {}, -30, 30},
      {OpKind::tanh, {}, -4, 4},
      {OpKind::exp, {}, -5, 5},
      {OpKind::log, {}, 0.05, 8},
      {OpKind::sqrt, {}, 0, 8},
      {OpKind::rsqrt, {}, 0.05, 8},
      {OpKind::reciprocal, {}, 0.25, 4},
      {OpKind::neg, {}, -2, 2},
      {OpKind::abs, {}, -2, 2},
      {OpKind::erf, {}, -3, 3},
      {OpKind::sin, {}, -6, 6},
      {OpKind::cos, {}, -6, 6},
      {OpKind::floor, {}, -3, 3},
      {OpKind::ceil, {}, -3, 3},
      {OpKind::round, {}, -3, 3},
      {OpKind::clip, ClipAttrs{-0.5, 0.75}, -2, 2},
      {OpKind::clip, ClipAttrs{-INFINITY, 0.25}, -2, 2},
      {OpKind::identity, {}, -2, 2},
  };
}

class PointwiseTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

TEST_F(PointwiseTest, EveryFloatUnaryOpMatchesCpu) {
  OpHarness h;
  uint64_t seed = 1;
  for (const UnaryCase& c : float_unary_cases()) {
    for (DType t : kFloatTypes) {
      for (const Shape& shape : kSizes) {
        SCOPED_TRACE(cat(op_name(c.op), " ", dtype_name(t), " ", shape_str(shape)));
        Tensor x = random_tensor(t, shape, seed++, c.lo, c.hi);
        std::vector<Tensor> want = run_op(c.op, c.attrs, {x});
        std::vector<Tensor> got = h.run(unary, c.op, c.attrs, {x});
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(all_close(got[0], want[0], tol.rtol, tol.atol));
      }
    }
  }
}

TEST_F(PointwiseTest, SpecialFloatValuesMatchCpu) {
  OpHarness h;
  const double inf = INFINITY, nan = NAN;
  Tensor x = Tensor::from_doubles(DType::f32, {8}, {0.0, -0.0, inf, -inf, nan, 1e30, -1e30, 1e-40});
  for (const UnaryCase& c : float_unary_cases()) {
    SCOPED_TRACE(op_name(c.op));
    std::vector<Tensor> want = run_op(c.op, c.attrs, {x});
    std::vector<Tensor> got = h.run(unary, c.op, c.attrs, {x});
    EXPECT_TRUE(all_close(got[0], want[0], 2e-5, 1e-30));
  }
}

TEST_F(PointwiseTest, IntegerUnaryOpsWrapAsCpu) {
  OpHarness h;
  for (DType t : {DType::i32, DType::i64}) {
    const double lo = t == DType::i32 ? -2147483648.0 : -9223372036854775808.0;
    Tensor x = Tensor::from_doubles(t, {7}, {lo, -5, -1, 0, 1, 3, 1000});
    Tensor big = random_tensor(t, {4099}, 7, -1000, 1000);
    const std::vector<std::pair<OpKind, Attrs>> ops = {{OpKind::relu, {}},
                                                       {OpKind::neg, {}},
                                                       {OpKind::abs, {}},
                                                       {OpKind::clip, ClipAttrs{-2.5, 2.5}},
                                                       {OpKind::clip, ClipAttrs{-INFINITY, 1e30}},
                                                       {OpKind::identity, {}}};
    for (const auto& [op, attrs] : ops) {
      for (const Tensor& input : {x, big}) {
        SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t), " ", shape_str(input.shape())));
        EXPECT_TRUE(
            all_close(h.run(unary, op, attrs, {input})[0], run_op(op, attrs, {input})[0], 0, 0));
      }
    }
  }
}

TEST_F(PointwiseTest, UnaryTakesStridedViews) {
  OpHarness h;
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    Tensor base = random_tensor(t, {40, 37}, 11, -3, 3);
    struct View {
      const char* name;
      Shape shape, strides;
      int64_t offset;
    };
    const View views[] = {
        {"transposed", {37, 40}, {1, 37}, 0},
        {"every other row, reversed columns", {20, 37}, {74, -1}, 36},
        {"broadcast row", {5, 37}, {0, 1}, 37},
        {"misaligned contiguous", {1479}, {1}, 1},
        {"column", {40}, {37}, 5},
    };
    for (const View& v : views) {
      for (OpKind op : {OpKind::gelu, OpKind::abs, OpKind::identity}) {
        SCOPED_TRACE(cat(v.name, " ", op_name(op), " ", dtype_name(t)));
        Tensor logical = gather(base, v.shape, v.strides, v.offset);
        DeviceTensor x = h.view(base, v.shape, v.strides, v.offset);
        const BuiltNode built = build_node(op, {}, {logical});
        std::vector<Tensor> got = h.run_device(unary, built, {&x});
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(all_close(got[0], run_op(op, {}, {logical})[0], tol.rtol, tol.atol));
      }
    }
  }
}

TEST_F(PointwiseTest, UnaryRejectsUnsupportedDtype) {
  OpHarness h;
  const BuiltNode built = build_node(OpKind::exp, {}, {Tensor::zeros(DType::f32, {4})});
  DeviceTensor x = h.upload(random_tensor(DType::i32, {4}, 3, 0, 9));
  DeviceTensor y = DeviceTensor::empty(h.ctx().allocator, DType::i32, {4});
  std::vector<const DeviceTensor*> in{&x};
  std::vector<DeviceTensor> out{y};
  EXPECT_THROW(unary(h.ctx(), built.node, in, out), Error);
}

// ---- binary ---------------------------------------------------------------------------

const OpKind kBinaryOps[] = {OpKind::add, OpKind::sub, OpKind::mul,
                             OpKind::div, OpKind::max, OpKind::min};

// (a shape, b shape): same shapes (vector path), broadcasts, scalars.
const std::pair<Shape, Shape> kBinaryShapes[] = {
    {{1}, {1}},          {{7}, {7}},
    {{4099}, {4099}},    {{65539}, {65539}},
    {{3, 1, 5}, {4, 5}}, {{}, {1000}},
    {{65536}, {1}},      {{6, 7}, {7}},
    {{6, 1}, {1, 9}},    {{2, 3, 4, 5, 6}, {3, 1, 5, 1}}};

TEST_F(PointwiseTest, EveryFloatBinaryOpMatchesCpu) {
  OpHarness h;
  uint64_t seed = 100;
  for (OpKind op : kBinaryOps) {
    for (DType t : kFloatTypes) {
      for (const auto& [sa, sb] : kBinaryShapes) {
        SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t), " ", shape_str(sa), " ", shape_str(sb)));
        Tensor a = random_tensor(t, sa, seed++, -2, 2);
        Tensor b = random_tensor(t, sb, seed++, 0.5, 2);  // away from 0 for div
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(all_close(h.run(binary, op, {}, {a, b})[0], run_op(op, {}, {a, b})[0], tol.rtol,
                              tol.atol));
        EXPECT_TRUE(all_close(h.run(binary, op, {}, {b, a})[0], run_op(op, {}, {b, a})[0], tol.rtol,
                              tol.atol));
      }
    }
  }
}

TEST_F(PointwiseTest, MaxMinPropagateNaN) {
  OpHarness h;
  Tensor a = Tensor::from_doubles(DType::f32, {4}, {NAN, 1.0, NAN, -INFINITY});
  Tensor b = Tensor::from_doubles(DType::f32, {4}, {1.0, NAN, NAN, 2.0});
  for (OpKind op : {OpKind::max, OpKind::min}) {
    EXPECT_TRUE(all_close(h.run(binary, op, {}, {a, b})[0], run_op(op, {}, {a, b})[0], 0, 0));
  }
}

TEST_F(PointwiseTest, IntegerBinaryOpsMatchCpu) {
  OpHarness h;
  uint64_t seed = 300;
  for (DType t : {DType::i32, DType::i64}) {
    for (OpKind op : kBinaryOps) {
      for (const auto& [sa, sb] : kBinaryShapes) {
        SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t), " ", shape_str(sa), " ", shape_str(sb)));
        Tensor a = random_tensor(t, sa, seed++, -100000, 100000);
        Tensor b = random_tensor(t, sb, seed++, 1, 50);
        if (op != OpKind::div) b = random_tensor(t, sb, seed++, -100000, 100000);
        EXPECT_TRUE(all_close(h.run(binary, op, {}, {a, b})[0], run_op(op, {}, {a, b})[0], 0, 0));
      }
    }
    // Wrapping and truncation toward zero, MIN / -1.
    const double lo = t == DType::i32 ? -2147483648.0 : -9223372036854775808.0;
    Tensor a = Tensor::from_doubles(t, {6}, {lo, lo, -7, 7, -7, 5});
    Tensor b = Tensor::from_doubles(t, {6}, {-1, 1, 2, -2, -2, 3});
    for (OpKind op : kBinaryOps) {
      SCOPED_TRACE(cat("extremes ", op_name(op), " ", dtype_name(t)));
      EXPECT_TRUE(all_close(h.run(binary, op, {}, {a, b})[0], run_op(op, {}, {a, b})[0], 0, 0));
    }
  }
}

TEST_F(PointwiseTest, IntegerDivisionByZeroFailsTheRun) {
  OpHarness h;
  Tensor a = Tensor::from_doubles(DType::i32, {5}, {1, 2, 3, 4, 5});
  Tensor b = Tensor::from_doubles(DType::i32, {5}, {1, 1, 0, 1, 1});
  try {
    h.run(binary, OpKind::div, {}, {a, b});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("integer division by zero (3 / 0)"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("div 'node'"), std::string::npos) << e.what();
  }
  // The flags were consumed: a good run after it passes.
  Tensor ok = Tensor::from_doubles(DType::i32, {5}, {1, 1, 2, 1, 1});
  EXPECT_TRUE(all_close(h.run(binary, OpKind::div, {}, {a, ok})[0],
                        run_op(OpKind::div, {}, {a, ok})[0], 0, 0));
}

TEST_F(PointwiseTest, PowTakesAnyNumericExponent) {
  OpHarness h;
  uint64_t seed = 500;
  for (DType base : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64}) {
    for (DType exponent : {DType::f32, DType::f64, DType::f16, DType::i32, DType::i64}) {
      SCOPED_TRACE(cat(dtype_name(base), " ^ ", dtype_name(exponent)));
      Tensor a = random_tensor(base, {4099}, seed++, 1, 5);
      Tensor b = random_tensor(exponent, {4099}, seed++, -2, 4);
      Tolerance tol = tolerance_for(base);
      if (!is_floating(base)) tol = {0, 0};
      EXPECT_TRUE(all_close(h.run(binary, OpKind::pow, {}, {a, b})[0],
                            run_op(OpKind::pow, {}, {a, b})[0], tol.rtol * 5, tol.atol));
    }
  }
}

// Integer bases to integral exponents (of any dtype) are exact, as the CPU's correctly
// rounded std::pow: 3^2 is 9, never the 8 a device pow's 8.999... would truncate to.
// Negative exponents (0 -> saturated +inf, +-1 -> +-1, else 0), results past 2^53 (rounded
// once, as the CPU), at INT64_MIN and past the integer range (saturated); fractional
// exponents with integer results (4^1.5 = 8).
TEST_F(PointwiseTest, IntegerPowIsExact) {
  OpHarness h;
  const std::vector<double> bases = {3, -3, 0, 0, 1, -1, -1, 2, 10, 7, -2, 2, 5, 3, -7, 0};
  const std::vector<double> exponents = {2,  3,  0,  -1, -5, -3, -4, 62,
                                         18, 22, 63, 64, 13, 39, 21, 7};
  const int64_t n = int64_t(bases.size());
  for (DType base : {DType::i64, DType::i32}) {
    for (DType exponent : {DType::i64, DType::i32, DType::f32, DType::f64, DType::f16}) {
      SCOPED_TRACE(cat(dtype_name(base), " ^ ", dtype_name(exponent)));
      Tensor a = Tensor::from_doubles(base, {n}, bases);
      Tensor b = Tensor::from_doubles(exponent, {n}, exponents);
      EXPECT_TRUE(all_close(h.run(binary, OpKind::pow, {}, {a, b})[0],
                            run_op(OpKind::pow, {}, {a, b})[0], 0, 0));
    }
  }
  // Non-integral exponents with exact integer results (4^1.5 = 8), and ones without.
  const std::vector<double> roots_of = {4, 9, 16, 25, 4, 100, 2, 3, 64, 1, 0};
  const std::vector<double> fractions = {1.5, 0.5, 0.25, 2.5, -0.5, 0.5, 0.5, 1.5, 0.125, 0.5, 0.5};
  const int64_t m = int64_t(roots_of.size());
  for (DType base : {DType::i64, DType::i32}) {
    for (DType exponent : {DType::f32, DType::f64, DType::f16}) {
      SCOPED_TRACE(cat("fractional ", dtype_name(base), " ^ ", dtype_name(exponent)));
      Tensor a = Tensor::from_doubles(base, {m}, roots_of);
      Tensor b = Tensor::from_doubles(exponent, {m}, fractions);
      EXPECT_TRUE(all_close(h.run(binary, OpKind::pow, {}, {a, b})[0],
                            run_op(OpKind::pow, {}, {a, b})[0], 0, 0));
    }
  }
  // Every small base and exponent, as a broadcast table.
  Tensor small_bases = random_tensor(DType::i32, {257, 1}, 7, -6, 7);
  Tensor small_exponents =
      Tensor::from_doubles(DType::i64, {12}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  EXPECT_TRUE(all_close(h.run(binary, OpKind::pow, {}, {small_bases, small_exponents})[0],
                        run_op(OpKind::pow, {}, {small_bases, small_exponents})[0], 0, 0));
}

TEST_F(PointwiseTest, BinaryTakesStridedAndMisalignedOperands) {
  OpHarness h;
  for (DType t : {DType::f32, DType::f16, DType::i64}) {
    Tensor base_a = random_tensor(t, {33, 65}, 21, -3, 3);
    Tensor base_b = random_tensor(t, {65, 33}, 22, 1, 3);
    // a: rows reversed; b: transposed (so [33, 65] too); misaligned flat views.
    const Shape shape{33, 65};
    const Shape a_strides{-65, 1}, b_strides{1, 33};
    Tensor a = gather(base_a, shape, a_strides, 32 * 65);
    Tensor b = gather(base_b, shape, b_strides, 0);
    DeviceTensor da = h.view(base_a, shape, a_strides, 32 * 65);
    DeviceTensor db = h.view(base_b, shape, b_strides, 0);
    for (OpKind op : {OpKind::add, OpKind::div, OpKind::max}) {
      SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t)));
      const BuiltNode built = build_node(op, {}, {a, b});
      const Tolerance tol = tolerance_for(t);
      EXPECT_TRUE(all_close(h.run_device(binary, built, {&da, &db})[0], run_op(op, {}, {a, b})[0],
                            tol.rtol, tol.atol));
    }
    Tensor flat_a = gather(base_a, {2000}, {1}, 3);
    Tensor flat_b = gather(base_b, {2000}, {1}, 1);
    DeviceTensor fa = h.view(base_a, {2000}, {1}, 3);
    DeviceTensor fb = h.view(base_b, {2000}, {1}, 1);
    const BuiltNode built = build_node(OpKind::mul, {}, {flat_a, flat_b});
    const Tolerance tol = tolerance_for(t);
    EXPECT_TRUE(all_close(h.run_device(binary, built, {&fa, &fb})[0],
                          run_op(OpKind::mul, {}, {flat_a, flat_b})[0], tol.rtol, tol.atol));
  }
}

// Rows of contiguous elements at each operand's own row stride (a channel slice of a
// channels-last tensor, a broadcast row): the vectorised rows path where the row starts are
// 16-byte aligned, the per-element walk where they are not; the same values either way.
TEST_F(PointwiseTest, RowsOfChannelSlicesMatchCpu) {
  OpHarness h;
  for (DType t : {DType::bf16, DType::f32, DType::f16}) {
    Tensor wide = random_tensor(t, {37, 48}, 31, -3, 3);
    Tensor other = random_tensor(t, {37, 32}, 32, -3, 3);
    struct Operand {
      const char* name;
      Shape strides;
      int64_t offset;
    };
    // Views of [37, 16] into `wide` (row stride 48) and `other` (32).
    const Operand as[] = {{"channels 16..31", {48, 1}, 16},
                          {"channels 32..47", {48, 1}, 32},
                          {"misaligned rows", {48, 1}, 3},
                          {"last rows", {48, 1}, 48 * 5}};
    const Operand bs[] = {{"slice of other", {32, 1}, 16}, {"broadcast row", {0, 1}, 0}};
    const Shape shape{37, 16};
    for (const Operand& a : as) {
      for (const Operand& b : bs) {
        SCOPED_TRACE(cat(a.name, " + ", b.name, " ", dtype_name(t)));
        const Shape a_shape = a.offset == 48 * 5 ? Shape{32, 16} : shape;
        const Shape b_shape = a_shape;
        Tensor la = gather(wide, a_shape, a.strides, a.offset);
        Tensor lb = gather(other, b_shape, b.strides, b.offset);
        DeviceTensor da = h.view(wide, a_shape, a.strides, a.offset);
        DeviceTensor db = h.view(other, b_shape, b.strides, b.offset);
        const Tolerance tol = tolerance_for(t);
        for (OpKind op : {OpKind::add, OpKind::mul}) {
          const BuiltNode built = build_node(op, {}, {la, lb});
          EXPECT_TRUE(all_close(h.run_device(binary, built, {&da, &db})[0],
                                run_op(op, {}, {la, lb})[0], tol.rtol, tol.atol))
              << op_name(op);
        }
        const BuiltNode built = build_node(OpKind::gelu, {}, {la});
        EXPECT_TRUE(all_close(h.run_device(unary, built, {&da})[0],
                              run_op(OpKind::gelu, {}, {la})[0], tol.rtol, tol.atol));
      }
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
