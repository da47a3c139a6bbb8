// batch_norm_backward, layer_norm_backward and rms_norm_backward: gradient checks in f64
// against central differences of the forward op (gradient_check.h), with respect to x
// (so the statistics' dependence on x is checked), scale and bias; and the f32 / f16 /
// bf16 kernels against the f64 one on the same rounded values.
#include <cmath>

#include "gradient_check.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cpu::test {
namespace {

using namespace fusebox::testing;

// ---- batch_norm ------------------------------------------------------------------------

struct BatchNormInputs {
  Tensor x, scale, bias, running_mean, running_var;
  std::vector<Tensor> list() const { return {x, scale, bias, running_mean, running_var}; }
};

BatchNormInputs batch_norm_inputs(const Shape& x, uint64_t seed) {
  const Shape c = {x[1]};
  return {random_tensor(DType::f64, x, seed, -2, 3), random_tensor(DType::f64, c, seed + 1, 0.5, 2),
          random_tensor(DType::f64, c, seed + 2), random_tensor(DType::f64, c, seed + 3),
          random_tensor(DType::f64, c, seed + 4, 0.5, 2)};
}

TEST(BatchNormBackward, TrainingFormMatchesFiniteDifferences) {
  uint64_t seed = 10;
  for (const Shape& shape : {Shape{3, 2, 4}, Shape{5, 3}, Shape{2, 2, 2, 3}}) {
    SCOPED_TRACE(shape_str(shape));
    const BatchNormAttrs attrs{.epsilon = 1e-3, .momentum = 0.8, .training = true};
    const BatchNormInputs in = batch_norm_inputs(shape, seed += 10);
    const std::vector<Tensor> fwd = run_op(OpKind::batch_norm, attrs, in.list());
    ASSERT_EQ(fwd.size(), 5u);
    const Tensor dy = random_tensor(DType::f64, shape, seed + 5);
    const std::vector<Tensor> g =
        run_op(OpKind::batch_norm_backward, attrs, {dy, in.x, in.scale, fwd[3], fwd[4]});
    ASSERT_EQ(g.size(), 3u);
    EXPECT_TRUE(matches_numeric(g[0], OpKind::batch_norm, attrs, in.list(), 0, dy)) << "dx";
    EXPECT_TRUE(matches_numeric(g[1], OpKind::batch_norm, attrs, in.list(), 1, dy)) << "dscale";
    EXPECT_TRUE(matches_numeric(g[2], OpKind::batch_norm, attrs, in.list(), 2, dy)) << "dbias";
    // The batch statistics' dependence: dx sums to 0 over each channel.
    const Tensor per_channel =
        run_op(OpKind::reduce_sum,
               ReduceAttrs{
                   .axes = shape.size() == 2 ? std::vector<int64_t>{0} : std::vector<int64_t>{0, 2},
                   .keepdims = false},
               {shape.size() == 4 ? g[0].reshaped({2, 2, 6}) : g[0]})
            .at(0);
    for (int64_t c = 0; c < per_channel.numel(); ++c) EXPECT_NEAR(per_channel.get(c), 0.0, 1e-12);
  }
}

// training = false: the running statistics are constants.
TEST(BatchNormBackward, InferenceFormMatchesFiniteDifferences) {
  const BatchNormAttrs attrs{.epsilon = 1e-3};
  const Shape shape = {2, 3, 5};
  const BatchNormInputs in = batch_norm_inputs(shape, 40);
  Tensor inv_std = in.running_var.clone();
  for (int64_t c = 0; c < 3; ++c) inv_std.set(c, 1.0 / std::sqrt(in.running_var.get(c) + 1e-3));
  const Tensor dy = random_tensor(DType::f64, shape, 45);
  const std::vector<Tensor> g =
      run_op(OpKind::batch_norm_backward, attrs, {dy, in.x, in.scale, in.running_mean, inv_std});
  EXPECT_TRUE(matches_numeric(g[0], OpKind::batch_norm, attrs, in.list(), 0, dy)) << "dx";
  EXPECT_TRUE(matches_numeric(g[1], OpKind::batch_norm, attrs, in.list(), 1, dy)) << "dscale";
  EXPECT_TRUE(matches_numeric(g[2], OpKind::batch_norm, attrs, in.list(), 2, dy)) << "dbias";
}

// Mixed precision: bf16 / f16 dy and x with f32 scale and saved statistics (the forward's
// f32 outputs) give dx in x's dtype and dscale / dbias in f32; against the f64 kernel on the
// same values: dx to x's dtype's tolerance, dscale / dbias to f32's (they are computed in
// f64 and rounded once, to f32 instead of to x's dtype).
TEST(BatchNormBackward, LowPrecisionXWithF32Params) {
  uint64_t seed = 60;
  for (DType t : {DType::bf16, DType::f16}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(cat(dtype_name(t), training ? " training" : " inference"));
      const Shape shape = {3, 4, 5};
      const BatchNormAttrs attrs{.epsilon = 1e-3, .training = training};
      const BatchNormInputs in64 = batch_norm_inputs(shape, seed += 10);
      const Tensor x = in64.x.cast(t), dy = random_tensor(t, shape, seed + 5);
      auto f32 = [](const Tensor& v) { return v.cast(DType::f32); };
      const std::vector<Tensor> fwd = run_op(
          OpKind::batch_norm, BatchNormAttrs{.epsilon = 1e-3, .training = true},
          {x, f32(in64.scale), f32(in64.bias), f32(in64.running_mean), f32(in64.running_var)});
      ASSERT_EQ(fwd[3].dtype(), DType::f32);
      const std::vector<Tensor> in = {dy, x, f32(in64.scale), fwd[3], fwd[4]};
      const std::vector<Tensor> got = run_op(OpKind::batch_norm_backward, attrs, in);
      std::vector<Tensor> wide;
      for (const Tensor& v : in) wide.push_back(v.cast(DType::f64));
      const std::vector<Tensor> want = run_op(OpKind::batch_norm_backward, attrs, wide);
      ASSERT_EQ(got.size(), 3u);
      EXPECT_EQ(got[0].dtype(), t);
      EXPECT_TRUE(close_to(got[0], t, shape, want[0].to_doubles(), 2)) << "dx";
      for (size_t k = 1; k < 3; ++k) {
        EXPECT_EQ(got[k].dtype(), DType::f32) << k;
        EXPECT_TRUE(close_to(got[k], DType::f32, {4}, want[k].to_doubles(), 2)) << k;
      }
    }
  }
}

// ---- layer_norm / rms_norm ---------------------------------------------------------------

struct NormCase {
  Shape x;
  int64_t axis;
  std::optional<Shape> scale, bias;  // absent: no such input
};

std::string describe(const NormCase& c) {
  return cat("x ", shape_str(c.x), " axis ", c.axis, " scale ", c.scale ? shape_str(*c.scale) : "-",
             " bias ", c.bias ? shape_str(*c.bias) : "-");
}

Tensor maybe_random(const std::optional<Shape>& s, uint64_t seed, double lo, double hi) {
  return s ? random_tensor(DType::f64, *s, seed, lo, hi) : Tensor();
}

TEST(LayerNormBackward, MatchesFiniteDifferencesOverSeveralAxes) {
  const std::vector<NormCase> cases = {
      {{2, 3, 4}, -1, Shape{4}, Shape{4}},        {{2, 3, 4}, 1, Shape{3, 4}, Shape{3, 4}},
      {{2, 3, 4}, 1, Shape{1, 4}, Shape{1, 4}},  // scale broadcast over dim 1
      {{2, 3, 4}, 0, std::nullopt, std::nullopt}, {{3, 5}, 1, std::nullopt, Shape{5}},
      {{3, 5}, -1, Shape{5}, std::nullopt},       {{4}, 0, Shape{4}, Shape{4}},
  };
  uint64_t seed = 100;
  for (const NormCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const NormAttrs attrs{.axis = c.axis, .epsilon = 1e-4};
    const std::vector<Tensor> in = {random_tensor(DType::f64, c.x, ++seed, -2, 2),
                                    maybe_random(c.scale, ++seed, 0.5, 2),
                                    maybe_random(c.bias, ++seed, -1, 1)};
    const std::vector<Tensor> fwd = run_op(OpKind::layer_norm, attrs, in);
    const Tensor dy = random_tensor(DType::f64, c.x, ++seed);
    const std::vector<Tensor> g =
        run_op(OpKind::layer_norm_backward, attrs, {dy, in[0], in[1], fwd[1], fwd[2]});
    ASSERT_EQ(g.size(), 3u);
    EXPECT_TRUE(matches_numeric(g[0], OpKind::layer_norm, attrs, in, 0, dy)) << "dx";
    const Shape norm_shape(c.x.begin() + (c.axis < 0 ? c.axis + int64_t(c.x.size()) : c.axis),
                           c.x.end());
    const Shape param_shape = c.scale ? *c.scale : norm_shape;
    EXPECT_EQ(g[1].shape(), param_shape);
    EXPECT_EQ(g[2].shape(), param_shape);
    if (c.scale) {
      EXPECT_TRUE(matches_numeric(g[1], OpKind::layer_norm, attrs, in, 1, dy)) << "dscale";
    }
    if (c.bias) {
      EXPECT_TRUE(matches_numeric(g[2], OpKind::layer_norm, attrs, in, 2, dy)) << "dbias";
    }
    if (!c.scale) {
      // Without scale, dscale is still sum(dy * xhat): the gradient for a scale of ones.
      std::vector<Tensor> with_ones = in;
      with_ones[1] = Tensor::full(DType::f64, norm_shape, 1.0);
      EXPECT_TRUE(matches_numeric(g[1], OpKind::layer_norm, attrs, with_ones, 1, dy)) << "dscale";
    }
  }
}

TEST(RmsNormBackward, MatchesFiniteDifferences) {
  const std::vector<NormCase> cases = {
      {{2, 3, 4}, -1, Shape{4}, std::nullopt},
      {{2, 3, 4}, 1, Shape{1, 4}, std::nullopt},
      {{3, 5}, 0, std::nullopt, std::nullopt},
      {{6}, 0, Shape{6}, std::nullopt},
  };
  uint64_t seed = 200;
  for (const NormCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const NormAttrs attrs{.axis = c.axis, .epsilon = 1e-4};
    const std::vector<Tensor> in = {random_tensor(DType::f64, c.x, ++seed, -2, 2),
                                    maybe_random(c.scale, ++seed, 0.5, 2)};
    const std::vector<Tensor> fwd = run_op(OpKind::rms_norm, attrs, in);
    const Tensor dy = random_tensor(DType::f64, c.x, ++seed);
    const std::vector<Tensor> g =
        run_op(OpKind::rms_norm_backward, attrs, {dy, in[0], in[1], fwd[1]});
    ASSERT_EQ(g.size(), 2u);
    EXPECT_TRUE(matches_numeric(g[0], OpKind::rms_norm, attrs, in, 0, dy)) << "dx";
    if (c.scale) {
      EXPECT_TRUE(matches_numeric(g[1], OpKind::rms_norm, attrs, in, 1, dy)) << "dscale";
    }
  }
}

// ---- low precision -----------------------------------------------------------------------

// f32 / f16 / bf16: the f64 kernel on the same rounded values (statistics included),
// rounded once; the sums are in f64 either way.
TEST(NormBackward, LowPrecisionDtypesFollowF64) {
  uint64_t seed = 300;
  auto f64 = [](const Tensor& t) { return t.defined() ? t.cast(DType::f64) : t; };
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const Shape shape = {3, 2, 4};
    const Tensor x = random_tensor(t, shape, ++seed, -2, 2);
    const Tensor dy = random_tensor(t, shape, ++seed);
    const Tensor scale = random_tensor(t, {4}, ++seed, 0.5, 2);
    const NormAttrs attrs{.axis = 2};
    const std::vector<Tensor> fwd = run_op(OpKind::layer_norm, attrs, {x, scale, Tensor()});
    std::vector<Tensor> in = {dy, x, scale, fwd[1], fwd[2]};
    std::vector<Tensor> got = run_op(OpKind::layer_norm_backward, attrs, in);
    std::vector<Tensor> in64;
    for (const Tensor& v : in) in64.push_back(f64(v));
    std::vector<Tensor> want = run_op(OpKind::layer_norm_backward, attrs, in64);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_TRUE(close_to(got[k], t, want[k].shape(), want[k].to_doubles(), 2)) << k;

    const BatchNormAttrs bn{.training = true};
    const Tensor c2 = random_tensor(t, {2}, ++seed, 0.5, 2);
    const std::vector<Tensor> bfwd = run_op(OpKind::batch_norm, bn, {x, c2, c2, c2, c2});
    in = {dy, x, c2, bfwd[3], bfwd[4]};
    got = run_op(OpKind::batch_norm_backward, bn, in);
    in64.clear();
    for (const Tensor& v : in) in64.push_back(f64(v));
    want = run_op(OpKind::batch_norm_backward, bn, in64);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_TRUE(close_to(got[k], t, want[k].shape(), want[k].to_doubles(), 2)) << k;
  }
}

}  // namespace
}  // namespace fusebox::cpu::test
