// CUDA pooling and the direct convolution kernels (kernels/conv/direct.h: the fallback path; the
// dispatcher and cuDNN are tested in test_conv_*.cpp) against the CPU backend and against
// host references computed here (pool backward passes): 1-D to 3-D, strides, dilation,
// asymmetric pads, ceil_mode, count_include_pad, groups / depthwise, batch 1, odd channel
// counts; outputs poisoned first.
//
// Tolerances: max_pool and its indices are exact (a max picks an element); avg_pool sums
// in the CPU kernel's order, so f32 is within a few ulps; convolutions sum up to a few
// hundred products in another order: relative L2 error 1e-5 (f32), 3e-3 (f16), 2e-2
// (bf16, one rounding of the output), 1e-12 (f64), and elementwise 1e-4 + 1e-4 |want| for
// f32.
#include <cmath>
#include <limits>

#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/pool/direct.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

::testing::AssertionResult close_in_norm(const Tensor& got, const Tensor& want, double tol) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  }
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) {
      return ::testing::AssertionFailure() << "element " << i << " is " << g[i];
    }
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  const double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative L2 error " << rel << " > " << tol;
}

double conv_tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 3e-3;
    default:
      return 2e-2;
  }
}

class PoolConvTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

// ---- pooling ------------------------------------------------------------------------

struct PoolCase {
  Shape x;
  PoolAttrs attrs;
};

std::vector<PoolCase> pool_cases() {
  auto attrs = [](std::vector<int64_t> kernel, std::vector<int64_t> strides,
                  std::vector<int64_t> dilations, std::vector<int64_t> pb, std::vector<int64_t> pe,
                  bool ceil_mode, bool include_pad) {
    PoolAttrs a;
    a.kernel = std::move(kernel);
    a.strides = std::move(strides);
    a.dilations = std::move(dilations);
    a.pads_begin = std::move(pb);
    a.pads_end = std::move(pe);
    a.ceil_mode = ceil_mode;
    a.count_include_pad = include_pad;
    return a;
  };
  return {
      {{2, 3, 11}, attrs({3}, {2}, {}, {1}, {0}, false, false)},
      {{1, 5, 10}, attrs({2}, {2}, {}, {}, {}, true, false)},
      {{2, 3, 8, 8}, attrs({2, 2}, {2, 2}, {}, {}, {}, false, false)},
      {{2, 4, 9, 7}, attrs({3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, false, true)},
      {{1, 3, 10, 9}, attrs({3, 2}, {2, 3}, {}, {1, 0}, {0, 1}, true, true)},
      {{2, 2, 7, 7}, attrs({3, 3}, {1, 1}, {}, {1, 1}, {1, 1}, false, false)},
      {{1, 7, 12, 12}, attrs({3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, true, false)},
      {{2, 3, 5, 6, 7}, attrs({2, 3, 2}, {2, 1, 2}, {}, {0, 1, 1}, {1, 1, 0}, false, true)},
      {{1, 2, 6, 5, 4}, attrs({3, 3, 3}, {2, 2, 2}, {}, {1, 1, 1}, {1, 1, 1}, true, false)},
      {{64, 16, 56, 56}, attrs({3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, false, false)},
  };
}

// Dilated windows (max_pool only).
std::vector<PoolCase> dilated_cases() {
  PoolAttrs a;
  a.kernel = {3, 2};
  a.strides = {1, 2};
  a.dilations = {2, 3};
  a.pads_begin = {2, 1};
  a.pads_end = {1, 2};
  PoolAttrs b;
  b.kernel = {2};
  b.strides = {3};
  b.dilations = {4};
  b.pads_begin = {3};
  b.pads_end = {3};
  b.ceil_mode = true;
  return {{{2, 3, 9, 11}, a}, {{1, 2, 13}, b}};
}

TEST_F(PoolConvTest, MaxPoolAndIndicesMatchCpu) {
  OpHarness h;
  uint64_t seed = 1;
  std::vector<PoolCase> cases = pool_cases();
  for (const PoolCase& c : dilated_cases()) cases.push_back(c);
  for (DType t : kFloatTypes) {
    for (PoolCase c : cases) {
      for (bool indices : {false, true}) {
        SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.x), indices ? " indices" : ""));
        c.attrs.return_indices = indices;
        c.attrs.count_include_pad = false;
        Tensor x = random_tensor(t, c.x, seed++, -3, 3);
        const std::vector<Tensor> want = run_op(OpKind::max_pool, c.attrs, {x});
        const std::vector<Tensor> got = h.run(&max_pool, OpKind::max_pool, c.attrs, {x});
        ASSERT_EQ(got.size(), want.size());
        EXPECT_TRUE(all_close(got[0], want[0], 0, 0));
        if (indices) EXPECT_TRUE(all_close(got[1], want[1], 0, 0));
      }
    }
  }
}

TEST_F(PoolConvTest, MaxPoolPropagatesNaN) {
  OpHarness h;
  Tensor x = random_tensor(DType::f32, {1, 1, 4, 4}, 3);
  x.set(5, std::nan(""));
  PoolAttrs a;
  a.kernel = {2, 2};
  a.strides = {2, 2};
  a.return_indices = true;
  const std::vector<Tensor> want = run_op(OpKind::max_pool, a, {x});
  const std::vector<Tensor> got = h.run(&max_pool, OpKind::max_pool, a, {x});
  EXPECT_TRUE(std::isnan(got[0].get(0)));
  EXPECT_EQ(got[1].get(0), 5);
  EXPECT_TRUE(all_close(got[1], want[1], 0, 0));
  EXPECT_TRUE(all_close(got[0], want[0], 0, 0));  // NaN matches NaN
}

TEST_F(PoolConvTest, AvgPoolMatchesCpu) {
  OpHarness h;
  uint64_t seed = 100;
  for (DType t : kFloatTypes) {
    for (PoolCase c : pool_cases()) {
      for (bool include_pad : {false, true}) {
        SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.x), include_pad ? " include_pad" : ""));
        c.attrs.count_include_pad = include_pad;
        Tensor x = random_tensor(t, c.x, seed++);
        const std::vector<Tensor> want = run_op(OpKind::avg_pool, c.attrs, {x});
        const std::vector<Tensor> got = h.run(&avg_pool, OpKind::avg_pool, c.attrs, {x});
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(all_close(got[0], want[0], tol.rtol, tol.atol));
      }
    }
  }
}

TEST_F(PoolConvTest, GlobalAvgPoolMatchesCpu) {
  OpHarness h;
  uint64_t seed = 200;
  const Shape shapes[] = {{2, 3, 1},       {4, 5, 7, 7},    {1, 3, 224, 224},
                          {8, 2048, 7, 7}, {2, 3, 4, 5, 6}, {3, 1, 1500}};
  for (DType t : kFloatTypes) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape)));
      Tensor x = random_tensor(t, shape, seed++);
      const std::vector<Tensor> want = run_op(OpKind::global_avg_pool, {}, {x});
      const std::vector<Tensor> got = h.run(&global_avg_pool, OpKind::global_avg_pool, {}, {x});
      const Tolerance tol = tolerance_for(t);
      EXPECT_TRUE(all_close(got[0], want[0], tol.rtol * 4, tol.atol * 4));
    }
  }
}

// Host references of the pool backward passes, by scatter over the forward's windows.
// The CPU forward's indices give max_pool's; avg_pool's divisors are recomputed here.
Tensor reference_max_pool_backward(const Tensor& dy, const Tensor& indices, const Shape& x) {
  std::vector<double> dx(size_t(numel(x)), 0.0);
  const std::vector<double> g = dy.to_doubles(), idx = indices.to_doubles();
  for (size_t i = 0; i < g.size(); ++i)
    if (idx[i] >= 0) dx[size_t(idx[i])] += g[i];
  return Tensor::from_doubles(DType::f64, x, dx);
}

Tensor reference_avg_pool_backward(const PoolAttrs& a, const Tensor& dy, const Shape& x) {
  // Pad the geometry to 3 spatial dims.
  const size_t rank = x.size() - 2;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1},
          pb[3] = {0, 0, 0}, pe[3] = {0, 0, 0};
  for (size_t d = 0; d < rank; ++d) {
    const size_t i = 3 - rank + d;
    in[i] = x[2 + d];
    out[i] = dy.shape()[2 + d];
    k[i] = a.kernel[d];
    s[i] = a.strides[d];
    pb[i] = a.pads_begin[d];
    pe[i] = a.pads_end[d];
  }
  const int64_t planes = x[0] * x[1], in_size = in[0] * in[1] * in[2];
  const int64_t out_size = out[0] * out[1] * out[2];
  std::vector<double> dx(size_t(planes * in_size), 0.0);
  const std::vector<double> g = dy.to_doubles();
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t o = 0; o < out_size; ++o) {
      const int64_t oc[3] = {o / (out[1] * out[2]), o / out[2] % out[1], o % out[2]};
      int64_t lo[3], hi[3], padded = 1, inside = 1;
      for (int d = 0; d < 3; ++d) {
        const int64_t start = oc[d] * s[d] - pb[d];
        lo[d] = std::max<int64_t>(start, 0);
        hi[d] = std::min<int64_t>(start + k[d], in[d]);
        padded *= std::min<int64_t>(start + k[d], in[d] + pe[d]) - std::max<int64_t>(start, -pb[d]);
        inside *= hi[d] - lo[d];
      }
      const double share =
          g[size_t(p * out_size + o)] / double(a.count_include_pad ? padded : inside);
      for (int64_t i0 = lo[0]; i0 < hi[0]; ++i0)
        for (int64_t i1 = lo[1]; i1 < hi[1]; ++i1)
          for (int64_t i2 = lo[2]; i2 < hi[2]; ++i2)
            dx[size_t(p * in_size + (i0 * in[1] + i1) * in[2] + i2)] += share;
    }
  }
  return Tensor::from_doubles(DType::f64, x, dx);
}

TEST_F(PoolConvTest, PoolBackwardMatchesScatterReference) {
  OpHarness h;
  uint64_t seed = 300;
  std::vector<PoolCase> cases = pool_cases();
  cases.pop_back();  // the large case adds nothing here
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    for (PoolCase c : cases) {
      for (bool include_pad : {false, true}) {
        SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.x), include_pad ? " include_pad" : ""));
        c.attrs.count_include_pad = include_pad;
        c.attrs.return_indices = true;
        Tensor x = random_tensor(t, c.x, seed++);
        const std::vector<Tensor> fwd = run_op(OpKind::max_pool, c.attrs, {x});
        Tensor dy = random_tensor(t, fwd[0].shape(), seed++);
        DeviceTensor dyd = h.upload(dy), idx = h.upload(fwd[1]);
        // The forward's normalised attributes, as autodiff will pass them.
        const PoolAttrs normalised =
            std::get<PoolAttrs>(build_node(OpKind::max_pool, c.attrs, {x}).node.attrs);
        DeviceTensor dx = h.poisoned({t, c.x});
        max_pool_backward(h.ctx(), normalised, dyd, idx, dx);
        EXPECT_TRUE(close_in_norm(h.download(dx), reference_max_pool_backward(dy, fwd[1], c.x),
                                  conv_tolerance(t)))
            << "max";
        PoolAttrs avg = normalised;
        avg.return_indices = false;
        const std::vector<Tensor> avg_fwd = run_op(OpKind::avg_pool, avg, {x});
        ASSERT_EQ(avg_fwd[0].shape(), dy.shape());
        DeviceTensor dx2 = h.poisoned({t, c.x});
        avg_pool_backward(h.ctx(), avg, dyd, dx2);
        EXPECT_TRUE(close_in_norm(h.download(dx2), reference_avg_pool_backward(avg, dy, c.x),
                                  conv_tolerance(t)))
            << "avg";
      }
    }
  }
}

// ---- direct convolution ------------------------------------------------------------------

struct ConvCase {
  int64_t batch, in_channels, out_channels, groups;
  Shape spatial, filter;
  std::vector<int64_t> strides, dilations, pads_begin, pads_end;
  bool bias;
};

// 24 geometries; each runs fprop, dgrad and wgrad: 72 configurations.
std::vector<ConvCase> conv_cases() {
  return {
      // 1-D
      {2, 3, 4, 1, {11}, {3}, {1}, {1}, {1}, {1}, true},
      {1, 7, 5, 1, {16}, {5}, {2}, {1}, {2}, {1}, false},
      {3, 4, 6, 2, {13}, {3}, {1}, {2}, {0}, {3}, true},
      {2, 6, 6, 6, {9}, {3}, {2}, {1}, {1}, {0}, true},  // depthwise
      {1, 3, 2, 1, {1}, {1}, {1}, {1}, {0}, {0}, false},
      // 2-D
      {2, 3, 8, 1, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},
      {1, 3, 7, 1, {15, 13}, {7, 7}, {2, 2}, {1, 1}, {3, 3}, {3, 3}, true},   // stem-like
      {2, 8, 16, 1, {7, 7}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, {0, 0}, false},   // pointwise
      {2, 8, 4, 1, {8, 8}, {1, 1}, {2, 2}, {1, 1}, {0, 0}, {0, 0}, true},     // strided 1x1
      {1, 4, 4, 4, {10, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},   // depthwise
      {2, 6, 9, 3, {8, 7}, {3, 2}, {2, 1}, {1, 2}, {1, 0}, {2, 1}, true},     // grouped, asym
      {1, 7, 3, 1, {12, 10}, {3, 3}, {1, 1}, {2, 3}, {2, 3}, {2, 3}, false},  // dilated
      {3, 5, 5, 5, {6, 6}, {5, 5}, {1, 1}, {1, 1}, {2, 2}, {2, 2}, false},    // depthwise 5x5
      {1, 3, 3, 1, {5, 5}, {5, 5}, {1, 1}, {1, 1}, {0, 0}, {0, 0}, true},     // 1x1 output
      {2, 4, 8, 2, {9, 9}, {3, 3}, {3, 2}, {1, 1}, {0, 2}, {1, 0}, true},
      {1, 2, 3, 1, {6, 4}, {2, 3}, {1, 1}, {1, 1}, {0, 1}, {1, 0}, false},  // even kernel
      {2, 16, 32, 1, {14, 14}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},
      {1, 12, 6, 3, {5, 9}, {1, 3}, {1, 2}, {1, 1}, {0, 1}, {0, 1}, false},
      // 3-D
      {2, 3, 4, 1, {5, 6, 7}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, true},
      {1, 4, 4, 2, {7, 5, 6}, {2, 3, 2}, {2, 1, 2}, {1, 1, 1}, {1, 0, 1}, {0, 1, 0}, false},
      {1, 3, 3, 3, {6, 6, 6}, {3, 3, 3}, {1, 1, 1}, {2, 2, 1}, {2, 2, 1}, {2, 2, 1}, true},
      {2, 5, 2, 1, {4, 4, 4}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, false},
      {1, 2, 6, 2, {8, 7, 6}, {3, 2, 3}, {2, 2, 1}, {1, 2, 1}, {1, 1, 0}, {1, 0, 2}, true},
      {1, 1, 1, 1, {3, 3, 3}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, false},
  };
}

ConvAttrs attrs_of(const ConvCase& c) {
  ConvAttrs a;
  a.strides = c.strides;
  a.dilations = c.dilations;
  a.pads_begin = c.pads_begin;
  a.pads_end = c.pads_end;
  a.groups = c.groups;
  return a;
}

void expect_conv_close(const Tensor& got, const Tensor& want, DType t) {
  EXPECT_TRUE(close_in_norm(got, want, conv_tolerance(t)));
  if (t == DType::f32) EXPECT_TRUE(all_close(got, want, 1e-4, 1e-4));
}

TEST_F(PoolConvTest, ConvForwardDataAndFilterMatchCpu) {
  OpHarness h;
  uint64_t seed = 1000;
  int configurations = 0;
  const std::vector<ConvCase> cases = conv_cases();
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const ConvCase& c = cases[ci];
    // Every geometry in f32; every third also in f16, bf16 and f64.
    std::vector<DType> types = {DType::f32};
    if (ci % 3 == 0) types = {DType::f32, DType::f16, DType::bf16, DType::f64};
    for (DType t : types) {
      SCOPED_TRACE(cat("case ", ci, " ", dtype_name(t)));
      Shape x_shape = {c.batch, c.in_channels},
            w_shape = {c.out_channels, c.in_channels / c.groups};
      for (int64_t d : c.spatial) x_shape.push_back(d);
      for (int64_t r : c.filter) w_shape.push_back(r);
      const ConvAttrs attrs = attrs_of(c);
      Tensor x = random_tensor(t, x_shape, seed++), w = random_tensor(t, w_shape, seed++);
      Tensor bias = c.bias ? random_tensor(t, {c.out_channels}, seed++) : Tensor();
      // fprop
      const std::vector<Tensor> y = run_op(OpKind::conv, attrs, {x, w, bias});
      expect_conv_close(h.run(&conv_forward_direct, OpKind::conv, attrs, {x, w, bias})[0], y[0], t);
      // dgrad (bias per input channel)
      Tensor dy = random_tensor(t, y[0].shape(), seed++);
      Tensor dbias = c.bias ? random_tensor(t, {c.in_channels}, seed++) : Tensor();
      const ConvBackwardDataAttrs data_attrs{attrs, c.spatial};
      const std::vector<Tensor> dx = run_op(OpKind::conv_backward_data, data_attrs, {dy, w, dbias});
      expect_conv_close(h.run(&conv_backward_data_direct, OpKind::conv_backward_data, data_attrs,
                              {dy, w, dbias})[0],
                        dx[0], t);
      // wgrad
      const ConvBackwardFilterAttrs filter_attrs{attrs, c.filter};
      const std::vector<Tensor> dw = run_op(OpKind::conv_backward_filter, filter_attrs, {x, dy});
      expect_conv_close(h.run(&conv_backward_filter_direct, OpKind::conv_backward_filter,
                              filter_attrs, {x, dy})[0],
                        dw[0], t);
      configurations += 3;
    }
  }
  EXPECT_GE(configurations, 60);
}

TEST_F(PoolConvTest, ConvWgradSplitsLargeReductions) {
  // N x O = 8 x 32 x 32 = 8192 positions over few weights: the split reduction runs with
  // many splits; the result must not depend on it.
  OpHarness h;
  ConvAttrs attrs;
  attrs.pads_begin = {1, 1};
  attrs.pads_end = {1, 1};
  Tensor x = random_tensor(DType::f32, {8, 2, 32, 32}, 1);
  Tensor dy = random_tensor(DType::f32, {8, 3, 32, 32}, 2);
  const ConvBackwardFilterAttrs a{attrs, {3, 3}};
  const std::vector<Tensor> want = run_op(OpKind::conv_backward_filter, a, {x, dy});
  const std::vector<Tensor> got =
      h.run(&conv_backward_filter_direct, OpKind::conv_backward_filter, a, {x, dy});
  expect_conv_close(got[0], want[0], DType::f32);
}

TEST_F(PoolConvTest, ConvRejectsMismatchedShapes) {
  OpHarness h;
  Tensor x = random_tensor(DType::f32, {1, 4, 8, 8}, 1),
         w = random_tensor(DType::f32, {6, 4, 3, 3}, 2);
  BuiltNode built = build_node(OpKind::conv, ConvAttrs{}, {x, w});
  // A node whose output does not match its inputs (as a corrupted graph would have).
  built.outputs[0].shape = {1, 6, 7, 7};
  DeviceTensor xd = h.upload(x), wd = h.upload(w);
  EXPECT_THROW(h.run_device(&conv_forward_direct, built, {&xd, &wd}), Error);
}

// conv_epilogue (bias only): y[n, c, ...] += bias[c] on a channels-last (strided) y, exact in f32.
TEST_F(PoolConvTest, ConvAddBiasOnStridedOutput) {
  OpHarness h;
  const Shape shape = {2, 5, 3, 4};  // N C H W, stored as N H W C
  const Shape strides = {60, 1, 20, 5};
  Tensor stored = random_tensor(DType::f32, {120}, 1);
  Tensor bias = random_tensor(DType::f32, {5}, 2);
  DeviceTensor y = h.view(stored, shape, strides);
  DeviceTensor b = h.upload(bias);
  const BuiltNode built =
      build_node(OpKind::conv, ConvAttrs{},
                 {random_tensor(DType::f32, shape, 3), random_tensor(DType::f32, {5, 5, 1, 1}, 4)});
  conv_epilogue(h.ctx(), built.node, {.bias = &b}, y);
  Tensor got = Tensor::empty(DType::f32, {120});
  h.encoder().copy_to_host(got.raw(), y.buffer);
  const std::vector<double> before = stored.to_doubles(), after = got.to_doubles(),
                            add = bias.to_doubles();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(float(after[i]), float(before[i]) + float(add[i % 5])) << i;
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
