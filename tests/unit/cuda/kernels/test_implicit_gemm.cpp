// The implicit-GEMM convolutions on the GPU (FUSEBOX_CONV_BACKEND=own) against the CPU
// reference: a random sweep of 520 configurations per op (fprop, dgrad, wgrad) over 1-3
// spatial dims, strides (strided dgrad by phases), dilation, asymmetric pads, groups
// (depthwise too), channel counts on the vector path (multiples of 8) and off it, batch 1-3,
// NCHW and channels-last tensors, bf16 / f16 / f32 on TF32 / f32 exact, fprop epilogues
// (bias, activation, residual) and dgrad bias; then ResNet-sized problems through every
// compiled tile (the wgmma ones on an H100/H200). Outputs are poisoned first; the decision record
// must name the implicit GEMM (never the direct kernel).
#include <map>

#include "backends/cuda/kernels/conv/engines/cutlass/plan.h"
#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

class ImplicitGemmTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

struct Mode {
  DType dtype;
  bool tf32;  // f32 only: FUSEBOX_ALLOW_TF32 (else exact)
};

ConvConfig random_config(std::mt19937_64& rng, OpKind op) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto one_of = [&](std::initializer_list<int64_t> values) {
    return *(values.begin() + pick(0, int64_t(values.size()) - 1));
  };
  ConvConfig c;
  c.op = op;
  const int rank = int(one_of({1, 2, 2, 2, 3}));
  const int64_t grouping = pick(0, 5);  // 0-3 dense, 4 grouped, 5 depthwise
  if (grouping < 4) {
    const bool vector = pick(0, 2) > 0;
    c.in_channels = vector ? one_of({8, 16, 24, 32, 64}) : one_of({1, 3, 5, 7, 12});
    c.out_channels = vector ? one_of({8, 16, 40, 64, 72}) : one_of({1, 2, 6, 9, 16});
  } else if (grouping == 4) {
    c.groups = pick(2, 4);
    c.in_channels = c.groups * one_of({1, 3, 8, 16});
    c.out_channels = c.groups * one_of({2, 8, 16});
  } else {
    c.in_channels = one_of({3, 8, 16, 32});
    c.groups = c.in_channels;
    c.out_channels = c.in_channels * one_of({1, 2});
  }
  c.batch = one_of({1, 2, 3});
  c.bias = op != OpKind::conv_backward_filter && pick(0, 1) == 1;
  c.channels_last = pick(0, 3) > 0;
  if (op == OpKind::conv && pick(0, 2) == 0) {
    const Activation kinds[] = {Activation::relu, Activation::gelu_tanh, Activation::silu};
    c.activation.kind = kinds[pick(0, 2)];
    c.residual = pick(0, 1) == 1;
    if (c.residual) c.residual_activation.kind = Activation::relu;
  }
  random_window(c, rng, rank, {{5, 4, 3}, {60, 17, 7}, {5, 7}, 7, 3});
  return c;
}

// The last decision's plan (must be the implicit GEMM's).
std::string last_plan() {
  const std::vector<ConvDecision> d = conv_decisions();
  return d.empty() ? "" : d.back().plan;
}

TEST_F(ImplicitGemmTest, RandomSweepMatchesCpuForEveryOpAndDtype) {
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  const Mode modes[] = {
      {DType::bf16, true}, {DType::f16, true}, {DType::f32, true}, {DType::f32, false}};
  std::mt19937_64 rng(20261125);
  constexpr int kPerOp = 520;
  std::map<std::string, int> plans;
  for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
    int failures = 0;
    for (int i = 0; i < kPerOp && failures < 10; ++i) {
      ConvConfig c = random_config(rng, op);
      const Mode mode = modes[i % 4];
      c.dtype = mode.dtype;
      SCOPED_TRACE(cat("config ", i, ": ", c.describe(), mode.tf32 ? "" : " exact"));
      ScopedEnv tf32("FUSEBOX_ALLOW_TF32", mode.tf32 ? "1" : "0");
      // Every other configuration asks for a wgmma tile (taken where it applies: 16-bit
      // fprop and dgrad on the vector path, on an H100/H200; elsewhere the engine refuses and
      // the default policy runs it), so both main loops are swept.
      const std::string forced =
          i % 2 == 0 ? (i % 4 == 0 ? "implicit_gemm:wg128x128" : "implicit_gemm:wg128x64") : "";
      const std::vector<Tensor> in = conv_inputs(c, 7000 + 10 * uint64_t(i));
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      clear_conv_decisions();
      const Tensor got = run_conv_preferring(h.ctx(), c, in, forced);
      const std::string plan = last_plan();
      // Depthwise configurations with C a multiple of the vector width take the depthwise
      // kernels (test_depthwise.cpp); everything else the implicit GEMM.
      EXPECT_TRUE(plan.rfind("igemm", 0) == 0 || plan.rfind("depthwise", 0) == 0 ||
                  plan.rfind("cutlass", 0) == 0 || plan.rfind("halo", 0) == 0 ||
                  plan.rfind("patch", 0) == 0)
          << plan;
      // Epilogues round the activation in f32 as the CPU does, but after one more rounding
      // step on the CPU (its conv output is rounded first): twice the conv tolerance.
      const double tol = 2 * conv_l2_tolerance(c.dtype, mode.tf32);
      const double err = relative_l2_error(got, want);
      EXPECT_LE(err, tol) << plan;
      failures += err > tol;
      plans[cat(op_name(op), ": ", plan.substr(0, plan.find(',')))]++;
    }
  }
  for (const auto& [plan, count] : plans)
    std::printf("[igemm sweep] %5d  %s\n", count, plan.c_str());
}

// ResNet-sized problems (several CTAs, every pipeline stage, wgrad splits) through each
// tile compiled for bf16, and the heuristic's choice, against the CPU.
TEST_F(ImplicitGemmTest, ResNetSizedProblemsThroughEveryTile) {
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  struct Shape2d {
    int64_t c, k, hw, r, stride;
  };
  const Shape2d shapes[] = {
      {64, 64, 14, 3, 1}, {64, 128, 15, 3, 2}, {128, 64, 14, 1, 1}, {32, 96, 16, 1, 2}};
  for (const char* tile_name : {"", "128x128", "128x64", "64x128", "64x64", "wg128x128", "wg128x64",
                                "cutlass128x128", "cutlass128x64", "cutlass64x128"}) {
    // The tile as FUSEBOX_CONV_ENGINE names it: a CUTLASS tile is the cutlass engine's.
    const std::string tile(tile_name);
    const std::string engine = tile.empty()                    ? ""
                               : tile.rfind("cutlass", 0) == 0 ? "cutlass:" + tile.substr(7)
                                                               : "implicit_gemm:" + tile;
    for (const Shape2d& s : shapes)
      for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
        ConvConfig c;
        c.op = op;
        c.dtype = DType::bf16;
        c.batch = 4;
        c.in_channels = s.c, c.out_channels = s.k;
        c.spatial = {s.hw, s.hw}, c.filter = {s.r, s.r};
        c.strides = {s.stride, s.stride}, c.dilations = {1, 1};
        c.pads_begin = c.pads_end = {s.r / 2, s.r / 2};
        c.channels_last = true;
        c.bias = op == OpKind::conv;
        SCOPED_TRACE(cat("tile '", tile_name, "': ", c.describe()));
        const std::vector<Tensor> in = conv_inputs(c, 99);
        const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
        clear_conv_decisions();
        bool forced = false;
        const Tensor got = run_conv_preferring(h.ctx(), c, in, engine, &forced);
        const std::string plan = last_plan();
        const bool wg = std::string(tile_name).rfind("wg", 0) == 0;
        // The CUTLASS tiles: not strided dgrad; 128x64 fprop/dgrad only, 64x128 wgrad only.
        const std::optional<cutlass_conv::Tile> ct = cutlass_conv::parse_tile(tile_name);
        const ConvOp conv_op = op == OpKind::conv                 ? ConvOp::fprop
                               : op == OpKind::conv_backward_data ? ConvOp::dgrad
                                                                  : ConvOp::wgrad;
        const bool cutlass_takes = ct && cutlass_conv::tile_available(conv_op, *ct) &&
                                   !(conv_op == ConvOp::dgrad && s.stride != 1);
        if (*tile_name && !(wg && op == OpKind::conv_backward_filter) && (!ct || cutlass_takes) &&
            h.ctx().device.properties().compute_capability() == 90) {
          EXPECT_TRUE(forced) << engine << " refused it";
          EXPECT_NE(plan.find(tile_name), std::string::npos) << plan;
        }
        EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, true)) << plan;
      }
  }
}

// The problems the CUTLASS path lowers before its kernels (implicit_gemm.cpp, H100/H200 only):
// an RGB-stem-like 7x7 stride 2 through space-to-depth (fprop with its epilogue, dgrad and
// wgrad through the fold), and few-channel ones through im2col where the wide channels would
// be under 32 (3x3 stride 2 and 5x5 stride 1 on 3 channels: 24 and 15); 1x1 weight gradients as a
// batched GEMM over pixel chunks, with a short last chunk; a 1x1 wgrad of few pixels on the conv
// kernel's image chunks, and of few pixels but many output tiles as one GEMM writing dw; a 1x1
// stride-2 fprop and wgrad on the gathered sub-lattice (through im2col where C is not a multiple of
// 8); a 3x3 stride-2 dgrad of odd extent (phases of 8 and 7 rows) as four stride phases run
// concurrently in one child graph (192 filters: with at most 128 the phase dgrad takes it).
TEST_F(ImplicitGemmTest, CutlassLoweringsMatchCpu) {
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the CUTLASS kernels are sm_90a code (compute capability 9.0)";
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  struct Case {
    OpKind op;
    DType dtype;
    int64_t batch, c, k, hw, r, stride, pad;
    bool bias;
    const char* plan_part;  // what the plan must say
  };
  const Case cases[] = {
      {OpKind::conv, DType::bf16, 2, 3, 64, 40, 7, 2, 3, true, "space-to-depth: 4x1 taps of 48"},
      {OpKind::conv, DType::f16, 2, 5, 16, 17, 3, 1, 1, false, "im2col"},
      {OpKind::conv_backward_data, DType::bf16, 2, 3, 64, 40, 7, 2, 3, false, "space-to-depth"},
      {OpKind::conv_backward_data, DType::f16, 3, 8, 24, 19, 3, 2, 1, false, "space-to-depth"},
      {OpKind::conv_backward_data, DType::f16, 3, 3, 24, 19, 3, 2, 1, false, "im2col"},
      {OpKind::conv_backward_filter, DType::bf16, 2, 3, 32, 40, 7, 2, 3, false, "space-to-depth"},
      {OpKind::conv_backward_filter, DType::f16, 2, 7, 32, 21, 5, 1, 2, false, "space-to-depth"},
      {OpKind::conv_backward_filter, DType::f16, 2, 3, 32, 21, 5, 1, 2, false, "im2col"},
      {OpKind::conv_backward_filter, DType::bf16, 3, 64, 64, 105, 1, 1, 0, false,
       "gemm, 33 chunks"},
      {OpKind::conv_backward_filter, DType::f16, 2, 96, 136, 9, 1, 1, 0, false, "tma-im2col"},
      {OpKind::conv, DType::bf16, 2, 64, 128, 33, 1, 2, 0, true, "gathered"},
      {OpKind::conv, DType::bf16, 2, 5, 64, 17, 1, 2, 0, true, "im2col"},
      {OpKind::conv_backward_filter, DType::bf16, 2, 896, 1024, 9, 1, 1, 0, false,
       "gemm, dw written directly"},
      {OpKind::conv_backward_filter, DType::f16, 1, 512, 2048, 14, 1, 2, 0, false,
       "dw written directly, x gathered at stride 2"},
      {OpKind::conv_backward_data, DType::bf16, 3, 64, 192, 15, 3, 2, 1, false, "4 phases"},
  };
  for (const Case& k : cases) {
    ConvConfig c;
    c.op = k.op;
    c.dtype = k.dtype;
    c.batch = k.batch;
    c.in_channels = k.c, c.out_channels = k.k;
    c.spatial = {k.hw, k.hw}, c.filter = {k.r, k.r};
    c.strides = {k.stride, k.stride}, c.dilations = {1, 1};
    c.pads_begin = c.pads_end = {k.pad, k.pad};
    c.channels_last = true;
    c.bias = k.bias;
    if (k.op == OpKind::conv && k.bias) c.activation.kind = Activation::relu;
    SCOPED_TRACE(c.describe());
    const std::vector<Tensor> in = conv_inputs(c, 57);
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    clear_conv_decisions();
    const Tensor got = run_conv_on_gpu(h, c, in);
    EXPECT_EQ(last_plan().rfind("cutlass", 0), 0u) << last_plan();
    EXPECT_NE(last_plan().find(k.plan_part), std::string::npos) << last_plan();
    EXPECT_LE(relative_l2_error(got, want), 2 * conv_l2_tolerance(c.dtype, true)) << last_plan();
  }
}

// The space-to-depth lowering (kernels/conv/engines/space_to_depth/space_to_depth.h, H100/H200
// only) against the CPU, each direction: 1-D (its wide problem pointwise: the GEMM), 2-D and 3-D;
// strides 2, 3 and mixed, asymmetric pads, a trailing input row no window reads (its dx zero), the
// stride-1 unfold, 4 and 5 channels, NCHW operands copied, f16 and bf16; an epilogue on the fprop;
// rows too long for the row kernels' shared memory (9000 wide: the gather kernels).
TEST_F(ImplicitGemmTest, SpaceToDepthMatchesCpu) {
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the CUTLASS kernels are sm_90a code (compute capability 9.0)";
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  struct Case {
    DType dtype;
    int64_t batch, c, k;
    Shape spatial, filter;
    std::vector<int64_t> strides, pads_begin, pads_end;
    bool channels_last;
    const char* plan_part;
  };
  const Case cases[] = {
      {DType::bf16, 3, 3, 16, {50}, {7}, {3}, {2}, {1}, true, "1 taps of 32 channels"},
      {DType::f16, 1, 3, 16, {9000}, {7}, {3}, {2}, {1}, true, "1 taps of 32 channels"},
      {DType::f16, 2, 3, 64, {41, 38}, {7, 7}, {2, 2}, {3, 3}, {0, 3}, true, "4x1 taps of 48"},
      {DType::bf16, 2, 4, 24, {23, 30}, {5, 5}, {2, 3}, {1, 0}, {2, 1}, false, "3x1 taps of 48"},
      {DType::bf16, 1, 5, 32, {13, 15}, {5, 5}, {1, 1}, {2, 1}, {1, 2}, true, "5x1 taps of 32"},
      {DType::f16,
       2,
       3,
       16,
       {9, 10, 11},
       {5, 5, 5},
       {2, 2, 2},
       {2, 1, 2},
       {2, 2, 1},
       true,
       "3x3x1 taps of 72"},
  };
  for (const Case& k : cases)
    for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
      ConvConfig c;
      c.op = op;
      c.dtype = k.dtype;
      c.batch = k.batch;
      c.in_channels = k.c, c.out_channels = k.k;
      c.spatial = k.spatial, c.filter = k.filter;
      c.strides = k.strides, c.dilations = std::vector<int64_t>(k.spatial.size(), 1);
      c.pads_begin = k.pads_begin, c.pads_end = k.pads_end;
      c.channels_last = k.channels_last;
      if (op == OpKind::conv) {
        c.bias = true;
        c.activation.kind = Activation::relu;
      }
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 61);
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(h, c, in);
      // The stem-like wgrad is the patch wgrad's (its own test); the rest run here.
      if (last_plan().rfind("patch wgrad", 0) != 0) {
        EXPECT_EQ(last_plan().rfind("cutlass", 0), 0u) << last_plan();
        EXPECT_NE(last_plan().find(k.plan_part), std::string::npos) << last_plan();
      }
      EXPECT_LE(relative_l2_error(got, want), 2 * conv_l2_tolerance(c.dtype, true)) << last_plan();
    }
}

// engines.cpp's rule 3: under the default policy a patchify fprop (filter == stride, no pads:
// ViT's 16x16/16 patch embedding, a 4x4/4 stem) passes cuDNN over for space_to_depth, whose
// wide problem is one 1x1 GEMM over C * R channels; a strided few-channel convolution with
// pads is timed instead (rule 4: cuDNN's tuned plan against the project's engines).
TEST_F(ImplicitGemmTest, PatchifyRunsOnSpaceToDepthByDefault) {
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the CUTLASS kernels are sm_90a code (compute capability 9.0)";
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", std::nullopt);
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", std::nullopt);
  struct Case {
    int64_t batch, k, size, patch;
    bool pad;  // a padded window: not a patchify
  };
  const Case cases[] = {{2, 64, 64, 16, false}, {3, 96, 32, 4, false}, {2, 96, 32, 4, true}};
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (const Case& k : cases) {
      ConvConfig c;
      c.op = OpKind::conv;
      c.dtype = dtype;
      c.batch = k.batch;
      c.in_channels = 3, c.out_channels = k.k;
      c.spatial = {k.size, k.size}, c.filter = {k.patch, k.patch};
      c.strides = {k.patch, k.patch}, c.dilations = {1, 1};
      c.pads_begin = {k.pad ? 1 : 0, k.pad ? 1 : 0}, c.pads_end = {0, 0};
      c.channels_last = true;
      c.bias = true;
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 77);
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(h, c, in);
      ASSERT_FALSE(conv_decisions().empty());
      const ConvDecision d = conv_decisions().back();
      const bool wide = d.plan.find("space-to-depth") != std::string::npos;
      if (!k.pad) {
        EXPECT_TRUE(wide) << d.path << " " << d.plan << " (" << d.reason << ")";
        EXPECT_NE(d.reason.find("rule 3"), std::string::npos) << d.reason;
        EXPECT_EQ(d.reason.find("rule 4"), std::string::npos) << d.reason;
      } else {
        EXPECT_NE(d.reason.find("rule 4"), std::string::npos) << d.reason;
      }
      EXPECT_LE(relative_l2_error(got, want), 2 * conv_l2_tolerance(c.dtype, !wide)) << d.plan;
    }
  }
}

// Runs c on the GPU under the default policy and checks engines.cpp's rule 4 decided it (the
// problem was timed) exactly when `timed`, and dw/dx/y against the CPU; returns the decision.
ConvDecision expect_timed_by_rule_4(OpHarness& h, const ConvConfig& c, uint64_t seed, bool timed) {
  const std::vector<Tensor> in = conv_inputs(c, seed);
  const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
  clear_conv_decisions();
  const Tensor got = run_conv_on_gpu(h, c, in);
  EXPECT_FALSE(conv_decisions().empty());
  if (conv_decisions().empty()) return {};
  const ConvDecision d = conv_decisions().back();
  EXPECT_EQ(d.reason.find("rule 4") != std::string::npos, timed)
      << d.path << " " << d.plan << " (" << d.reason << ")";
  EXPECT_LE(relative_l2_error(got, want), 2 * conv_l2_tolerance(c.dtype, true)) << d.plan;
  return d;
}

// engines.cpp's rule 4: under the default policy a grouped convolution (not depthwise) in
// bf16/f16 is timed (cuDNN's tuned plan against the project's engines), not run on the
// heuristics' plan; f32 and one group are not. Each op, with a fused bias + ReLU on fprop.
TEST_F(ImplicitGemmTest, GroupedConvolutionIsTimedByDefault) {
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", std::nullopt);
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", std::nullopt);
  struct Case {
    OpKind op;
    DType dtype;
    int64_t groups;
    bool timed;
  };
  const Case cases[] = {{OpKind::conv, DType::bf16, 2, true},
                        {OpKind::conv, DType::f16, 5, true},
                        {OpKind::conv_backward_data, DType::bf16, 2, true},
                        {OpKind::conv_backward_filter, DType::bf16, 2, true},
                        {OpKind::conv, DType::f32, 2, false},
                        {OpKind::conv, DType::bf16, 1, false}};
  for (const Case& k : cases) {
    ConvConfig c;
    c.op = k.op;
    c.dtype = k.dtype;
    c.batch = 3;
    c.in_channels = 24 * k.groups, c.out_channels = 24 * k.groups, c.groups = k.groups;
    c.spatial = {14, 14}, c.filter = {3, 3};
    c.strides = {1, 1}, c.dilations = {1, 1};
    c.pads_begin = {1, 1}, c.pads_end = {1, 1};
    c.channels_last = true;
    if (k.op == OpKind::conv) {
      c.bias = true;
      c.activation.kind = Activation::relu;
    }
    SCOPED_TRACE(c.describe());
    expect_timed_by_rule_4(h, c, 83, k.timed);
  }
}

// Runs the convolution `c` on the GPU on engine `engine` (FUSEBOX_CONV_ENGINE's name; "": the
// default policy's choice) against the CPU: the plan must be `kernel`'s and say `plan_part`.
void expect_own_kernel(OpHarness& h, const ConvConfig& c, const char* engine, uint64_t seed,
                       const std::string& kernel, const char* plan_part) {
  ScopedConvEngine forced(engine);
  SCOPED_TRACE(cat(c.describe(), " engine '", engine, "'"));
  const std::vector<Tensor> in = conv_inputs(c, seed);
  const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
  clear_conv_decisions();
  const Tensor got = run_conv_on_gpu(h, c, in);
  EXPECT_EQ(last_plan().rfind(kernel, 0), 0u) << last_plan();
  EXPECT_NE(last_plan().find(plan_part), std::string::npos) << last_plan();
  EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, true)) << last_plan();
}

// The halo wgrad (kernels/conv/engines/halo_wgrad/, H100/H200 only) against the CPU: rows padded to
// 16, 32, 48 and 64 pixels (every kernel instance), two row segments with their halos across
// the cut, several channel and filter blocks, runs crossing images, a run per row, NCHW
// operands copied, f16 and bf16; the default policy's choice (64 filters) and
// FUSEBOX_CONV_ENGINE=halo_wgrad.
TEST_F(ImplicitGemmTest, HaloWgradMatchesCpu) {
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the halo wgrad is sm_90a code (compute capability 9.0)";
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  struct Case {
    DType dtype;
    int64_t batch, c, k, height, width;
    bool channels_last;
    const char* engine;
    const char* plan_part;
  };
  const Case cases[] = {
      {DType::bf16, 2, 64, 64, 20, 20, true, "", "rows of 32 px"},
      {DType::f16, 3, 128, 64, 9, 70, true, "halo_wgrad", "rows of 48 px (2 segments)"},
      {DType::bf16, 1, 64, 128, 7, 7, false, "halo_wgrad", "rows of 16 px"},
      {DType::bf16, 4, 64, 64, 56, 56, true, "", "rows of 64 px"},
      {DType::f16, 2, 192, 128, 5, 13, true, "halo_wgrad", "rows of 16 px"},
      {DType::bf16, 1, 64, 64, 1, 3, true, "", "1 splits"},
  };
  for (const Case& k : cases) {
    ConvConfig c;
    c.op = OpKind::conv_backward_filter;
    c.dtype = k.dtype;
    c.batch = k.batch;
    c.in_channels = k.c, c.out_channels = k.k;
    c.spatial = {k.height, k.width}, c.filter = {3, 3};
    c.strides = {1, 1}, c.dilations = {1, 1};
    c.pads_begin = c.pads_end = {1, 1};
    c.channels_last = k.channels_last;
    expect_own_kernel(h, c, k.engine, 83, "halo wgrad", k.plan_part);
  }
}

// The patch wgrad (kernels/conv/engines/patch_wgrad/, H100/H200 only) against the CPU:
// RGB-stem-like 7x7 stride-2 pad-3 problems (rows padded to 32 and 64 pixels), 1 and 4 channels,
// stride 1, asymmetric strides and pads, two filter blocks, NCHW operands, f16 and bf16; the
// default policy's choice and FUSEBOX_CONV_ENGINE=patch_wgrad.
TEST_F(ImplicitGemmTest, PatchWgradMatchesCpu) {
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the patch wgrad is sm_90a code (compute capability 9.0)";
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  struct Case {
    DType dtype;
    int64_t batch, c, k, height, width, stride_h, stride_w, pad_lo, pad_hi;
    bool channels_last;
    const char* engine;
    const char* plan_part;
  };
  const Case cases[] = {
      {DType::bf16, 2, 3, 64, 40, 40, 2, 2, 3, 3, true, "", "rows of 32 px"},
      {DType::f16, 3, 1, 128, 29, 37, 1, 1, 3, 3, true, "patch_wgrad", "rows of 48 px"},
      {DType::bf16, 2, 4, 64, 50, 64, 2, 2, 2, 1, false, "", "rows of 32 px"},
      {DType::f16, 1, 3, 64, 33, 120, 1, 2, 0, 2, true, "", "rows of 64 px"},
      {DType::bf16, 4, 3, 64, 8, 7, 2, 2, 3, 3, true, "patch_wgrad", "rows of 16 px"},
  };
  for (const Case& k : cases) {
    ConvConfig c;
    c.op = OpKind::conv_backward_filter;
    c.dtype = k.dtype;
    c.batch = k.batch;
    c.in_channels = k.c, c.out_channels = k.k;
    c.spatial = {k.height, k.width}, c.filter = {7, 7};
    c.strides = {k.stride_h, k.stride_w}, c.dilations = {1, 1};
    c.pads_begin = {k.pad_lo, k.pad_lo}, c.pads_end = {k.pad_hi, k.pad_hi};
    c.channels_last = k.channels_last;
    expect_own_kernel(h, c, k.engine, 91, "patch wgrad", k.plan_part);
  }
}

// engines.cpp's rule 4 for an RGB stem's weight gradient (7x7 stride 2 over 3 channels): under
// the default policy a bf16/f16 one is timed (cuDNN's tuned plan against the project's engines,
// the patch wgrad among them), not run on the heuristics' plan; f32 and stride 1 are not.
// Whichever wins, dw matches the CPU.
TEST_F(ImplicitGemmTest, StemWgradIsTimedByDefault) {
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", std::nullopt);
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", std::nullopt);
  struct Case {
    DType dtype;
    int64_t stride;
    bool timed;
  };
  const Case cases[] = {{DType::bf16, 2, true},
                        {DType::f16, 2, true},
                        {DType::f32, 2, false},
                        {DType::bf16, 1, false}};
  for (const Case& k : cases) {
    ConvConfig c;
    c.op = OpKind::conv_backward_filter;
    c.dtype = k.dtype;
    c.batch = 2;
    c.in_channels = 3, c.out_channels = 64;
    c.spatial = {40, 40}, c.filter = {7, 7};
    c.strides = {k.stride, k.stride}, c.dilations = {1, 1};
    c.pads_begin = {3, 3}, c.pads_end = {3, 3};
    c.channels_last = true;
    SCOPED_TRACE(c.describe());
    const ConvDecision d = expect_timed_by_rule_4(h, c, 97, k.timed);
    if (k.timed) {
      EXPECT_NE(d.reason.find("stem's wgrad"), std::string::npos) << d.reason;
    }
  }
}

// The phase dgrad (kernels/conv/engines/phase_dgrad/, H100/H200 only) against the CPU: 3x3 stride-2
// pad-1 backward data with even and odd extents (dx's last row or column then has one
// phase fewer), trailing pads of 0 (dy one smaller), a lattice not a multiple of the 128-point
// tile, one and two K steps, several channel blocks (each with CTAs of its own), more tiles
// than CTAs, NCHW operands, f16 and bf16; the default policy's choice and
// FUSEBOX_CONV_ENGINE=phase_dgrad.
TEST_F(ImplicitGemmTest, PhaseDgradMatchesCpu) {
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the phase dgrad is sm_90a code (compute capability 9.0)";
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  struct Case {
    DType dtype;
    int64_t batch, c, k, height, width, pad_hi;
    bool channels_last;
    const char* engine;
    const char* plan_part;
  };
  const Case cases[] = {
      {DType::bf16, 2, 64, 64, 16, 16, 1, true, "", "1 x 1 tiles"},
      {DType::f16, 3, 128, 128, 15, 13, 1, true, "phase_dgrad", "2 x 2 tiles"},
      {DType::bf16, 1, 192, 64, 10, 9, 0, true, "", "1 x 3 tiles"},
      {DType::bf16, 2, 64, 128, 11, 20, 0, false, "phase_dgrad", "1 x 1 tiles"},
      {DType::f16, 8, 128, 128, 56, 56, 1, true, "", "49 x 2 tiles"},
      {DType::bf16, 64, 128, 128, 56, 56, 1, true, "", "392 x 2 tiles on"},
  };
  for (const Case& k : cases) {
    ConvConfig c;
    c.op = OpKind::conv_backward_data;
    c.dtype = k.dtype;
    c.batch = k.batch;
    c.in_channels = k.c, c.out_channels = k.k;
    c.spatial = {k.height, k.width}, c.filter = {3, 3};
    c.strides = {2, 2}, c.dilations = {1, 1};
    c.pads_begin = {1, 1}, c.pads_end = {k.pad_hi, k.pad_hi};
    c.channels_last = k.channels_last;
    expect_own_kernel(h, c, k.engine, 97, "phase dgrad", k.plan_part);
  }
}

// A small sample of every main loop and index map (mma.sync and wgmma tiles, element loads,
// exact f32, strided dgrad phases, wgrad splits, groups, 1-D and 3-D, the depthwise kernels),
// for
// compute-sanitizer's memcheck and racecheck (scripts/sanitize_conv.sh); also a plain test.
TEST_F(ImplicitGemmTest, SanitizerSample) {
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
  struct Case {
    OpKind op;
    DType dtype;
    const char* engine;  // FUSEBOX_CONV_ENGINE where it takes the problem ("": the default)
    int64_t c, k, groups, hw, r, stride;
    int rank;
  };
  const Case cases[] = {
      {OpKind::conv, DType::bf16, "implicit_gemm:wg128x128", 32, 136, 1, 9, 3, 1, 2},
      {OpKind::conv, DType::f16, "implicit_gemm:wg128x64", 16, 24, 1, 7, 3, 2, 2},
      {OpKind::conv_backward_data, DType::bf16, "implicit_gemm:wg128x64", 24, 16, 1, 9, 3, 2, 2},
      {OpKind::conv_backward_data, DType::f16, "implicit_gemm:128x128", 16, 32, 2, 6, 3, 2, 3},
      {OpKind::conv_backward_filter, DType::bf16, "implicit_gemm:128x64", 32, 16, 1, 10, 3, 1, 2},
      {OpKind::conv_backward_filter, DType::f32, "", 12, 8, 4, 9, 3, 2, 2},
      {OpKind::conv, DType::f32, "implicit_gemm:64x128", 8, 72, 1, 21, 5, 1, 1},
      {OpKind::conv, DType::bf16, "", 3, 5, 1, 8, 3, 1, 2},
      {OpKind::conv_backward_data, DType::f32, "", 5, 7, 1, 5, 3, 2, 3},
      // Depthwise (kernels/conv/engines/depthwise/ under own): the ring kernels (2-D: 3x3 fprops,
      // 7x7 dgrads flipped, 3x3 stride-2 and 7x7 wgrads), the rows kernels (3x3x3 wgrad, 1-D 5-wide
      // stride-2 fprop, 7x7 stride-2 wgrad of 3 channel vectors) and the generic strided dgrad.
      {OpKind::conv, DType::bf16, "", 16, 16, 16, 9, 3, 1, 2},
      {OpKind::conv_backward_data, DType::f16, "", 8, 8, 8, 9, 3, 2, 2},
      {OpKind::conv_backward_filter, DType::f32, "", 8, 8, 8, 7, 3, 1, 3},
      {OpKind::conv_backward_data, DType::bf16, "", 16, 16, 16, 11, 7, 1, 2},
      {OpKind::conv, DType::f16, "", 8, 8, 8, 12, 5, 2, 1},
      {OpKind::conv_backward_filter, DType::bf16, "", 24, 24, 24, 12, 7, 2, 2},
      {OpKind::conv, DType::bf16, "", 32, 32, 32, 16, 3, 1, 2},
      {OpKind::conv_backward_data, DType::f16, "", 16, 16, 16, 16, 7, 1, 2},
      {OpKind::conv_backward_filter, DType::bf16, "", 32, 32, 32, 12, 7, 1, 2},
      {OpKind::conv_backward_filter, DType::bf16, "", 32, 32, 32, 11, 3, 2, 2},
      // The CUTLASS kernels (kernels/conv/engines/cutlass/, compute capability 9.0).
      {OpKind::conv, DType::bf16, "cutlass:128x128", 32, 136, 1, 9, 3, 2, 2},
      {OpKind::conv_backward_data, DType::f16, "cutlass:128x64", 24, 16, 1, 9, 3, 1, 3},
      {OpKind::conv_backward_filter, DType::bf16, "cutlass:64x128", 32, 16, 1, 10, 3, 1, 2},
      // 1-D 1x1, no padding: the ping-pong GEMM.
      {OpKind::conv, DType::bf16, "", 64, 72, 1, 300, 1, 1, 1},
      {OpKind::conv_backward_data, DType::f16, "", 40, 128, 1, 300, 1, 1, 1},
      // 1x1 stride 2: x's sub-lattice gathered, then the GEMM.
      {OpKind::conv, DType::bf16, "", 64, 72, 1, 301, 1, 2, 1},
      // 3x3 stride 2 on the phase dgrad (compute capability 9.0; no bias: it takes none).
      {OpKind::conv_backward_data, DType::bf16, "phase_dgrad", 64, 64, 1, 9, 3, 2, 2},
  };
  for (const bool exact : {false, true}) {
    ScopedEnv tf32("FUSEBOX_ALLOW_TF32", exact ? "0" : "1");
    for (const Case& k : cases) {
      if (exact && k.dtype != DType::f32) continue;
      ConvConfig c;
      c.op = k.op;
      c.dtype = k.dtype;
      c.batch = 2;
      c.in_channels = k.c, c.out_channels = k.k, c.groups = k.groups;
      for (int d = 0; d < k.rank; ++d) {
        c.spatial.push_back(k.hw - d), c.filter.push_back(k.r), c.strides.push_back(k.stride);
        c.dilations.push_back(1), c.pads_begin.push_back(k.r / 2), c.pads_end.push_back(d % 2);
      }
      c.channels_last = true;
      const bool phase = std::string(k.engine) == "phase_dgrad";
      c.bias = k.op != OpKind::conv_backward_filter && !phase;
      SCOPED_TRACE(cat(c.describe(), " engine '", k.engine, "'", exact ? " exact" : ""));
      const std::vector<Tensor> in = conv_inputs(c, 31);
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      clear_conv_decisions();
      const Tensor got = run_conv_preferring(h.ctx(), c, in, k.engine);
      const bool depthwise = k.groups == k.c && k.k == k.c;
      const bool hopper = h.ctx().device.properties().compute_capability() == 90;
      const bool cutlass = (std::string(k.engine).rfind("cutlass", 0) == 0 || k.r == 1) && hopper;
      EXPECT_EQ(last_plan().rfind(depthwise         ? "depthwise"
                                  : phase && hopper ? "phase dgrad"
                                  : cutlass         ? "cutlass"
                                                    : "igemm",
                                  0),
                0u)
          << last_plan();
      EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, !exact && !depthwise))
          << last_plan();
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
