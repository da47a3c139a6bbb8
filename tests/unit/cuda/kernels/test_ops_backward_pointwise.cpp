// CUDA gradients of the pointwise and element-moving ops against the CPU backend:
// unary_backward (every derivative, special points), binary_backward (div/max/min/pow,
// broadcast operands, ties and NaN, pow's exponent of any numeric dtype), expand,
// slice_backward and pad_backward (every mode, negative pads). Outputs are poisoned
// (OpHarness). Tolerances: tolerance_for(dtype) (a few ulps; f32 arithmetic for f32)
// times 4 for the derivative formulas, which chain several rounded operations.
#include <cmath>
#include <limits>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

const Shape kSizes[] = {{1}, {7}, {4099}, {65536}, {3, 5, 7}};

class BackwardPointwiseTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

Tolerance grad_tolerance(DType t) {
  const Tolerance tol = tolerance_for(t);
  return {tol.rtol * 4, tol.atol * 4};
}

// Small integers in [lo, hi) stored as `dtype`: ties between operands are common.
Tensor quantised(DType dtype, const Shape& shape, uint64_t seed, double lo, double hi) {
  const Tensor ints = random_tensor(DType::i32, shape, seed, lo, hi);
  return Tensor::from_doubles(dtype, shape, ints.to_doubles());
}

struct UnaryGradCase {
  UnaryBackwardAttrs attrs;
  double lo, hi;  // x range
};

std::vector<UnaryGradCase> unary_grad_cases() {
  auto with = [](OpKind op) {
    UnaryBackwardAttrs a;
    a.op = op;
    return a;
  };
  UnaryBackwardAttrs leaky = with(OpKind::leaky_relu);
  leaky.alpha = 0.1;
  UnaryBackwardAttrs gelu_tanh = with(OpKind::gelu);
  gelu_tanh.tanh_approximation = true;
  UnaryBackwardAttrs clip = with(OpKind::clip);
  clip.min = -0.5;
  clip.max = 0.75;
  UnaryBackwardAttrs clip_open = with(OpKind::clip);
  clip_open.max = 0.25;
  return {
      {with(OpKind::relu), -2, 2},
      {leaky, -2, 2},
      {with(OpKind::gelu), -4, 4},
      {gelu_tanh, -4, 4},
      {with(OpKind::silu), -6, 6},
      {with(OpKind::sigmoid), -30, 30},
      {with(OpKind::tanh), -4, 4},
      {with(OpKind::exp), -5, 5},
      {with(OpKind::log), 0.05, 8},
      {with(OpKind::sqrt), 0.05, 8},
      {with(OpKind::rsqrt), 0.05, 8},
      {with(OpKind::reciprocal), 0.25, 4},
      {with(OpKind::neg), -2, 2},
      {with(OpKind::abs), -2, 2},
      {with(OpKind::erf), -3, 3},
      {with(OpKind::sin), -6, 6},
      {with(OpKind::cos), -6, 6},
      {clip, -2, 2},
      {clip_open, -2, 2},
  };
}

TEST_F(BackwardPointwiseTest, EveryUnaryDerivativeMatchesCpu) {
  OpHarness h;
  uint64_t seed = 1;
  for (const UnaryGradCase& c : unary_grad_cases()) {
    for (DType t : kFloatTypes) {
      for (const Shape& shape : kSizes) {
        SCOPED_TRACE(cat(op_name(c.attrs.op), " ", dtype_name(t), " ", shape_str(shape)));
        Tensor dy = random_tensor(t, shape, seed++, -1, 1);
        Tensor x = random_tensor(t, shape, seed++, c.lo, c.hi);
        const Tolerance tol = grad_tolerance(t);
        EXPECT_TRUE(all_close(h.run(unary_backward, OpKind::unary_backward, c.attrs, {dy, x})[0],
                              run_op(OpKind::unary_backward, c.attrs, {dy, x})[0], tol.rtol,
                              tol.atol));
      }
    }
  }
}

// The kinks: relu'(0) = 0, leaky_relu'(0) = alpha, abs'(0) = 0, clip passes at its bounds;
// NaN and infinities go through the same formulas as the CPU's.
TEST_F(BackwardPointwiseTest, UnaryDerivativesAtSpecialPoints) {
  OpHarness h;
  const double inf = INFINITY, nan = NAN;
  Tensor x =
      Tensor::from_doubles(DType::f32, {9}, {0.0, -0.0, -0.5, 0.75, inf, -inf, nan, 1e30, -1e-40});
  Tensor dy = Tensor::from_doubles(DType::f32, {9}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  for (const UnaryGradCase& c : unary_grad_cases()) {
    SCOPED_TRACE(op_name(c.attrs.op));
    EXPECT_TRUE(all_close(h.run(unary_backward, OpKind::unary_backward, c.attrs, {dy, x})[0],
                          run_op(OpKind::unary_backward, c.attrs, {dy, x})[0], 1e-5, 1e-30));
  }
}

TEST_F(BackwardPointwiseTest, UnaryBackwardTakesStridedViews) {
  OpHarness h;
  UnaryBackwardAttrs attrs;
  attrs.op = OpKind::tanh;
  for (DType t : {DType::f32, DType::bf16}) {
    Tensor base_dy = random_tensor(t, {40, 37}, 5, -1, 1);
    Tensor base_x = random_tensor(t, {37, 40}, 6, -2, 2);
    // dy reversed rows, x transposed: both [40, 37].
    const Shape shape{40, 37};
    DeviceTensor dy = h.view(base_dy, shape, {-37, 1}, 39 * 37);
    DeviceTensor x = h.view(base_x, shape, {1, 40}, 0);
    Tensor dy_host = gather(base_dy, shape, {-37, 1}, 39 * 37);
    Tensor x_host = gather(base_x, shape, {1, 40}, 0);
    const BuiltNode built = build_node(OpKind::unary_backward, attrs, {dy_host, x_host});
    const Tolerance tol = grad_tolerance(t);
    EXPECT_TRUE(all_close(h.run_device(unary_backward, built, {&dy, &x})[0],
                          run_op(OpKind::unary_backward, attrs, {dy_host, x_host})[0], tol.rtol,
                          tol.atol));
  }
}

// ---- binary ------------------------------------------------------------------------------

const std::pair<Shape, Shape> kBinaryShapes[] = {
    {{1}, {1}},          {{7}, {7}},
    {{4099}, {4099}},    {{65536}, {65536}},
    {{3, 1, 5}, {4, 5}}, {{}, {1000}},
    {{65536}, {1}},      {{6, 7}, {7}},
    {{6, 1}, {1, 9}},    {{2, 3, 4, 5, 6}, {3, 1, 5, 1}}};

// Runs binary_backward for forward op `op` on (dy, a, b) and compares both outputs.
void expect_binary_grad(OpHarness& h, OpKind op, const Tensor& a, const Tensor& b, uint64_t seed,
                        Tolerance tol) {
  Shape shape;
  ASSERT_TRUE(broadcast_shapes(a.shape(), b.shape(), &shape));
  Tensor dy = random_tensor(a.dtype(), shape, seed, -1, 1);
  const BinaryBackwardAttrs attrs{op};
  std::vector<Tensor> got = h.run(binary_backward, OpKind::binary_backward, attrs, {dy, a, b});
  std::vector<Tensor> want = run_op(OpKind::binary_backward, attrs, {dy, a, b});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(all_close(got[0], want[0], tol.rtol, tol.atol)) << "da";
  EXPECT_TRUE(all_close(got[1], want[1], tol.rtol, tol.atol)) << "db";
}

TEST_F(BackwardPointwiseTest, BinaryDerivativesMatchCpuWithBroadcasts) {
  OpHarness h;
  uint64_t seed = 1000;
  for (OpKind op : {OpKind::div, OpKind::max, OpKind::min, OpKind::pow}) {
    for (DType t : kFloatTypes) {
      for (const auto& [sa, sb] : kBinaryShapes) {
        SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t), " ", shape_str(sa), " ", shape_str(sb)));
        const bool extremum = op == OpKind::max || op == OpKind::min;
        // max/min: small integers, so that ties (which go to a) are frequent.
        Tensor a = extremum ? quantised(t, sa, seed++, 0, 4) : random_tensor(t, sa, seed++, 0.5, 2);
        Tensor b = extremum ? quantised(t, sb, seed++, 0, 4) : random_tensor(t, sb, seed++, -2, 2);
        if (op == OpKind::div) b = random_tensor(t, sb, seed++, 0.5, 2);
        expect_binary_grad(h, op, a, b, seed++, grad_tolerance(t));
        if (op != OpKind::pow) expect_binary_grad(h, op, b, a, seed++, grad_tolerance(t));
      }
    }
  }
}

TEST_F(BackwardPointwiseTest, MaxMinGradientsFollowNaNAndTies) {
  OpHarness h;
  Tensor a = Tensor::from_doubles(DType::f32, {6}, {NAN, 1.0, NAN, 2.0, 2.0, -INFINITY});
  Tensor b = Tensor::from_doubles(DType::f32, {6}, {1.0, NAN, NAN, 2.0, 3.0, -INFINITY});
  for (OpKind op : {OpKind::max, OpKind::min}) {
    SCOPED_TRACE(op_name(op));
    expect_binary_grad(h, op, a, b, 7, {0, 0});
    expect_binary_grad(h, op, b, a, 8, {0, 0});
  }
}

TEST_F(BackwardPointwiseTest, PowGradientsAtZeroAndWithOtherExponentDtypes) {
  OpHarness h;
  // a == 0 with b >= 0 gives db = 0; b == 0 gives da = 0; negative bases give NaN db.
  Tensor a = Tensor::from_doubles(DType::f32, {8}, {0, 0, 0, 2, -2, 1.5, 0.5, 3});
  Tensor b = Tensor::from_doubles(DType::f32, {8}, {0, 2, -1, 0, 3, -0.5, 1, 2.5});
  expect_binary_grad(h, OpKind::pow, a, b, 9, {4e-6, 1e-30});
  uint64_t seed = 2000;
  const std::pair<DType, DType> pairs[] = {{DType::f32, DType::i32},  {DType::f32, DType::i64},
                                           {DType::f32, DType::f64},  {DType::f16, DType::f32},
                                           {DType::bf16, DType::i64}, {DType::f64, DType::f32},
                                           {DType::f16, DType::f16}};
  for (const auto& [base, exponent] : pairs) {
    SCOPED_TRACE(cat(dtype_name(base), " ^ ", dtype_name(exponent)));
    Tensor x = random_tensor(base, {5, 401}, seed++, 0.25, 3);
    Tensor e = random_tensor(exponent, {401}, seed++, -2, 4);
    expect_binary_grad(h, OpKind::pow, x, e, seed++, grad_tolerance(base));
  }
}

// ---- expand, slice_backward, pad_backward -------------------------------------------------

TEST_F(BackwardPointwiseTest, ExpandMatchesCpu) {
  OpHarness h;
  const std::pair<Shape, Shape> cases[] = {{{3, 1}, {2, 3, 5}},    {{}, {4}},
                                           {{1}, {65536}},         {{7}, {3, 7}},
                                           {{2, 1, 3}, {2, 4, 3}}, {{5}, {5}}};
  uint64_t seed = 3000;
  for (DType t : {DType::f32, DType::f16, DType::i64, DType::boolean}) {
    for (const auto& [from, to] : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(from), " -> ", shape_str(to)));
      Tensor x = random_tensor(t, from, seed++, -3, 3);
      const ExpandAttrs attrs{to};
      EXPECT_TRUE(all_close(h.run(expand, OpKind::expand, attrs, {x})[0],
                            run_op(OpKind::expand, attrs, {x})[0], 0, 0));
    }
  }
  // A strided x: a transposed [3, 1] column of a [1, 3] row... expanded to [4, 3, 5].
  Tensor base = random_tensor(DType::f32, {5, 3}, 11);
  DeviceTensor view = h.view(base, {3, 1}, {1, 5}, 2);
  Tensor logical = gather(base, {3, 1}, {1, 5}, 2);
  const ExpandAttrs attrs{{4, 3, 5}};
  const BuiltNode built = build_node(OpKind::expand, attrs, {logical});
  EXPECT_TRUE(all_close(h.run_device(expand, built, {&view})[0],
                        run_op(OpKind::expand, attrs, {logical})[0], 0, 0));
}

SliceAttrs slice_attrs(std::vector<int64_t> starts, std::vector<int64_t> ends,
                       std::vector<int64_t> axes, std::vector<int64_t> steps) {
  SliceAttrs a;
  a.starts = std::move(starts);
  a.ends = std::move(ends);
  a.axes = std::move(axes);
  a.steps = std::move(steps);
  return a;
}

TEST_F(BackwardPointwiseTest, SliceBackwardMatchesCpu) {
  OpHarness h;
  struct Case {
    Shape input;
    SliceAttrs slice;
  };
  const Case cases[] = {
      {{10}, slice_attrs({2}, {9}, {0}, {3})},
      {{6, 7}, slice_attrs({-1, 1}, {-100, 6}, {0, 1}, {-2, 2})},
      {{4, 65536}, slice_attrs({3}, {65535}, {1}, {1})},
      {{3, 5, 7}, slice_attrs({1}, {1}, {2}, {1})},  // empty slice: dx all zeros
      {{2, 3, 4, 5}, slice_attrs({0, 4}, {3, 0}, {1, 3}, {2, -1})},
      {{1}, slice_attrs({0}, {1}, {0}, {1})},
  };
  uint64_t seed = 4000;
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.input)));
      const Tensor x = Tensor::zeros(t, c.input);
      const BuiltNode forward = build_node(OpKind::slice, c.slice, {x});
      Tensor dy = random_tensor(t, forward.outputs[0].shape, seed++, -2, 2);
      const SliceBackwardAttrs attrs{c.slice, c.input};
      EXPECT_TRUE(all_close(h.run(slice_backward, OpKind::slice_backward, attrs, {dy})[0],
                            run_op(OpKind::slice_backward, attrs, {dy})[0], 0, 0));
    }
  }
}

TEST_F(BackwardPointwiseTest, PadBackwardMatchesCpu) {
  OpHarness h;
  struct Case {
    Shape input;
    std::vector<int64_t> pads;
  };
  const Case cases[] = {
      {{10}, {3, 4}},
      {{10}, {9, 9}},
      {{5, 6}, {1, 2, 3, 4}},
      {{5, 6}, {-1, 2, 3, -2}},  // crops
      {{1, 7}, {0, 3, 0, 5}},
      {{2, 3, 4, 5}, {0, 1, 2, 3, 0, 3, 2, 1}},
      {{3, 65536}, {0, 2, 0, 3}},
      {{4, 4}, {0, 0, 0, 0}},  // no padding: a copy
  };
  uint64_t seed = 5000;
  for (PadMode mode : {PadMode::constant, PadMode::reflect, PadMode::edge}) {
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      for (const Case& c : cases) {
        PadAttrs pad;
        pad.pads = c.pads;
        pad.mode = mode;
        pad.value = 1.5;
        const Tensor x = Tensor::zeros(t, c.input);
        BuiltNode forward;
        try {
          forward = build_node(OpKind::pad, pad, {x});
        } catch (const Error&) {
          continue;  // reflect pads larger than the extent allows
        }
        SCOPED_TRACE(cat(int(mode), " ", dtype_name(t), " ", shape_str(c.input), " pads ",
                         shape_str(c.pads)));
        Tensor dy = random_tensor(t, forward.outputs[0].shape, seed++, -2, 2);
        const PadBackwardAttrs attrs{pad, c.input};
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(all_close(h.run(pad_backward, OpKind::pad_backward, attrs, {dy})[0],
                              run_op(OpKind::pad_backward, attrs, {dy})[0], tol.rtol, tol.atol));
      }
    }
  }
}

// Every backward entry through run_node (dispatch.cpp), so that none still throws
// "no CUDA kernel".
TEST_F(BackwardPointwiseTest, RunNodeDispatchesTheBackwardOps) {
  OpHarness h;
  Tensor dy = random_tensor(DType::f32, {4, 5}, 1);
  Tensor x = random_tensor(DType::f32, {4, 5}, 2);
  UnaryBackwardAttrs attrs;
  attrs.op = OpKind::sigmoid;
  EXPECT_TRUE(all_close(h.run(run_node, OpKind::unary_backward, attrs, {dy, x})[0],
                        run_op(OpKind::unary_backward, attrs, {dy, x})[0], 1e-5, 1e-6));
  const ExpandAttrs expand_attrs{{3, 4, 5}};
  EXPECT_TRUE(all_close(h.run(run_node, OpKind::expand, expand_attrs, {x})[0],
                        run_op(OpKind::expand, expand_attrs, {x})[0], 0, 0));
}

}  // namespace
}  // namespace fusebox::cuda::testing
