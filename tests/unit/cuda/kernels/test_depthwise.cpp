// The depthwise kernels (kernels/conv/depthwise/) on the GPU against the CPU reference: 240
// random depthwise configurations per op over 1-3 spatial dims, strides, dilation, asymmetric
// pads, C a multiple of 8, f32 / f16 / bf16, NCHW and channels-last tensors, bias and fprop
// epilogues, under FUSEBOX_CONV_BACKEND=own (these kernels) and auto (cuDNN, but for what
// depthwise_beats_cudnn routes here). Outputs are poisoned; the decision record must name the
// path.
#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

class DepthwiseTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

ConvConfig random_depthwise(std::mt19937_64& rng, OpKind op) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  ConvConfig c;
  c.op = op;
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  c.dtype = types[pick(0, 2)];
  const int rank = int(pick(1, 3));
  c.in_channels = c.out_channels = c.groups = 8 * pick(1, 5);
  c.batch = pick(1, 3);
  c.bias = op != OpKind::conv_backward_filter && pick(0, 1) == 1;
  c.channels_last = pick(0, 3) > 0;
  if (op == OpKind::conv && pick(0, 2) == 0) {
    c.activation.kind = pick(0, 1) ? Activation::relu : Activation::gelu_tanh;
    c.residual = pick(0, 1) == 1;
  }
  random_window(c, rng, rank, {{5, 4, 3}, {40, 15, 7}, {5, 7}, 4, 3});
  return c;
}

TEST_F(DepthwiseTest, RandomConfigurationsMatchCpuOwnAndAuto) {
  OpHarness h;
  TempDir cache("depthwise");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", std::nullopt);
  std::mt19937_64 rng(20261125);
  constexpr int kPerOp = 240;
  for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
    for (int i = 0; i < kPerOp; ++i) {
      const ConvConfig c = random_depthwise(rng, op);
      SCOPED_TRACE(cat("config ", i, ": ", c.describe()));
      const std::vector<Tensor> in = conv_inputs(c, 9000 + 10 * uint64_t(i));
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      for (const char* backend : {"own", "auto"}) {
        ScopedEnv env("FUSEBOX_CONV_BACKEND", backend);
        clear_conv_decisions();
        const Tensor got = run_conv_on_gpu(h, c, in);
        ASSERT_FALSE(conv_decisions().empty());
        const ConvDecision d = conv_decisions().back();
        const bool own = std::string(backend) == "own";
        const bool ours = d.plan.rfind("depthwise", 0) == 0;
        // auto: cuDNN, but for the problems depthwise_beats_cudnn routes to these kernels.
        if (own) {
          EXPECT_TRUE(ours) << backend << ": " << d.path << " " << d.plan;
        } else if (ours) {
          EXPECT_NE(d.reason.find("depthwise_beats_cudnn"), std::string::npos)
              << d.path << " " << d.reason;
        }
        // f32 in f32 multiply-adds on this path (cuDNN's auto wgrad may use TF32).
        const double tol = 2 * conv_l2_tolerance(c.dtype, !ours);
        EXPECT_LE(relative_l2_error(got, want), tol) << backend << ": " << d.plan;
      }
    }
  }
}

// The rows kernels (depthwise/rows.cuh) at the sizes they are for: each filter width, stride
// 1 and 2, runs that end inside a row, row blocks that do not divide the rows, C = 8 (one
// vector) to 96, every epilogue (3- and 5-wide fprops with activation and residual, 7-wide
// with the bias alone). Under own the plan must say which kernel ran ("rows": all but the
// strided dgrad); by default (auto, no autotuning) these kernels must take the stride-1
// dgrads and 7-wide fprops (depthwise_beats_cudnn) and cuDNN the rest.
TEST_F(DepthwiseTest, RowsKernelsMatchCpuAtModelSizes) {
  OpHarness h;
  TempDir cache("depthwise_rows");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", std::nullopt);
  struct Case {
    int64_t channels, size, filter, stride;
    DType dtype;
  };
  const Case cases[] = {{64, 56, 3, 1, DType::bf16}, {64, 29, 3, 2, DType::bf16},
                        {48, 27, 5, 1, DType::f16},  {96, 23, 7, 1, DType::bf16},
                        {32, 14, 7, 2, DType::f32},  {8, 9, 5, 2, DType::bf16}};
  int seed = 0;
  for (const Case& k : cases) {
    for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
      ConvConfig c;
      c.op = op;
      c.dtype = k.dtype;
      c.batch = 2;
      c.in_channels = c.out_channels = c.groups = k.channels;
      c.spatial = {k.size, k.size + 3}, c.filter = {k.filter, k.filter};
      c.strides = {k.stride, k.stride}, c.dilations = {1, 1};
      c.pads_begin = {k.filter / 2, k.filter / 2}, c.pads_end = {k.filter / 2, 0};
      c.channels_last = true;
      c.bias = op != OpKind::conv_backward_filter;
      if (op == OpKind::conv && k.filter != 7) {
        c.activation.kind = Activation::relu;
        c.residual = true;
      }
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 500 + uint64_t(seed++));
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      for (const char* backend : {"own", "auto"}) {
        ScopedEnv env("FUSEBOX_CONV_BACKEND", backend);
        clear_conv_decisions();
        const Tensor got = run_conv_on_gpu(h, c, in);
        const std::string plan = conv_decisions().back().plan;
        bool rows = op != OpKind::conv_backward_data || k.stride == 1;
        if (std::string(backend) == "auto")
          rows = k.stride == 1 &&
                 (op == OpKind::conv_backward_data || (op == OpKind::conv && k.filter == 7));
        EXPECT_EQ(plan.find(", rows") != std::string::npos, rows) << backend << ": " << plan;
        const bool cudnn = plan.rfind("depthwise", 0) != 0;  // may use TF32 for f32
        EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, cudnn))
            << backend << ": " << plan;
      }
    }
  }
}

// A wgrad whose pixel count does not divide into the heuristic's splits (2 x 192^2 pixels,
// C = 256 in bf16: ~1056 splits of 70 pixels): every split must be written, the empty ones
// as zeros, or the split sums read uninitialised memory.
TEST_F(DepthwiseTest, WgradSplitsCoverEveryPixel) {
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  ConvConfig c;
  c.op = OpKind::conv_backward_filter;
  c.dtype = DType::bf16;
  c.batch = 2;
  c.in_channels = c.out_channels = c.groups = 256;
  c.spatial = {192, 192}, c.filter = {3, 3}, c.strides = {1, 1}, c.dilations = {1, 1};
  c.pads_begin = c.pads_end = {1, 1};
  c.channels_last = true;
  const std::vector<Tensor> in = conv_inputs(c, 77);
  const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
  clear_conv_decisions();
  const Tensor got = run_conv_on_gpu(h, c, in);
  EXPECT_EQ(conv_decisions().back().plan.rfind("depthwise", 0), 0u) << conv_decisions().back().plan;
  EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, false));
}

}  // namespace
}  // namespace fusebox::cuda::testing
