// Every convolution engine (kernels/conv/engines.h) x {fprop, dgrad, wgrad} against the CPU
// reference. Each engine is forced as FUSEBOX_CONV_ENGINE forces it (in process:
// ScopedConvEngine) on a set of problems chosen so that every engine takes some of each op it
// implements: dense 3x3 (cuDNN, CUTLASS, the implicit GEMM, the halo wgrad at 64 filters), a
// 3x3 stride-2 without bias (the phase dgrad), an RGB stem's 7x7 stride 2 on 3 channels
// (space-to-depth, the patch wgrad), a 3x3 on 3 channels (im2col), a 1x1 stride 2 (CUTLASS on
// the gathered sub-lattice), depthwise ones with EfficientNet's bias + SiLU, grouped 1-D and
// 3-D ones, f32 and f64 (the direct kernel). Outputs are poisoned first; a problem the engine
// refuses must be refused with an Error naming the engine, the node and why (never run by
// another engine); an engine that refuses every problem of an op (an op it has no kernels for,
// or a GPU its kernels do not run on) is reported as skipped with its reasons.
#include <gtest/gtest.h>

#include <tuple>

#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

// A problem: 1 to 3 spatial dims of extent `hw` (the last one hw + 1), filter r, one stride
// and dilation 1, pads r / 2 (leading) and `pad_hi` (trailing; -1: r / 2).
ConvConfig problem(OpKind op, DType dtype, int64_t batch, int64_t c, int64_t k, int64_t groups,
                   int rank, int64_t hw, int64_t r, int64_t stride, int64_t pad_hi = -1) {
  ConvConfig p;
  p.op = op;
  p.dtype = dtype;
  p.batch = batch;
  p.in_channels = c, p.out_channels = k, p.groups = groups;
  for (int d = 0; d < rank; ++d) {
    p.spatial.push_back(d == rank - 1 ? hw + 1 : hw), p.filter.push_back(r);
    p.strides.push_back(stride), p.dilations.push_back(1);
    p.pads_begin.push_back(r / 2), p.pads_end.push_back(pad_hi < 0 ? r / 2 : pad_hi);
  }
  p.channels_last = true;
  return p;
}

// The problems of one op; epilogues (bias, activations, residual) where the op has them.
std::vector<ConvConfig> problems(OpKind op) {
  const bool fprop = op == OpKind::conv, wgrad = op == OpKind::conv_backward_filter;
  const DType bf16 = DType::bf16, f16 = DType::f16;
  std::vector<ConvConfig> out;
  auto add = [&](ConvConfig p, bool bias) {
    p.bias = bias && !wgrad;
    out.push_back(std::move(p));
  };
  // Dense 3x3, 64 channels and filters: every tensor-core engine, the halo wgrad.
  ConvConfig dense = problem(op, bf16, 2, 64, 64, 1, 2, 14, 3, 1);
  add(dense, true);
  if (fprop) {
    dense.activation.kind = Activation::relu;
    dense.residual = true;
    add(dense, true);
  }
  ConvConfig nchw = problem(op, f16, 2, 64, 64, 1, 2, 12, 3, 1);
  nchw.channels_last = false;  // copied into the kernels' layout
  add(nchw, false);
  // 3x3 stride 2, no bias: the phase dgrad.
  add(problem(op, bf16, 2, 64, 64, 1, 2, 15, 3, 2), false);
  // The RGB stem: 7x7 stride 2 on 3 channels (space-to-depth; the patch wgrad).
  ConvConfig stem = problem(op, bf16, 2, 3, 64, 1, 2, 32, 7, 2);
  if (fprop) stem.activation.kind = Activation::relu;
  add(stem, fprop);
  // 3x3 on 3 channels: fewer than 32 wide channels, so im2col.
  add(problem(op, f16, 2, 3, 16, 1, 2, 12, 3, 1), false);
  // 1x1 stride 2 without padding: x's sub-lattice gathered (fprop).
  add(problem(op, bf16, 2, 64, 64, 1, 2, 14, 1, 2, 0), true);
  // Depthwise, EfficientNet-like (bias + SiLU), a 5x5 stride 2, and f32.
  ConvConfig dw = problem(op, bf16, 2, 96, 96, 96, 2, 16, 3, 1);
  if (fprop) dw.activation.kind = Activation::silu;
  add(dw, true);
  add(problem(op, f16, 2, 32, 32, 32, 2, 15, 5, 2), false);
  add(problem(op, DType::f32, 2, 16, 16, 16, 2, 12, 3, 1), true);
  // Grouped 1-D and 3-D, f32 (TF32), odd channel counts: the implicit GEMM's element loads.
  add(problem(op, DType::f32, 2, 12, 18, 3, 1, 20, 3, 2), true);
  add(problem(op, DType::f32, 1, 5, 7, 1, 3, 6, 3, 1), false);
  // f64: the direct kernel alone.
  add(problem(op, DType::f64, 1, 4, 6, 2, 2, 7, 3, 2), true);
  return out;
}

bool has_epilogue(const ConvConfig& c) {
  return c.bias || c.activation || c.residual;
}

using EngineOp = std::tuple<std::string, OpKind>;

class ConvEnginesTest : public ::testing::TestWithParam<EngineOp> {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

TEST_P(ConvEnginesTest, MatchesCpuWhereItTakesTheProblem) {
  const auto& [engine, op] = GetParam();
  OpHarness h;
  TempDir cache("conv_engines");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", std::nullopt),
      autotune("FUSEBOX_AUTOTUNE", std::nullopt), tf32("FUSEBOX_ALLOW_TF32", std::nullopt),
      env_engine("FUSEBOX_CONV_ENGINE", std::nullopt);
  ScopedConvEngine forced(engine);
  int ran = 0, seed = 0;
  std::string refusals;
  for (const ConvConfig& c : problems(op)) {
    SCOPED_TRACE(cat(engine, ": ", c.describe()));
    const std::vector<Tensor> in = conv_inputs(c, 4100 + uint64_t(seed++));
    clear_conv_decisions();
    Tensor got;
    try {
      got = run_conv_on_gpu(h, c, in);
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(is_forced_engine_refusal(e)) << m;
      EXPECT_NE(m.find("FUSEBOX_CONV_ENGINE=" + engine), std::string::npos) << m;
      EXPECT_NE(m.find("'node'"), std::string::npos) << m;  // names the node
      EXPECT_TRUE(conv_decisions().empty()) << "recorded after refusing";
      refusals += cat("\n  ", c.describe(), ": ", m);
      continue;
    }
    ++ran;
    ASSERT_FALSE(conv_decisions().empty());
    const ConvDecision d = conv_decisions().back();
    EXPECT_EQ(d.path.rfind(engine, 0), 0u) << d.path;  // that engine, no other
    EXPECT_NE(d.reason.find("FUSEBOX_CONV_ENGINE=" + engine), std::string::npos) << d.reason;
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    // Epilogues round in f32 after the CPU's rounded convolution: twice the conv tolerance.
    const double tol = (has_epilogue(c) ? 2 : 1) * conv_l2_tolerance(c.dtype, true);
    EXPECT_LE(relative_l2_error(got, want), tol) << d.path << " " << d.plan;
  }
  if (ran == 0) GTEST_SKIP() << engine << " took none of the problems:" << refusals;
  std::printf("[conv engines] %s %s: ran %d problems\n", engine.c_str(), op_name(op), ran);
}

std::vector<std::string> engine_names() {
  std::vector<std::string> names;
  for (const ConvEngine* e : conv_engines()) names.push_back(e->name());
  return names;
}

INSTANTIATE_TEST_SUITE_P(EveryEngineAndOp, ConvEnginesTest,
                         ::testing::Combine(::testing::ValuesIn(engine_names()),
                                            ::testing::Values(OpKind::conv,
                                                              OpKind::conv_backward_data,
                                                              OpKind::conv_backward_filter)),
                         [](const ::testing::TestParamInfo<EngineOp>& info) {
                           const OpKind op = std::get<1>(info.param);
                           return cat(std::get<0>(info.param), "_",
                                      op == OpKind::conv                 ? "fprop"
                                      : op == OpKind::conv_backward_data ? "dgrad"
                                                                         : "wgrad");
                         });

// Without a forced engine, a depthwise fprop with a fused bias and activation (EfficientNet-B0's
// depthwise layers) runs on the depthwise engine, the whole epilogue in its kernel (engines.cpp,
// rule 1), never on cuDNN's fused graph; the report says so.
TEST(ConvEnginePolicy, DepthwiseWithEpilogueRunsOnTheDepthwiseEngine) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  TempDir cache("conv_policy");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", std::nullopt),
      autotune("FUSEBOX_AUTOTUNE", std::nullopt), env_engine("FUSEBOX_CONV_ENGINE", std::nullopt),
      plan("FUSEBOX_CONV_PLAN_INDEX", std::nullopt);
  ScopedConvEngine none("");
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (int64_t stride : {1, 2}) {
      ConvConfig c =
          problem(OpKind::conv, dtype, 2, 96, 96, 96, 2, 28, stride == 1 ? 3 : 5, stride);
      c.bias = true;
      c.activation.kind = Activation::silu;
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 88);
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(h, c, in);
      const ConvDecision d = conv_decisions().back();
      EXPECT_EQ(d.path.rfind("depthwise (epilogue in kernel: bias+silu)", 0), 0u) << d.path;
      EXPECT_NE(d.reason.find("rule 1"), std::string::npos) << d.reason;
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      EXPECT_LE(relative_l2_error(got, want), 2 * conv_l2_tolerance(dtype, false)) << d.plan;
    }
  }
}

// A forced engine that cannot run a problem is an Error naming the engine, the node, the
// problem and the reason, never another engine; one of an op it has no kernels for too.
TEST(ConvEnginePolicy, ForcedEngineRefusalsAreErrors) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", std::nullopt),
      env_engine("FUSEBOX_CONV_ENGINE", std::nullopt);
  const ConvConfig f64 = problem(OpKind::conv, DType::f64, 1, 4, 6, 1, 2, 7, 3, 1);
  const ConvConfig fprop = problem(OpKind::conv, DType::bf16, 1, 64, 64, 1, 2, 8, 3, 1);
  const std::tuple<const char*, ConvConfig, const char*> cases[] = {
      {"implicit_gemm", f64, "f64"},
      {"depthwise", fprop, "not depthwise"},
      {"halo_wgrad", fprop, "has no conv_fprop kernels"},
      {"implicit_gemm:96x96", fprop, "no variant '96x96'"},
      {"winograd", fprop, "names no engine"}};
  for (const auto& [spec, c, part] : cases) {
    ScopedConvEngine forced(spec);
    const std::vector<Tensor> in = conv_inputs(c, 5);
    clear_conv_decisions();
    const std::string m = fusebox::testing::error_message([&] { (void)run_conv_on_gpu(h, c, in); });
    EXPECT_NE(m.find(cat("FUSEBOX_CONV_ENGINE")), std::string::npos) << m;
    EXPECT_NE(m.find(std::string(spec)), std::string::npos) << m;
    EXPECT_NE(m.find("'node'"), std::string::npos) << m;
    EXPECT_NE(m.find(part), std::string::npos) << m;
    EXPECT_TRUE(conv_decisions().empty()) << conv_decisions().back().path;
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
