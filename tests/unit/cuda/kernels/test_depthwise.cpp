// The depthwise kernels (kernels/conv/engines/depthwise/) on the GPU against the CPU reference:
// 240 random depthwise configurations per op over 1-3 spatial dims, strides, dilation,
// asymmetric pads, C a multiple of 8, f32 / f16 / bf16, NCHW and channels-last tensors, bias and
// fprop epilogues, under FUSEBOX_CONV_BACKEND=own (these kernels) and auto (cuDNN, but for what
// the depthwise rules of kernels/conv/engines.cpp route here). Outputs are poisoned; the
// decision record must name the path.
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
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", std::nullopt);  // the default policy's rules
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
        // auto: cuDNN, but for the problems engines.cpp's depthwise rules route to these
        // kernels: every fprop with an epilogue (rule 1), what was measured faster (rule 2).
        if (own) {
          EXPECT_TRUE(ours) << backend << ": " << d.path << " " << d.plan;
        } else if (ours) {
          EXPECT_NE(d.reason.find("engines.cpp, rule"), std::string::npos)
              << d.path << " " << d.reason;
        }
        if (!own && op == OpKind::conv && (c.bias || c.activation || c.residual)) {
          EXPECT_TRUE(ours) << "rule 1: " << d.path << " " << d.plan;
        }
        // f32 in f32 multiply-adds on this path (cuDNN's auto wgrad may use TF32).
        const double tol = 2 * conv_l2_tolerance(c.dtype, !ours);
        EXPECT_LE(relative_l2_error(got, want), tol) << backend << ": " << d.plan;
      }
    }
  }
}

// The kernel depthwise.cu picks for a 2-D channels-last problem of the rows kernels' shape
// (3/5/7-wide filters, stride 1 or 2): "ring" (ring.cuh) where C / V divides by 4 for
// weight gradients and for stride-1 fprops and dgrads with rows of 7+ outputs, "rows"
// (rows.cuh) for the other fprops, wgrads and stride-1 dgrads, "" (the generic kernel) for
// strided dgrads. The rule of ring_shape, restated so that a change to it shows here.
std::string depthwise_kernel(const ConvConfig& c) {
  const int64_t vectors = c.in_channels / (16 / int64_t(dtype_size(c.dtype)));
  const bool stride1 = c.strides[0] == 1 && c.strides[1] == 1;
  const int64_t out_w = c.y_shape()[3], in_w = c.spatial[1];
  if (c.op == OpKind::conv_backward_data && !stride1) return "";
  if (vectors % 4 != 0) return "rows";
  switch (c.op) {
    case OpKind::conv_backward_filter:
      return "ring";
    case OpKind::conv_backward_data:
      return in_w >= 7 ? "ring" : "rows";
    default:
      return stride1 && out_w >= 7 ? "ring" : "rows";
  }
}

// A 2-D channels-last depthwise problem with the bias where the op has one.
ConvConfig depthwise_2d(OpKind op, DType dtype, int64_t batch, int64_t channels, Shape spatial,
                        int64_t filter, int64_t stride, int64_t dilation_h,
                        std::vector<int64_t> pads_begin, std::vector<int64_t> pads_end) {
  ConvConfig c;
  c.op = op;
  c.dtype = dtype;
  c.batch = batch;
  c.in_channels = c.out_channels = c.groups = channels;
  c.spatial = std::move(spatial), c.filter = {filter, filter};
  c.strides = {stride, stride}, c.dilations = {dilation_h, 1};
  c.pads_begin = std::move(pads_begin), c.pads_end = std::move(pads_end);
  c.channels_last = true;
  c.bias = op != OpKind::conv_backward_filter;
  return c;
}

// The rows and ring kernels (depthwise/rows.cuh, ring.cuh) at the sizes they are for: each
// filter width, stride 1 and 2, runs that end inside a row, row blocks that do not divide
// the rows, rows too short for the ring (5 outputs), C = 8 (one vector) to 96, every epilogue (3-
// and 5-wide fprops with activation and residual, 7-wide with the bias alone). Under own the plan
// must name the kernel depthwise_kernel says; by default (auto, no autotuning) these kernels must
// take what engines.cpp's depthwise rules name (rule 2: stride-1 dgrads, unfused 7-wide and
// ring 3-wide fprops, ring 3- and 7-wide wgrads, in bf16 / f16; every fprop here, which has a
// bias: engines.cpp's rule 1), the other bf16 / f16 problems are timed (rule 4: either may
// win) and cuDNN runs the f32 rest.
TEST_F(DepthwiseTest, RowsAndRingKernelsMatchCpuAtModelSizes) {
  OpHarness h;
  TempDir cache("depthwise_rows");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", std::nullopt);
  struct Case {
    int64_t channels, size, filter, stride;
    DType dtype;
  };
  // {64, 28, 7, 1}: rows of 28 outputs, the ring wgrad's runs of 7 (ConvNeXt's widths);
  // {32, 14, 7, 2}: rows of 7 at stride 2, the same.
  const Case cases[] = {{64, 56, 3, 1, DType::bf16}, {64, 29, 3, 2, DType::bf16},
                        {48, 27, 5, 1, DType::f16},  {96, 23, 7, 1, DType::bf16},
                        {64, 28, 7, 1, DType::bf16}, {32, 14, 7, 2, DType::f32},
                        {8, 9, 5, 2, DType::bf16},   {16, 3, 3, 1, DType::bf16}};
  int seed = 0;
  for (const Case& k : cases) {
    for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
      ConvConfig c = depthwise_2d(op, k.dtype, 2, k.channels, {k.size, k.size + 3}, k.filter,
                                  k.stride, 1, {k.filter / 2, k.filter / 2}, {k.filter / 2, 0});
      if (op == OpKind::conv && k.filter != 7) {
        c.activation.kind = Activation::relu;
        c.residual = true;
      }
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 500 + uint64_t(seed++));
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      const std::string kernel = depthwise_kernel(c);
      const bool half = k.dtype != DType::f32;
      bool beats_cudnn = false;  // engines.cpp's depthwise rules
      if (op == OpKind::conv_backward_data) beats_cudnn = half && k.stride == 1;
      if (op == OpKind::conv_backward_filter)
        beats_cudnn = half && (k.filter == 3 || k.filter == 7) && kernel == "ring";
      if (op == OpKind::conv) beats_cudnn = true;  // rule 1: the bias (and more) fused
      for (const char* backend : {"own", "auto"}) {
        ScopedEnv env("FUSEBOX_CONV_BACKEND", backend);
        clear_conv_decisions();
        const Tensor got = run_conv_on_gpu(h, c, in);
        const ConvDecision d = conv_decisions().back();
        const std::string& plan = d.plan;
        const bool own = std::string(backend) == "own";
        const bool timed = !own && half && !beats_cudnn;  // rule 4: cuDNN or ours, timed
        const bool ours = own || beats_cudnn;
        if (timed) {
          EXPECT_NE(d.reason.find("rule 4"), std::string::npos) << plan << ": " << d.reason;
        } else {
          EXPECT_EQ(plan.find(", rows") != std::string::npos, ours && kernel == "rows")
              << backend << ": " << plan;
          EXPECT_EQ(plan.find(", ring") != std::string::npos, ours && kernel == "ring")
              << backend << ": " << plan;
        }
        const bool cudnn = plan.rfind("depthwise", 0) != 0;  // may use TF32 for f32
        EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, cudnn))
            << backend << ": " << plan;
      }
    }
  }
}

// The ring kernels' corners: a dilated filter along the rows and asymmetric pads (rows read
// outside the image are skipped, columns are zeros), rows that do not divide into the
// blocks' ranges, several channel chunks (C256: fprop 2 chunks of 16 vectors, wgrad 4 of 8),
// a chunk that is not a power of two (C96 f16: 12 vectors), f32, strided weight gradients
// (S = 2, s_h = 2), the fused activation / residual and the dgrad bias, batch 3.
TEST_F(DepthwiseTest, RingKernelsMatchCpuAtTheirCorners) {
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  struct Case {
    DType dtype;
    int64_t channels, h, w, filter, stride, dilation_h, pad_top, pad_bottom, pad_left, pad_right;
  };
  const Case cases[] = {{DType::bf16, 256, 30, 56, 3, 1, 2, 2, 1, 1, 0},
                        {DType::f16, 96, 17, 20, 7, 1, 1, 3, 2, 3, 4},
                        {DType::f32, 32, 15, 31, 5, 1, 1, 2, 2, 2, 2},
                        {DType::bf16, 64, 21, 33, 3, 2, 1, 1, 0, 1, 1}};
  int seed = 0;
  for (const Case& k : cases) {
    for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
      ConvConfig c =
          depthwise_2d(op, k.dtype, 3, k.channels, {k.h, k.w}, k.filter, k.stride, k.dilation_h,
                       {k.pad_top, k.pad_left}, {k.pad_bottom, k.pad_right});
      if (op == OpKind::conv && seed % 2 == 0) {
        c.activation.kind = Activation::relu;
        c.residual = true;
      }
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 700 + uint64_t(seed++));
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(h, c, in);
      const std::string plan = conv_decisions().back().plan;
      EXPECT_EQ(plan.find(", ring") != std::string::npos, depthwise_kernel(c) == "ring") << plan;
      EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, false)) << plan;
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
