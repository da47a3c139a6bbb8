// f16 loss scaling on the CPU backend (ops.h): the optimizer updates' grad_scale and skip
// inputs, nonfinite_any and loss_scale_update (PyTorch's GradScaler rules).
#include <cmath>
#include <cstring>
#include <limits>

#include "testing.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cpu::test {
namespace {

using namespace fusebox::testing;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor f32(double v) {
  return Tensor::scalar(DType::f32, v);
}
Tensor i64(int64_t v) {
  return Tensor::from_vector<int64_t>({}, {v});
}

const Shape kShape = {3, 7};

// Each update's inputs (param, grad, state..., lr[, step]) on random values of dtype t.
std::vector<Tensor> sgd_inputs(DType t, uint64_t seed) {
  return {random_tensor(t, kShape, seed), random_tensor(t, kShape, seed + 1),
          random_tensor(t, kShape, seed + 2), f32(0.05)};
}
std::vector<Tensor> adamw_inputs(DType t, uint64_t seed) {
  return {random_tensor(t, kShape, seed),
          random_tensor(t, kShape, seed + 1),
          random_tensor(t, kShape, seed + 2),
          random_tensor(t, kShape, seed + 3, 0, 1),
          f32(0.01),
          i64(3)};
}

std::vector<Tensor> with(std::vector<Tensor> inputs, const std::vector<Tensor>& more) {
  inputs.insert(inputs.end(), more.begin(), more.end());
  return inputs;
}

const SgdAttrs kSgd{.momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
const AdamWAttrs kAdamW{.weight_decay = 0.1};

// grad_scale 1 and skip 0 (or absent) change no bit of the plain update.
TEST(LossScalingUpdates, ScaleOneAndNoSkipAreThePlainUpdate) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<Tensor> sgd = sgd_inputs(t, 10), adamw = adamw_inputs(t, 20);
    const std::vector<Tensor> plain_sgd = run_op(OpKind::sgd_update, kSgd, sgd);
    const std::vector<Tensor> plain_adamw = run_op(OpKind::adamw_update, kAdamW, adamw);
    for (const std::vector<Tensor>& extra :
         {std::vector<Tensor>{f32(1), f32(0)}, std::vector<Tensor>{Tensor(), i64(0)},
          std::vector<Tensor>{f32(1)}}) {
      const std::vector<Tensor> a = run_op(OpKind::sgd_update, kSgd, with(sgd, extra));
      const std::vector<Tensor> b = run_op(OpKind::adamw_update, kAdamW, with(adamw, extra));
      for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(same_bits(a[k], plain_sgd[k])) << "sgd " << k;
      for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(same_bits(b[k], plain_adamw[k])) << "adamw " << k;
    }
  }
}

// A gradient scaled by 2^16 and unscaled by grad_scale 2^-16 gives the unscaled update bit
// for bit (powers of two scale exactly); another grad_scale changes the result.
TEST(LossScalingUpdates, GradScaleUnscalesTheGradient) {
  for (DType t : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<Tensor> sgd = sgd_inputs(t, 30), adamw = adamw_inputs(t, 40);
    auto scaled = [&](std::vector<Tensor> inputs) {
      std::vector<double> g = inputs[1].to_doubles();
      for (double& x : g) x *= 65536;
      inputs[1] = Tensor::from_doubles(t, kShape, g);
      return with(inputs, {f32(1.0 / 65536), f32(0)});
    };
    const std::vector<Tensor> want_sgd = run_op(OpKind::sgd_update, kSgd, sgd);
    const std::vector<Tensor> want_adamw = run_op(OpKind::adamw_update, kAdamW, adamw);
    const std::vector<Tensor> got_sgd = run_op(OpKind::sgd_update, kSgd, scaled(sgd));
    const std::vector<Tensor> got_adamw = run_op(OpKind::adamw_update, kAdamW, scaled(adamw));
    for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(same_bits(got_sgd[k], want_sgd[k])) << "sgd " << k;
    for (size_t k = 0; k < 3; ++k)
      EXPECT_TRUE(same_bits(got_adamw[k], want_adamw[k])) << "adamw " << k;
    EXPECT_FALSE(
        same_bits(run_op(OpKind::sgd_update, kSgd, with(sgd, {f32(0.5), f32(0)}))[0], want_sgd[0]));
  }
}

// SGD with grad_scale by hand: param - lr * (grad * s + wd * param).
TEST(LossScalingUpdates, SgdGradScaleByHand) {
  const std::vector<Tensor> out =
      run_op(OpKind::sgd_update, SgdAttrs{.weight_decay = 0.5},
             {Tensor::from_vector<double>({2}, {1, -2}), Tensor::from_vector<double>({2}, {4, 8}),
              Tensor::zeros(DType::f64, {2}), f32(0.25), f32(0.125), Tensor()});
  EXPECT_EQ(out[0].to_doubles(),
            (std::vector<double>{1 - 0.25 * (0.5 + 0.5), -2 - 0.25 * (1 - 1)}));
}

// A nonzero skip (any dtype, NaN too) leaves every state input as it was, bit for bit, even
// when the gradient is not finite.
TEST(LossScalingUpdates, SkipLeavesTheStateBitForBit) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<Tensor> sgd = sgd_inputs(t, 50), adamw = adamw_inputs(t, 60);
    std::vector<double> bad = sgd[1].to_doubles();
    bad[0] = inf;
    bad[5] = -inf;
    bad[9] = nan;
    sgd[1] = adamw[1] = Tensor::from_doubles(t, kShape, bad);
    for (const Tensor& skip : {f32(1), i64(7), Tensor::scalar(DType::boolean, 1), f32(nan)}) {
      SCOPED_TRACE(cat("skip ", dtype_name(skip.dtype()), " ", skip.get(0)));
      const std::vector<Tensor> a = run_op(OpKind::sgd_update, kSgd, with(sgd, {f32(0.5), skip}));
      EXPECT_TRUE(same_bits(a[0], sgd[0]));
      EXPECT_TRUE(same_bits(a[1], sgd[2]));
      const std::vector<Tensor> b =
          run_op(OpKind::adamw_update, kAdamW, with(adamw, {Tensor(), skip}));
      EXPECT_TRUE(same_bits(b[0], adamw[0]));
      EXPECT_TRUE(same_bits(b[1], adamw[2]));
      EXPECT_TRUE(same_bits(b[2], adamw[3]));
    }
    // Not skipped, the non-finite gradient reaches the parameters.
    const std::vector<Tensor> a = run_op(OpKind::sgd_update, kSgd, with(sgd, {f32(0.5), f32(0)}));
    EXPECT_FALSE(std::isfinite(a[0].get(0)));
  }
}

double found(const std::vector<Tensor>& inputs) {
  const std::vector<Tensor> out = run_op(OpKind::nonfinite_any, {}, inputs);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype(), DType::f32);
  EXPECT_EQ(out[0].rank(), 0);
  return out[0].get(0);
}

TEST(NonfiniteAny, FindsInfinitiesAndNaNsInAnyInputAndDtype) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    // Large finite values (f16's largest, 65504) are finite.
    const Tensor big = Tensor::from_doubles(t, {4}, {65504, -65504, 0, -0.0});
    const Tensor finite = random_tensor(t, {5, 40000}, 1, -100, 100);  // several chunks
    EXPECT_EQ(found({finite}), 0.0);
    EXPECT_EQ(found({big, finite, Tensor::zeros(t, {0})}), 0.0);
    for (double bad : {inf, -inf, nan}) {
      for (int64_t at : {int64_t(0), int64_t(123457), int64_t(199999)}) {
        SCOPED_TRACE(cat(bad, " at ", at));
        std::vector<double> v = finite.to_doubles();
        v[size_t(at)] = bad;
        const Tensor with_bad = Tensor::from_doubles(t, finite.shape(), v);
        EXPECT_EQ(found({with_bad}), 1.0);
        EXPECT_EQ(found({big, finite, with_bad}), 1.0);  // in the last input
        EXPECT_EQ(found({with_bad, big}), 1.0);
      }
    }
  }
  // Inputs of different dtypes; a rank-0 one.
  EXPECT_EQ(found({Tensor::zeros(DType::f16, {3}), f32(inf)}), 1.0);
  EXPECT_EQ(found({Tensor::zeros(DType::f16, {3}), f32(1e38)}), 0.0);
}

struct ScalerState {
  double scale;
  int64_t tracker;
  int64_t skipped;
};

ScalerState update(const ScalerState& s, double found_inf, const LossScaleAttrs& a = {}) {
  const std::vector<Tensor> out = run_op(
      OpKind::loss_scale_update, a, {f32(s.scale), i64(s.tracker), f32(found_inf), i64(s.skipped)});
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].dtype(), DType::f32);
  EXPECT_EQ(out[1].dtype(), DType::i64);
  return {out[0].get(0), int64_t(out[1].get(0)), int64_t(out[2].get(0))};
}

// PyTorch's _amp_update_scale_: back off on inf/NaN (tracker reset), grow after
// growth_interval clean steps in a row, count the skipped steps.
TEST(LossScaleUpdate, GradScalersRules) {
  ScalerState s = update({65536, 0, 0}, 1);
  EXPECT_EQ(s.scale, 32768);
  EXPECT_EQ(s.tracker, 0);
  EXPECT_EQ(s.skipped, 1);
  s = update({65536, 17, 4}, 1);  // a backoff resets the tracker
  EXPECT_EQ(s.scale, 32768);
  EXPECT_EQ(s.tracker, 0);
  EXPECT_EQ(s.skipped, 5);
  s = update({65536, 17, 4}, 0);
  EXPECT_EQ(s.scale, 65536);
  EXPECT_EQ(s.tracker, 18);
  EXPECT_EQ(s.skipped, 4);
  // The default interval: the 2000th clean step in a row doubles the scale.
  s = update({65536, 1998, 0}, 0);
  EXPECT_EQ(s.scale, 65536);
  EXPECT_EQ(s.tracker, 1999);
  s = update(s, 0);
  EXPECT_EQ(s.scale, 131072);
  EXPECT_EQ(s.tracker, 0);
  // Any nonzero found_inf counts (NaN too).
  EXPECT_EQ(update({8, 3, 0}, std::numeric_limits<double>::quiet_NaN()).scale, 4);
  // Growth past f32's range keeps the scale (PyTorch checks the new scale is finite).
  s = update({std::ldexp(1.0, 127), 1999, 0}, 0);
  EXPECT_EQ(s.scale, std::ldexp(1.0, 127));
  EXPECT_EQ(s.tracker, 0);
}

// 2000 steps in a row through the op: growth exactly at the interval, and a found_inf in
// the middle restarts the count.
TEST(LossScaleUpdate, GrowsEveryIntervalAndBacksOff) {
  const LossScaleAttrs a{.growth_factor = 3, .backoff_factor = 0.25, .growth_interval = 4};
  ScalerState s{1024, 0, 0};
  std::vector<double> scales;
  for (int step = 1; step <= 12; ++step) {
    s = update(s, step == 6 ? 1 : 0, a);
    scales.push_back(s.scale);
  }
  // Steps 1-4 clean (x3 at 4), 5 clean, 6 inf (x0.25), 7-10 clean (x3 at 10), 11-12 clean.
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 1024, 3072, 3072, 768, 768, 768, 768, 2304,
                                         2304, 2304}));
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.tracker, 2);

  s = {65536, 0, 0};
  for (int step = 1; step < 2000; ++step) s = update(s, 0);
  EXPECT_EQ(s.scale, 65536);
  EXPECT_EQ(s.tracker, 1999);
  s = update(s, 0);
  EXPECT_EQ(s.scale, 131072);
  EXPECT_EQ(s.tracker, 0);
}

// Without the skipped input there are two outputs; i32 trackers and f64 scales keep their
// dtypes.
TEST(LossScaleUpdate, OptionalCountAndOtherDtypes) {
  const std::vector<Tensor> out =
      run_op(OpKind::loss_scale_update, LossScaleAttrs{.growth_interval = 2},
             {Tensor::scalar(DType::f64, 0.75), Tensor::scalar(DType::i32, 1), i64(0)});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].dtype(), DType::f64);
  EXPECT_EQ(out[0].get(0), 1.5);
  EXPECT_EQ(out[1].dtype(), DType::i32);
  EXPECT_EQ(out[1].get(0), 0);
}

}  // namespace
}  // namespace fusebox::cpu::test
