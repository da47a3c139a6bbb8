// CPU convolution kernels: forward against the direct definition, the backward ops
// against the scatter definition and the adjoint identity
//   <conv(x, w), dy> = <x, conv_backward_data(dy, w)> = <w, conv_backward_filter(x, dy)>,
// over seeded random configurations (1-3 spatial dims, groups and depthwise, stride,
// dilation, asymmetric pads, bias; f64, f32, bf16, f16), hand-picked shapes that take
// the kernels' other paths (1x1, many channels, many outputs), transposed convolution
// with output padding, and the ONNX node test data.
#include <chrono>
#include <cstdio>
#include <ctime>

#include "conv_reference.h"
#include "fusebox/core/parallel.h"

namespace fusebox::cpu::test {
namespace {

using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

constexpr DType kDTypes[] = {DType::f64, DType::f32, DType::bf16, DType::f16};

Shape spatial(const Shape& s) {
  return Shape(s.begin() + 2, s.end());
}

// The inputs of one case, seeded by `seed`, in the case's dtype.
struct ConvData {
  Tensor x, w, bias_k, bias_c, dy;
};
ConvData make_data(const ConvCase& c, uint64_t seed) {
  ConvData d;
  d.x = random_tensor(c.dtype, c.x, seed);
  d.w = random_tensor(c.dtype, c.w, seed + 1);
  d.dy = random_tensor(c.dtype, c.y(), seed + 2);
  if (c.bias) {
    d.bias_k = random_tensor(c.dtype, {c.w[0]}, seed + 3);
    d.bias_c = random_tensor(c.dtype, {c.x[1]}, seed + 4);
  }
  return d;
}

Tensor run_conv(const ConvCase& c, const Tensor& x, const Tensor& w, const Tensor& bias) {
  return run_op(OpKind::conv, c.attrs, {x, w, bias})[0];
}
Tensor run_backward_data(const ConvCase& c, const Tensor& dy, const Tensor& w, const Tensor& bias) {
  return run_op(OpKind::conv_backward_data, ConvBackwardDataAttrs{c.attrs, spatial(c.x)},
                {dy, w, bias})[0];
}
Tensor run_backward_filter(const ConvCase& c, const Tensor& x, const Tensor& dy) {
  return run_op(OpKind::conv_backward_filter, ConvBackwardFilterAttrs{c.attrs, spatial(c.w)},
                {x, dy})[0];
}

// Runs all three ops on one case and compares them with their definitions.
void check_case(const ConvCase& c, uint64_t seed) {
  SCOPED_TRACE(c.describe());
  const ConvData d = make_data(c, seed);
  const Tensor y = run_conv(c, d.x, d.w, d.bias_k);
  EXPECT_EQ(y.dtype(), c.dtype);
  EXPECT_TRUE(
      matches_reference(y, conv_reference(c, d.x, d.w, c.bias ? &d.bias_k : nullptr), "conv"));
  const Tensor dx = run_backward_data(c, d.dy, d.w, d.bias_c);
  EXPECT_TRUE(matches_reference(
      dx, conv_backward_data_reference(c, d.dy, d.w, c.bias ? &d.bias_c : nullptr),
      "conv_backward_data"));
  const Tensor dw = run_backward_filter(c, d.x, d.dy);
  EXPECT_TRUE(
      matches_reference(dw, conv_backward_filter_reference(c, d.x, d.dy), "conv_backward_filter"));
}

TEST(CpuConv, RandomConfigsMatchDefinitions) {
  std::mt19937_64 rng(2024);
  for (int i = 0; i < 120; ++i) {
    const ConvCase c = random_conv_case(rng, 1 + i % 3, kDTypes[i % 4]);
    check_case(c, uint64_t(100 * i));
  }
}

TEST(CpuConv, AdjointIdentityF64) {
  std::mt19937_64 rng(77);
  for (int i = 0; i < 100; ++i) {
    ConvCase c = random_conv_case(rng, 1 + i % 3, DType::f64);
    c.bias = false;  // bias is affine, not linear
    SCOPED_TRACE(c.describe());
    const ConvData d = make_data(c, uint64_t(1000 + 10 * i));
    const Tensor y = run_conv(c, d.x, d.w, Tensor());
    const Tensor dx = run_backward_data(c, d.dy, d.w, Tensor());
    const Tensor dw = run_backward_filter(c, d.x, d.dy);
    // Every product x*w*dy enters each inner product once: the sum of their
    // magnitudes bounds the rounding error.
    const Reference ref = conv_reference(c, d.x, d.w, nullptr);
    double scale = 0;
    for (int64_t j = 0; j < d.dy.numel(); ++j)
      scale += ref.magnitude[size_t(j)] * std::fabs(d.dy.get(j));
    const double y_dy = dot(y, d.dy);
    EXPECT_NEAR(dot(d.x, dx), y_dy, 1e-13 * scale + 1e-300);
    EXPECT_NEAR(dot(d.w, dw), y_dy, 1e-13 * scale + 1e-300);
  }
}

ConvCase make_case(Shape x, Shape w, ConvAttrs a, bool bias, DType dtype) {
  const size_t rank = w.size() - 2;
  if (a.strides.empty()) a.strides.assign(rank, 1);
  if (a.dilations.empty()) a.dilations.assign(rank, 1);
  if (a.pads_begin.empty()) a.pads_begin.assign(rank, 0);
  if (a.pads_end.empty()) a.pads_end.assign(rank, 0);
  return ConvCase{std::move(x), std::move(w), std::move(a), bias, dtype};
}

// Shapes that reach the paths small random cases do not: 1x1 convs that skip im2col,
// many channels (the GEMM's K split into slices, the output split into blocks in the
// backward ops), many output positions (the forward split across threads).
TEST(CpuConv, PointwiseManyChannelsAndLargeOutputs) {
  const ConvCase cases[] = {
      make_case({2, 6, 5, 7}, {4, 6, 1, 1}, {}, true, DType::f32),                    // 1x1
      make_case({1, 6, 9}, {6, 3, 1}, {.groups = 2}, true, DType::f64),               // grouped 1x1
      make_case({1, 4, 9, 9}, {3, 4, 1, 1}, {.strides = {2, 2}}, false, DType::f32),  // strided
      make_case({1, 4, 6, 6}, {3, 4, 1, 1}, {.pads_begin = {1, 0}, .pads_end = {0, 1}}, true,
                DType::f64),
      // 1x1 with stride 2 and an end pad: O == D, yet the last output reads padding.
      make_case({1, 3, 2, 2}, {2, 3, 1, 1}, {.strides = {2, 2}, .pads_end = {1, 1}}, true,
                DType::f64),
      make_case({1, 300, 10, 10}, {5, 300, 3, 3}, {.pads_begin = {1, 1}, .pads_end = {1, 1}}, true,
                DType::f32),
      make_case({1, 300, 10, 10}, {6, 100, 3, 3},
                {.pads_begin = {1, 1}, .pads_end = {1, 1}, .groups = 3}, false, DType::f64),
      make_case({1, 3, 41, 39}, {8, 3, 3, 3}, {.pads_begin = {1, 1}, .pads_end = {1, 1}}, true,
                DType::f32),
      make_case({2, 16, 30, 30}, {16, 1, 3, 3},
                {.strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}, .groups = 16}, true,
                DType::bf16),
      make_case({1, 2, 200}, {3, 2, 5}, {.dilations = {3}, .pads_begin = {4}}, true, DType::f16),
  };
  uint64_t seed = 5000;
  for (const ConvCase& c : cases) check_case(c, seed += 10);
}

// A transposed convolution is conv_backward_data with the output extent
// D = (O-1)*stride - pads + dilation*(R-1) + 1 + output_padding; the output padding
// rows see only the taps that reach them, plus the bias.
TEST(CpuConv, TransposedConvolutionWithOutputPadding) {
  for (DType dtype : {DType::f64, DType::f32}) {
    // ConvTranspose x [1, 2, 3, 4] (2 channels in), weight [2, 3, 3, 2] (3 out), stride
    // (3, 2), pads 1 each side of dim 0, output_padding (2, 1).
    ConvCase c =
        make_case({1, 3, 0, 0}, {2, 3, 3, 2},
                  {.strides = {3, 2}, .pads_begin = {1, 0}, .pads_end = {1, 0}}, true, dtype);
    const int64_t o0 = 3, o1 = 4, out_pad0 = 2, out_pad1 = 1;
    c.x[2] = (o0 - 1) * 3 - 2 + (3 - 1) + 1 + out_pad0;
    c.x[3] = (o1 - 1) * 2 - 0 + (2 - 1) + 1 + out_pad1;
    ASSERT_EQ(c.y(), (Shape{1, 2, o0, o1}));
    const ConvData d = make_data(c, 99);
    const Tensor dx = run_backward_data(c, d.dy, d.w, d.bias_c);
    EXPECT_EQ(dx.shape(), (Shape{1, 3, 9, 9}));
    EXPECT_TRUE(matches_reference(dx, conv_backward_data_reference(c, d.dy, d.w, &d.bias_c),
                                  "transposed conv"));
  }
  // ONNX's ConvTranspose 1-D example: x [0, 1, 2], two all-ones filters of 3.
  const Tensor x = Tensor::from_vector<float>({1, 1, 3}, {0, 1, 2});
  const Tensor w = Tensor::full(DType::f32, {1, 2, 3}, 1.0);
  const Tensor y =
      run_op(OpKind::conv_backward_data, ConvBackwardDataAttrs{ConvAttrs{}, {5}}, {x, w})[0];
  EXPECT_TRUE(fusebox::testing::all_close(
      y, Tensor::from_vector<float>({1, 2, 5}, {0, 1, 3, 3, 2, 0, 1, 3, 3, 2}), 0, 0));
}

TEST(CpuConv, ExactSmallExample) {
  // 1-D, x = [1, 2, 3, 4], w = [1, 10], stride 2, pad 1 each side: windows
  // [pad, 1], [2, 3], [4, pad] -> [10, 32, 4] (+ bias 0.5).
  const Tensor x = Tensor::from_vector<double>({1, 1, 4}, {1, 2, 3, 4});
  const Tensor w = Tensor::from_vector<double>({1, 1, 2}, {1, 10});
  const Tensor b = Tensor::from_vector<double>({1}, {0.5});
  const Tensor y = run_op(
      OpKind::conv, ConvAttrs{.strides = {2}, .pads_begin = {1}, .pads_end = {1}}, {x, w, b})[0];
  EXPECT_TRUE(fusebox::testing::all_close(
      y, Tensor::from_vector<double>({1, 1, 3}, {10.5, 32.5, 4.5}), 0, 0));
}

// ONNX Conv / ConvTranspose node tests, with their attributes spelt out as ours.
TEST(CpuConv, OnnxNodeTestData) {
  struct OnnxCase {
    const char* name;
    bool transposed;
    ConvAttrs attrs;
    Shape output_padding;
  };
  const OnnxCase cases[] = {
      {"test_basic_conv_with_padding", false, {.pads_begin = {1, 1}, .pads_end = {1, 1}}, {}},
      {"test_basic_conv_without_padding", false, {}, {}},
      {"test_conv_with_strides_and_asymmetric_padding",
       false,
       {.strides = {2, 2}, .pads_begin = {1, 0}, .pads_end = {1, 0}},
       {}},
      {"test_conv_with_strides_padding",
       false,
       {.strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}},
       {}},
      {"test_convtranspose", true, {}, {0, 0}},
      {"test_convtranspose_1d", true, {}, {0}},
      {"test_convtranspose_3d", true, {}, {0, 0, 0}},
      {"test_convtranspose_dilations", true, {.dilations = {2, 2}}, {0, 0}},
      {"test_convtranspose_pad", true, {.strides = {3, 2}}, {1, 1}},
      {"test_convtranspose_pads",
       true,
       {.strides = {3, 2}, .pads_begin = {1, 2}, .pads_end = {1, 2}},
       {0, 0}},
  };
  for (const OnnxCase& oc : cases) {
    SCOPED_TRACE(oc.name);
    std::vector<Tensor> in, out;
    if (!load_onnx_node_test(oc.name, &in, &out)) GTEST_SKIP() << "no ONNX test data";
    ConvAttrs a = oc.attrs;
    const size_t rank = in[1].shape().size() - 2;
    if (a.strides.empty()) a.strides.assign(rank, 1);
    if (a.dilations.empty()) a.dilations.assign(rank, 1);
    if (a.pads_begin.empty()) a.pads_begin.assign(rank, 0);
    if (a.pads_end.empty()) a.pads_end.assign(rank, 0);
    Tensor y;
    if (!oc.transposed) {
      y = run_op(OpKind::conv, a, {in[0], in[1]})[0];
    } else {
      Shape extent;
      for (size_t d = 0; d < rank; ++d)
        extent.push_back((in[0].dim(2 + d) - 1) * a.strides[d] - a.pads_begin[d] - a.pads_end[d] +
                         a.dilations[d] * (in[1].dim(2 + d) - 1) + 1 + oc.output_padding[d]);
      y = run_op(OpKind::conv_backward_data, ConvBackwardDataAttrs{a, extent}, {in[0], in[1]})[0];
    }
    EXPECT_TRUE(fusebox::testing::all_close(y, out[0], 1e-5, 1e-5));
  }
}

// Not a correctness test: prints the throughput of a ResNet-50-like layer, and checks a
// few output elements so that the timed work is the right work.
TEST(CpuConv, TimingResNetLayers) {
  struct Layer {
    const char* name;
    ConvCase c;
  };
  const Layer layers[] = {
      {"stem 7x7/2 C3->64 224x224",
       make_case({1, 3, 224, 224}, {64, 3, 7, 7},
                 {.strides = {2, 2}, .pads_begin = {3, 3}, .pads_end = {3, 3}}, false, DType::f32)},
      {"3x3 C64->64 56x56",
       make_case({1, 64, 56, 56}, {64, 64, 3, 3}, {.pads_begin = {1, 1}, .pads_end = {1, 1}}, false,
                 DType::f32)},
      {"1x1 C256->64 56x56", make_case({1, 256, 56, 56}, {64, 256, 1, 1}, {}, false, DType::f32)},
      {"3x3 C512->512 7x7",
       make_case({1, 512, 7, 7}, {512, 512, 3, 3}, {.pads_begin = {1, 1}, .pads_end = {1, 1}},
                 false, DType::f32)},
  };
  for (const Layer& layer : layers) {
    const ConvCase& c = layer.c;
    const ConvData d = make_data(c, 7);
    const Shape y_shape = c.y();
    const double flops = 2.0 * double(numel(y_shape)) * double(numel(c.w) / c.w[0]);
    Tensor y = run_conv(c, d.x, d.w, Tensor());  // warm-up
    const int reps = 5;
    const auto wall_start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    for (int i = 0; i < reps; ++i) y = run_conv(c, d.x, d.w, Tensor());
    const double cpu = double(std::clock() - cpu_start) / CLOCKS_PER_SEC / reps;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count() / reps;
    // GFLOP per CPU-second is the per-core rate, whatever else shares the machine.
    std::printf(
        "[ timing   ] conv %-26s %7.2f ms %6.1f GFLOP/s wall, %5.1f per CPU-second (%d threads)\n",
        layer.name, wall * 1e3, flops / wall * 1e-9, flops / cpu * 1e-9, num_threads());
    // Spot checks: a few outputs by the definition.
    const std::vector<double> xs = d.x.to_doubles(), ws = d.w.to_doubles();
    std::mt19937_64 rng(3);
    for (int probe = 0; probe < 8; ++probe) {
      const int64_t k = int64_t(rng() % uint64_t(y_shape[1]));
      const int64_t o0 = int64_t(rng() % uint64_t(y_shape[2]));
      const int64_t o1 = int64_t(rng() % uint64_t(y_shape[3]));
      double want = 0, magnitude = 0;
      for (int64_t ch = 0; ch < c.w[1]; ++ch)
        for (int64_t r0 = 0; r0 < c.w[2]; ++r0)
          for (int64_t r1 = 0; r1 < c.w[3]; ++r1) {
            const int64_t i0 = o0 * c.attrs.strides[0] - c.attrs.pads_begin[0] + r0;
            const int64_t i1 = o1 * c.attrs.strides[1] - c.attrs.pads_begin[1] + r1;
            if (i0 < 0 || i0 >= c.x[2] || i1 < 0 || i1 >= c.x[3]) continue;
            const double term = xs[size_t((ch * c.x[2] + i0) * c.x[3] + i1)] *
                                ws[size_t(((k * c.w[1] + ch) * c.w[2] + r0) * c.w[3] + r1)];
            want += term;
            magnitude += std::fabs(term);
          }
      EXPECT_NEAR(y.get((k * y_shape[2] + o0) * y_shape[3] + o1), want, 1e-5 * magnitude)
          << layer.name << " k " << k << " at " << o0 << "," << o1;
    }
  }
}

}  // namespace
}  // namespace fusebox::cpu::test
