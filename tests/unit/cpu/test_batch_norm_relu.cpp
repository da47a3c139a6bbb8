// batch_norm with a fused relu (BatchNormAttrs::relu) and batch_norm_backward reading the
// forward's y: bit for bit the unfused composition (batch_norm then relu; relu's
// unary_backward at y then batch_norm_backward) on the CPU, both forms, every float dtype
// and the mixed-precision form (f16 / bf16 x, f32 parameters), on values that reach the
// edges: y exactly -0 (relu keeps it), y rounding to -0 in x's dtype, NaN x, and infinite
// or NaN dy where the mask is 0 (dy * 0 is NaN there, fused as unfused).
#include <cmath>
#include <limits>

#include "bit_identical.h"
#include "ops_test_util.h"

namespace fusebox::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const Shape kShape = {3, 4, 5};  // N, C, inner: element (n, c, i) at (n * 4 + c) * 5 + i

int64_t at(int64_t n, int64_t c, int64_t i) {
  return (n * kShape[1] + c) * kShape[2] + i;
}

// x, scale, bias, running_mean, running_var: x in `t`, the rest in `param`. Channels 0-2
// hold x == running_mean (0.5) in their first two columns, so the inference form gives
// there (0 * k) + bias: channel 0 a negative scale and bias -0 (y = -0), channel 1 bias 0
// (y = +0), channel 2 bias -1e-10 (negative; -0 once rounded to f16). Channel 3 has a NaN.
std::vector<Tensor> forward_inputs(DType t, DType param, uint64_t seed) {
  std::vector<double> x = random_tensor(DType::f64, kShape, seed, -2, 3).to_doubles();
  for (int64_t n = 0; n < kShape[0]; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 2; ++i) x[size_t(at(n, c, i))] = 0.5;
  x[size_t(at(1, 3, 4))] = kNaN;
  const std::vector<double> scale = {-1.25, 0.75, 1.5, 0.5}, bias = {-0.0, 0.0, -1e-10, 0.25};
  const std::vector<double> mean = {0.5, 0.5, 0.5, -0.25}, var = {0.5, 1.5, 2.0, 0.75};
  const Shape c = {kShape[1]};
  return {Tensor::from_doubles(t, kShape, x), Tensor::from_doubles(param, c, scale),
          Tensor::from_doubles(param, c, bias), Tensor::from_doubles(param, c, mean),
          Tensor::from_doubles(param, c, var)};
}

// dy with an infinity and a NaN in every channel (some land where y <= 0).
Tensor upstream_gradient(DType t, uint64_t seed) {
  std::vector<double> dy = random_tensor(DType::f64, kShape, seed, -1, 1).to_doubles();
  for (int64_t c = 0; c < kShape[1]; ++c) {
    dy[size_t(at(0, c, 0))] = kInf;
    dy[size_t(at(2, c, 1))] = -kInf;
    dy[size_t(at(1, c, 2))] = kNaN;
  }
  return Tensor::from_doubles(t, kShape, dy);
}

struct Case {
  DType t, param;
  bool training;
  std::string name() const {
    return cat(dtype_name(t), " x, ", dtype_name(param), " params, ",
               training ? "training" : "inference");
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool training : {false, true}) {
    for (DType t : kFloatTypes) out.push_back({t, t, training});
    for (DType t : {DType::f16, DType::bf16}) out.push_back({t, DType::f32, training});
  }
  return out;
}

TEST(CpuBatchNormRelu, ForwardIsBatchNormThenReluBitForBit) {
  uint64_t seed = 100;
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name());
    const std::vector<Tensor> in = forward_inputs(k.t, k.param, seed += 10);
    const BatchNormAttrs plain{.epsilon = 1e-3, .momentum = 0.8, .training = k.training};
    BatchNormAttrs fused = plain;
    fused.relu = true;
    const std::vector<Tensor> want = run_op(OpKind::batch_norm, plain, in);
    const Tensor relu = run_op(OpKind::relu, {}, {want[0]}).at(0);
    const std::vector<Tensor> got = run_op(OpKind::batch_norm, fused, in);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(bit_identical(got[0], relu)) << "y";
    for (size_t o = 1; o < got.size(); ++o) EXPECT_TRUE(bit_identical(got[o], want[o])) << o;
    // The relu did something, and the edges were reached.
    EXPECT_FALSE(bit_identical(got[0], want[0]));
    if (!k.training) {
      const double y = got[0].get(at(0, 0, 0));
      EXPECT_TRUE(y == 0 && std::signbit(y)) << "channel 0 gives -0, relu keeps it: " << y;
      EXPECT_TRUE(std::isnan(got[0].get(at(1, 3, 4))));
    }
  }
}

TEST(CpuBatchNormRelu, BackwardIsReluGradientThenBatchNormBackwardBitForBit) {
  uint64_t seed = 200;
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name());
    const std::vector<Tensor> in = forward_inputs(k.t, k.param, seed += 10);
    const std::vector<Tensor> fwd = run_op(
        OpKind::batch_norm,
        BatchNormAttrs{.epsilon = 1e-3, .momentum = 0.8, .training = true, .relu = true}, in);
    const Tensor& y = fwd[0];
    // Training: the forward's saved statistics; inference: running mean and a made-up
    // inverse std (the op takes any).
    const Tensor mean = k.training ? fwd[3] : in[3];
    const Tensor inv_std = k.training ? fwd[4] : in[4];
    const Tensor dy = upstream_gradient(k.t, seed + 5);
    const BatchNormAttrs plain{.training = k.training};
    BatchNormAttrs fused = plain;
    fused.relu = true;
    const Tensor masked =
        run_op(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::relu}, {dy, y}).at(0);
    const std::vector<Tensor> want =
        run_op(OpKind::batch_norm_backward, plain, {masked, in[0], in[1], mean, inv_std});
    const std::vector<Tensor> got =
        run_op(OpKind::batch_norm_backward, fused, {dy, in[0], in[1], mean, inv_std, y});
    ASSERT_EQ(got.size(), 3u);
    EXPECT_TRUE(bit_identical(got[0], want[0])) << "dx";
    EXPECT_TRUE(bit_identical(got[1], want[1])) << "dscale";
    EXPECT_TRUE(bit_identical(got[2], want[2])) << "dbias";
    // Unmasked, dx differs: the mask is applied.
    const std::vector<Tensor> unmasked =
        run_op(OpKind::batch_norm_backward, plain, {dy, in[0], in[1], mean, inv_std});
    EXPECT_FALSE(bit_identical(got[0], unmasked[0]));
  }
}

// dy in two terms (input 7, dy_addend) and the dy used as output 3 (dy_output): bit for bit
// the add, relu's unary_backward at y (with relu), then batch_norm_backward of the one dy, with
// and without relu (a residual block's end: the gradient at the sum feeds the residual too).
TEST(CpuBatchNormRelu, TwoTermsAndUsedDyAreAddThenMaskThenBackwardBitForBit) {
  uint64_t seed = 250;
  for (const Case& k : cases()) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(cat(k.name(), relu ? ", relu" : ""));
      const std::vector<Tensor> in = forward_inputs(k.t, k.param, seed += 10);
      const std::vector<Tensor> fwd = run_op(
          OpKind::batch_norm,
          BatchNormAttrs{.epsilon = 1e-3, .momentum = 0.8, .training = true, .relu = relu}, in);
      const Tensor dy = upstream_gradient(k.t, seed + 5);
      const Tensor addend = random_tensor(k.t, kShape, seed + 6, -1, 1);
      Tensor sum = run_op(OpKind::add, {}, {dy, addend}).at(0);
      if (relu)
        sum = run_op(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::relu}, {sum, fwd[0]})
                  .at(0);
      const BatchNormAttrs plain{.training = k.training};
      const std::vector<Tensor> want =
          run_op(OpKind::batch_norm_backward, plain, {sum, in[0], in[1], fwd[3], fwd[4]});
      for (bool used : {false, true}) {
        BatchNormAttrs fused = plain;
        fused.relu = relu;
        fused.dy_output = used;
        const std::vector<Tensor> got =
            run_op(OpKind::batch_norm_backward, fused,
                   {dy, in[0], in[1], fwd[3], fwd[4], relu ? fwd[0] : Tensor{}, Tensor{}, addend});
        ASSERT_EQ(got.size(), used ? 4u : 3u);
        for (size_t o = 0; o < 3; ++o) EXPECT_TRUE(bit_identical(got[o], want[o])) << o;
        if (used) {
          EXPECT_TRUE(bit_identical(got[3], sum)) << "dy_used";
        }
      }
    }
  }
}

// Finite values only: the fused results are ordinary numbers, so a wrong mask or a relu
// before the rounding would show as a numeric difference too (not only in NaN payloads).
TEST(CpuBatchNormRelu, FiniteValuesMatchTheUnfusedPair) {
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Shape shape = {4, 3, 6};
    const std::vector<Tensor> in = {
        random_tensor(t, shape, 301, -2, 2), random_tensor(t, {3}, 302, 0.5, 1.5),
        random_tensor(t, {3}, 303), random_tensor(t, {3}, 304), random_tensor(t, {3}, 305, 0.5, 2)};
    const BatchNormAttrs plain{.training = true};
    const BatchNormAttrs fused{.training = true, .relu = true};
    const std::vector<Tensor> want = run_op(OpKind::batch_norm, plain, in);
    const std::vector<Tensor> got = run_op(OpKind::batch_norm, fused, in);
    const Tensor y = run_op(OpKind::relu, {}, {want[0]}).at(0);
    EXPECT_TRUE(bit_identical(got[0], y));
    const Tensor dy = random_tensor(t, shape, 306);
    const Tensor masked =
        run_op(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::relu}, {dy, y}).at(0);
    const std::vector<Tensor> back_want =
        run_op(OpKind::batch_norm_backward, plain, {masked, in[0], in[1], want[3], want[4]});
    const std::vector<Tensor> back_got =
        run_op(OpKind::batch_norm_backward, fused, {dy, in[0], in[1], got[3], got[4], got[0]});
    for (size_t o = 0; o < 3; ++o) EXPECT_TRUE(bit_identical(back_got[o], back_want[o])) << o;
  }
}

// A fused residual (input 5), with and without the relu: bit for bit batch_norm, add, relu,
// both forms and every dtype (a residual of -y somewhere makes exact zeros and -0 reach
// the relu); the statistics outputs as the plain batch norm's.
TEST(CpuBatchNormRelu, ResidualIsBatchNormAddReluBitForBit) {
  uint64_t seed = 400;
  for (const Case& k : cases()) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(cat(k.name(), relu ? ", relu" : ""));
      std::vector<Tensor> in = forward_inputs(k.t, k.param, seed += 10);
      const BatchNormAttrs plain{.epsilon = 1e-3, .momentum = 0.8, .training = k.training};
      const std::vector<Tensor> want = run_op(OpKind::batch_norm, plain, in);
      std::vector<double> r = random_tensor(DType::f64, kShape, seed + 1, -2, 2).to_doubles();
      // Exact cancellation (y + -y = +0) in the channels without NaNs.
      for (int64_t c = 0; c < 3; ++c) r[size_t(at(2, c, 3))] = -want[0].get(at(2, c, 3));
      const Tensor residual = Tensor::from_doubles(k.t, kShape, r);
      Tensor sum = run_op(OpKind::add, {}, {want[0], residual}).at(0);
      if (relu) sum = run_op(OpKind::relu, {}, {sum}).at(0);
      BatchNormAttrs fused = plain;
      fused.relu = relu;
      in.push_back(residual);
      const std::vector<Tensor> got = run_op(OpKind::batch_norm, fused, in);
      ASSERT_EQ(got.size(), want.size());
      // (NaN + r: which operand's NaN comes out is the compiler's choice: same_values.)
      EXPECT_TRUE(same_values(got[0], sum)) << "y";
      for (size_t o = 1; o < got.size(); ++o) EXPECT_TRUE(bit_identical(got[o], want[o])) << o;
    }
  }
}

// batch_norm_apply (y computed again from a training forward's saved statistics, for the
// backward: passes/rematerialize.h) gives the forward's y bit for bit where the statistics are
// stored in x's compute type, with and without the relu; and it reads them: another mean
// gives another y.
TEST(CpuBatchNormRelu, ApplyFromSavedStatisticsIsTheTrainingForwardsY) {
  uint64_t seed = 500;
  for (const Case& k : cases()) {
    const bool stored = k.param == (k.t == DType::f64 ? DType::f64 : DType::f32);
    if (!k.training || !stored) continue;
    for (bool relu : {false, true}) {
      SCOPED_TRACE(cat(k.name(), relu ? ", relu" : ""));
      const std::vector<Tensor> in = forward_inputs(k.t, k.param, seed += 10);
      const BatchNormAttrs forward{
          .epsilon = 1e-3, .momentum = 0.8, .training = true, .relu = relu};
      const std::vector<Tensor> fwd = run_op(OpKind::batch_norm, forward, in);
      const BatchNormAttrs apply{.relu = relu};
      const Tensor got =
          run_op(OpKind::batch_norm_apply, apply, {in[0], in[1], in[2], fwd[3], fwd[4]}).at(0);
      EXPECT_TRUE(same_values(got, fwd[0]));
      std::vector<double> mean = fwd[3].to_doubles();
      mean[1] += 0.125;
      const Tensor moved =
          run_op(OpKind::batch_norm_apply, apply,
                 {in[0], in[1], in[2], Tensor::from_doubles(k.param, {kShape[1]}, mean), fwd[4]})
              .at(0);
      EXPECT_FALSE(same_values(moved, fwd[0]));
    }
  }
}

}  // namespace
}  // namespace fusebox::testing
