// CUDA batch_norm_backward (training and inference forms), max_pool_backward (ties, NaN,
// dilation, ceil_mode, 1-3 spatial dims) and avg_pool_backward (count_include_pad or not)
// against the CPU backend, outputs poisoned (OpHarness).
// Tolerances: the pools sum at most a few window shares per element (f32 on the GPU, f64
// on the CPU): tolerance_for(dtype) x 2. batch_norm's per-channel sums run over up to
// 65,536 elements in f32 per-chunk partials (f64 on the CPU): dscale / dbias get an
// absolute tolerance that grows with sqrt(count) (f32 rounding of a random-walk sum), dx
// tolerance_for(dtype) x 4 plus that error spread over the count.
#include <cmath>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

class BackwardPoolNormTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

// ---- batch_norm ----------------------------------------------------------------------------

// (dy, x, scale, saved_mean, saved_inv_std): the statistics from the CPU's training forward
// (training) or made-up running statistics (inference form).
std::vector<Tensor> batch_norm_inputs(DType t, const Shape& shape, bool training, uint64_t seed) {
  const int64_t channels = shape[1];
  Tensor x = random_tensor(t, shape, seed, -2, 3);
  Tensor scale = random_tensor(t, {channels}, seed + 1, 0.5, 1.5);
  Tensor dy = random_tensor(t, shape, seed + 2, -1, 1);
  if (!training) {
    return {dy, x, scale, random_tensor(t, {channels}, seed + 3, -0.5, 0.5),
            random_tensor(t, {channels}, seed + 4, 0.5, 2)};
  }
  Tensor bias = random_tensor(t, {channels}, seed + 5, -1, 1);
  Tensor running_mean = random_tensor(t, {channels}, seed + 6, -1, 1);
  Tensor running_var = random_tensor(t, {channels}, seed + 7, 0.5, 2);
  BatchNormAttrs attrs;
  attrs.training = true;
  std::vector<Tensor> forward =
      run_op(OpKind::batch_norm, attrs, {x, scale, bias, running_mean, running_var});
  return {dy, x, scale, forward[3], forward[4]};
}

TEST_F(BackwardPoolNormTest, BatchNormBackwardMatchesCpu) {
  OpHarness h;
  const Shape shapes[] = {{4, 3, 5, 5}, {2, 5},        {8, 16, 7, 7},
                          {1, 3, 1},    {2, 2, 65536}, {3, 4, 2, 3, 5}};
  uint64_t seed = 100;
  for (bool training : {true, false}) {
    for (DType t : kFloatTypes) {
      for (const Shape& shape : shapes) {
        SCOPED_TRACE(
            cat(training ? "training " : "inference ", dtype_name(t), " ", shape_str(shape)));
        std::vector<Tensor> inputs = batch_norm_inputs(t, shape, training, seed);
        seed += 8;
        BatchNormAttrs attrs;
        attrs.training = training;
        std::vector<Tensor> got =
            h.run(batch_norm_backward, OpKind::batch_norm_backward, attrs, inputs);
        std::vector<Tensor> want = run_op(OpKind::batch_norm_backward, attrs, inputs);
        ASSERT_EQ(got.size(), 3u);
        const double count = double(numel(shape) / shape[1]);
        const Tolerance tol = tolerance_for(t);
        const double sum_atol =
            t == DType::f64 ? 1e-10 : (t == DType::f32 ? 1e-6 : tol.atol) * 8 * std::sqrt(count);
        EXPECT_TRUE(
            all_close(got[0], want[0], tol.rtol * 4, tol.atol * 4 + (t == DType::f32 ? 1e-6 : 0.0)))
            << "dx";
        EXPECT_TRUE(all_close(got[1], want[1], tol.rtol * 4, sum_atol)) << "dscale";
        EXPECT_TRUE(all_close(got[2], want[2], tol.rtol * 4, sum_atol)) << "dbias";
      }
    }
  }
}

// ---- pools -----------------------------------------------------------------------------------

PoolAttrs pool_attrs(std::vector<int64_t> kernel, std::vector<int64_t> strides,
                     std::vector<int64_t> pads, std::vector<int64_t> dilations = {},
                     bool ceil_mode = false, bool count_include_pad = false) {
  PoolAttrs a;
  a.kernel = std::move(kernel);
  a.strides = std::move(strides);
  a.pads_begin = pads;
  a.pads_end = std::move(pads);
  a.dilations = std::move(dilations);
  a.ceil_mode = ceil_mode;
  a.count_include_pad = count_include_pad;
  return a;
}

struct PoolCase {
  const char* name;
  Shape x;
  PoolAttrs pool;
};

std::vector<PoolCase> pool_cases() {
  return {
      {"2-d 3x3 stride 2 pad 1", {2, 3, 9, 11}, pool_attrs({3, 3}, {2, 2}, {1, 1})},
      {"2-d 2x2 stride 2", {2, 4, 8, 8}, pool_attrs({2, 2}, {2, 2}, {0, 0})},
      {"2-d 3x3 stride 1 (overlapping)", {1, 2, 7, 6}, pool_attrs({3, 3}, {1, 1}, {1, 1})},
      {"1-d dilated", {2, 3, 20}, pool_attrs({3}, {1}, {1}, {2})},
      {"3-d 2x2x2 stride 1", {1, 2, 4, 5, 3}, pool_attrs({2, 2, 2}, {1, 1, 1}, {0, 0, 0})},
      {"2-d ceil_mode", {1, 2, 7, 7}, pool_attrs({3, 3}, {2, 2}, {0, 0}, {}, true)},
      {"2-d count_include_pad", {2, 2, 5, 6}, pool_attrs({3, 3}, {2, 2}, {1, 1}, {}, false, true)},
      {"2-d 65,536 elements", {1, 1, 256, 256}, pool_attrs({3, 3}, {2, 2}, {1, 1})},
      {"2-d 1x1 plane", {3, 2, 1, 1}, pool_attrs({1, 1}, {1, 1}, {0, 0})},
  };
}

TEST_F(BackwardPoolNormTest, MaxPoolBackwardMatchesCpuWithTies) {
  OpHarness h;
  uint64_t seed = 200;
  for (DType t : kFloatTypes) {
    for (const PoolCase& c : pool_cases()) {
      if (!c.pool.dilations.empty() && c.pool.count_include_pad) continue;
      SCOPED_TRACE(cat(c.name, " ", dtype_name(t)));
      // Small integers: windows hold several equal maxima (the first one wins).
      const Tensor ints = random_tensor(DType::i32, c.x, seed++, 0, 4);
      const Tensor x = Tensor::from_doubles(t, c.x, ints.to_doubles());
      const BuiltNode forward = build_node(OpKind::max_pool, c.pool, {x});
      Tensor dy = random_tensor(t, forward.outputs[0].shape, seed++, -1, 1);
      const PoolBackwardAttrs attrs{c.pool, {}};
      const Tolerance tol = tolerance_for(t);
      EXPECT_TRUE(all_close(h.run(max_pool_backward, OpKind::max_pool_backward, attrs, {dy, x})[0],
                            run_op(OpKind::max_pool_backward, attrs, {dy, x})[0], tol.rtol * 2,
                            tol.atol * 2));
    }
  }
}

TEST_F(BackwardPoolNormTest, MaxPoolBackwardSendsToTheForwardsNaN) {
  OpHarness h;
  const double nan = NAN;
  // Planes holding NaNs and -inf.
  Tensor x = Tensor::from_doubles(DType::f32, {1, 1, 4, 4},
                                  {1, nan, 3, 0, -INFINITY, 2, nan, 5, 4, 4, 1, 1, 0, nan, 2, 2});
  // Overlapping windows (through the forward's indices) and 2x2 windows that tile x (one
  // thread per window).
  for (const PoolAttrs& pool :
       {pool_attrs({3, 3}, {1, 1}, {1, 1}), pool_attrs({2, 2}, {2, 2}, {0, 0})}) {
    const BuiltNode forward = build_node(OpKind::max_pool, pool, {x});
    Tensor dy = random_tensor(DType::f32, forward.outputs[0].shape, 5, -1, 1);
    const PoolBackwardAttrs attrs{pool, {}};
    EXPECT_TRUE(all_close(h.run(max_pool_backward, OpKind::max_pool_backward, attrs, {dy, x})[0],
                          run_op(OpKind::max_pool_backward, attrs, {dy, x})[0], 1e-6, 1e-7));
  }
}

TEST_F(BackwardPoolNormTest, AvgPoolBackwardMatchesCpu) {
  OpHarness h;
  uint64_t seed = 300;
  for (DType t : kFloatTypes) {
    for (const PoolCase& c : pool_cases()) {
      if (!c.pool.dilations.empty()) continue;  // avg_pool has no dilation
      for (bool include_pad : {false, true}) {
        SCOPED_TRACE(cat(c.name, " ", dtype_name(t), include_pad ? " include pad" : ""));
        PoolAttrs pool = c.pool;
        pool.count_include_pad = include_pad;
        const BuiltNode forward = build_node(OpKind::avg_pool, pool, {Tensor::zeros(t, c.x)});
        Tensor dy = random_tensor(t, forward.outputs[0].shape, seed++, -1, 1);
        const PoolBackwardAttrs attrs{pool, c.x};
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(all_close(h.run(avg_pool_backward, OpKind::avg_pool_backward, attrs, {dy})[0],
                              run_op(OpKind::avg_pool_backward, attrs, {dy})[0], tol.rtol * 2,
                              tol.atol * 2));
      }
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
