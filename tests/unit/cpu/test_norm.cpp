// batch_norm, layer_norm and rms_norm on the CPU backend against naive f64 loops.
#include <cmath>

#include "ops_test_util.h"

namespace fusebox::testing {
namespace {

DType stats_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

struct NormReference {
  std::vector<double> y, mean, inv;
};

// Rows are x's dims before `axis`, columns the rest; scale and bias (optional)
// broadcast to the column dims. Without centring the mean is 0 and the variance
// is the mean square (rms_norm).
NormReference norm_reference(const Tensor& x, int64_t axis, const Tensor& scale, const Tensor& bias,
                             double eps, bool centre) {
  const Shape cols_shape(x.shape().begin() + axis, x.shape().end());
  const int64_t cols = numel(cols_shape), rows = x.numel() / cols;
  const std::vector<double> v = x.to_doubles();
  NormReference r;
  for (int64_t row = 0; row < rows; ++row) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mean += centre ? v[size_t(row * cols + j)] : 0.0;
    mean /= double(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const double d = v[size_t(row * cols + j)] - mean;
      var += d * d;
    }
    const double inv = 1 / std::sqrt(var / double(cols) + eps);
    r.mean.push_back(mean);
    r.inv.push_back(inv);
    for (int64_t j = 0; j < cols; ++j) {
      const std::vector<int64_t> c = unravel(j, cols_shape);
      double y = (v[size_t(row * cols + j)] - mean) * inv;
      if (scale.defined()) y *= scale.get(broadcast_index(c, scale.shape()));
      if (bias.defined()) y += bias.get(broadcast_index(c, bias.shape()));
      r.y.push_back(y);
    }
  }
  return r;
}

Shape stats_shape(const Shape& x, int64_t axis) {
  Shape s = x;
  for (size_t d = size_t(axis); d < s.size(); ++d) s[d] = 1;
  return s;
}

TEST(CpuLayerNorm, OverSeveralAxesWithAndWithoutScaleAndBias) {
  const Shape shape = {2, 3, 5};
  uint64_t seed = 1;
  for (DType t : kFloatTypes) {
    for (int64_t axis : {-1, 1, 0, 2}) {
      const int64_t a = axis < 0 ? axis + 3 : axis;
      const Shape norm(shape.begin() + a, shape.end());
      for (int params = 0; params < 3; ++params) {  // none, scale, scale + bias
        SCOPED_TRACE(cat(dtype_name(t), " axis ", axis, " params ", params));
        Tensor x = random_tensor(t, shape, seed++, -2, 3);
        Tensor scale = params >= 1 ? random_tensor(t, norm, seed++, 0.5, 2) : Tensor();
        Tensor bias = params >= 2 ? random_tensor(t, norm, seed++) : Tensor();
        std::vector<Tensor> out =
            run_op(OpKind::layer_norm, NormAttrs{axis, 1e-5}, {x, scale, bias});
        ASSERT_EQ(out.size(), 3u);
        const NormReference r = norm_reference(x, a, scale, bias, 1e-5, true);
        EXPECT_TRUE(close_to(out[0], t, shape, r.y));
        EXPECT_TRUE(close_to(out[1], stats_dtype(t), stats_shape(shape, a), r.mean));
        EXPECT_TRUE(close_to(out[2], stats_dtype(t), stats_shape(shape, a), r.inv));
      }
    }
  }
}

TEST(CpuLayerNorm, ScaleAndBiasBroadcastToTheNormalisedDims) {
  const Shape shape = {4, 3, 5};
  Tensor x = random_tensor(DType::f32, shape, 3);
  Tensor scale = random_tensor(DType::f32, {5}, 4, 0.5, 2);  // along the last dim only
  Tensor bias = random_tensor(DType::f32, {3, 1}, 5);        // along dim 1 only
  std::vector<Tensor> out = run_op(OpKind::layer_norm, NormAttrs{1, 1e-3}, {x, scale, bias});
  const NormReference r = norm_reference(x, 1, scale, bias, 1e-3, true);
  EXPECT_TRUE(close_to(out[0], DType::f32, shape, r.y));
}

TEST(CpuLayerNorm, LargeCommonOffsetKeepsPrecision) {
  // Rows of 1000 + small noise: a one-pass E[x^2] - E[x]^2 in f32 would lose it all.
  const Shape shape = {64, 300};
  Tensor x = random_tensor(DType::f32, shape, 9, 999, 1001);
  std::vector<Tensor> out = run_op(OpKind::layer_norm, NormAttrs{1, 1e-5}, {x, Tensor(), Tensor()});
  const NormReference r = norm_reference(x, 1, Tensor(), Tensor(), 1e-5, true);
  EXPECT_TRUE(close_to(out[0], DType::f32, shape, r.y));
  EXPECT_TRUE(close_to(out[2], DType::f32, {64, 1}, r.inv));
}

TEST(CpuRmsNorm, WithAndWithoutScale) {
  uint64_t seed = 50;
  for (DType t : kFloatTypes) {
    for (int64_t axis : {-1, 1}) {
      for (bool with_scale : {false, true}) {
        SCOPED_TRACE(cat(dtype_name(t), " axis ", axis, " scale ", with_scale));
        const Shape shape = {3, 4, 7};
        const int64_t a = axis < 0 ? axis + 3 : axis;
        Tensor x = random_tensor(t, shape, seed++, -2, 2);
        Tensor scale = with_scale
                           ? random_tensor(t, Shape(shape.begin() + a, shape.end()), seed++, 0.5, 2)
                           : Tensor();
        std::vector<Tensor> out = run_op(OpKind::rms_norm, NormAttrs{axis, 1e-6}, {x, scale});
        ASSERT_EQ(out.size(), 2u);
        const NormReference r = norm_reference(x, a, scale, Tensor(), 1e-6, false);
        EXPECT_TRUE(close_to(out[0], t, shape, r.y));
        EXPECT_TRUE(close_to(out[1], stats_dtype(t), stats_shape(shape, a), r.inv));
      }
    }
  }
}

// ---- batch_norm ----------------------------------------------------------------

struct BatchNormInputs {
  Tensor x, scale, bias, mean, var;
};

BatchNormInputs batch_norm_inputs(DType t, const Shape& shape, uint64_t seed) {
  const Shape c = {shape[1]};
  return {random_tensor(t, shape, seed, -2, 4), random_tensor(t, c, seed + 1, 0.5, 2),
          random_tensor(t, c, seed + 2), random_tensor(t, c, seed + 3),
          random_tensor(t, c, seed + 4, 0.5, 2)};
}

// y[n, c, ...] = (x - mean[c]) * inv[c] * scale[c] + bias[c]
std::vector<double> batch_norm_y(const BatchNormInputs& in, const std::vector<double>& mean,
                                 const std::vector<double>& inv) {
  std::vector<double> y;
  for (int64_t i = 0; i < in.x.numel(); ++i) {
    const size_t c = size_t(unravel(i, in.x.shape())[1]);
    y.push_back((in.x.get(i) - mean[c]) * inv[c] * in.scale.get(int64_t(c)) +
                in.bias.get(int64_t(c)));
  }
  return y;
}

TEST(CpuBatchNorm, InferenceUsesRunningStatistics) {
  uint64_t seed = 200;
  for (DType t : kFloatTypes) {
    for (const Shape& shape : {Shape{2, 3, 4, 5}, Shape{4, 3}, Shape{2, 5, 3}}) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape)));
      BatchNormInputs in = batch_norm_inputs(t, shape, seed += 10);
      std::vector<Tensor> out = run_op(OpKind::batch_norm, BatchNormAttrs{1e-3, 0.9, false},
                                       {in.x, in.scale, in.bias, in.mean, in.var});
      ASSERT_EQ(out.size(), 1u);
      std::vector<double> inv;
      for (double v : in.var.to_doubles()) inv.push_back(1 / std::sqrt(v + 1e-3));
      EXPECT_TRUE(close_to(out[0], t, shape, batch_norm_y(in, in.mean.to_doubles(), inv)));
    }
  }
}

TEST(CpuBatchNorm, TrainingUsesBatchStatisticsAndUpdatesRunningOnes) {
  uint64_t seed = 300;
  const double eps = 1e-5, momentum = 0.9;
  for (DType t : kFloatTypes) {
    for (const Shape& shape : {Shape{2, 3, 4, 5}, Shape{6, 4}}) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape)));
      BatchNormInputs in = batch_norm_inputs(t, shape, seed += 10);
      std::vector<Tensor> out = run_op(OpKind::batch_norm, BatchNormAttrs{eps, momentum, true},
                                       {in.x, in.scale, in.bias, in.mean, in.var});
      ASSERT_EQ(out.size(), 5u);
      const int64_t channels = shape[1];
      std::vector<double> mean(size_t(channels), 0.0), var(size_t(channels), 0.0);
      std::vector<double> count(size_t(channels), 0.0);
      for (int64_t i = 0; i < in.x.numel(); ++i) {
        const size_t c = size_t(unravel(i, shape)[1]);
        mean[c] += in.x.get(i);
        count[c] += 1;
      }
      for (size_t c = 0; c < mean.size(); ++c) mean[c] /= count[c];
      for (int64_t i = 0; i < in.x.numel(); ++i) {
        const size_t c = size_t(unravel(i, shape)[1]);
        var[c] += (in.x.get(i) - mean[c]) * (in.x.get(i) - mean[c]) / count[c];  // population
      }
      std::vector<double> inv, running_mean, running_var;
      for (size_t c = 0; c < mean.size(); ++c) {
        inv.push_back(1 / std::sqrt(var[c] + eps));
        running_mean.push_back(in.mean.get(int64_t(c)) * momentum + mean[c] * (1 - momentum));
        running_var.push_back(in.var.get(int64_t(c)) * momentum + var[c] * (1 - momentum));
      }
      const Shape c_shape = {channels};
      EXPECT_TRUE(close_to(out[0], t, shape, batch_norm_y(in, mean, inv)));
      EXPECT_TRUE(close_to(out[1], t, c_shape, running_mean));
      EXPECT_TRUE(close_to(out[2], t, c_shape, running_var));
      EXPECT_TRUE(close_to(out[3], t, c_shape, mean));
      EXPECT_TRUE(close_to(out[4], t, c_shape, inv));
    }
  }
}

// Mixed precision: f16 / bf16 x with f32 scale, bias and running statistics against the
// all-f32 op on the same (rounded) x. The kernel computes in f64 either way and rounds once,
// so the per-channel outputs (f32) agree to f32's tolerance and y to x's dtype's.
TEST(CpuBatchNorm, LowPrecisionXWithF32ParamsMatchesF32) {
  uint64_t seed = 400;
  for (DType t : {DType::bf16, DType::f16}) {
    for (bool training : {false, true}) {
      for (const Shape& shape : {Shape{2, 3, 4, 5}, Shape{6, 4}}) {
        SCOPED_TRACE(cat(dtype_name(t), training ? " training " : " inference ", shape_str(shape)));
        BatchNormInputs in = batch_norm_inputs(DType::f32, shape, seed += 10);
        const Tensor x = in.x.cast(t);
        const BatchNormAttrs attrs{1e-5, 0.9, training};
        const std::vector<Tensor> got =
            run_op(OpKind::batch_norm, attrs, {x, in.scale, in.bias, in.mean, in.var});
        const std::vector<Tensor> want = run_op(
            OpKind::batch_norm, attrs, {x.cast(DType::f32), in.scale, in.bias, in.mean, in.var});
        ASSERT_EQ(got.size(), training ? 5u : 1u);
        EXPECT_EQ(got[0].dtype(), t);
        EXPECT_TRUE(close_to(got[0], t, shape, want[0].to_doubles()));
        for (size_t o = 1; o < got.size(); ++o) {
          EXPECT_EQ(got[o].dtype(), DType::f32) << "output " << o;
          EXPECT_TRUE(close_to(got[o], DType::f32, {shape[1]}, want[o].to_doubles())) << o;
        }
      }
    }
  }
}

}  // namespace
}  // namespace fusebox::testing
