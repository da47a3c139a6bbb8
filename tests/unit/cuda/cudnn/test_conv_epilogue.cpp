// Convolutions with fused epilogues (ir/ops.h ConvAttrs: bias, activation, residual add,
// residual activation) on the GPU against the CPU reference, three ways: cuDNN's fused graph
// where it takes it (kernels/conv/conv.cpp), every fused graph refused
// (FUSEBOX_CUDNN_FUSION=refuse: the plain convolution and the epilogue kernel), and the
// direct kernel (FUSEBOX_CONV_BACKEND=own). A random matrix over dtypes (f32, f16, bf16),
// layouts (NCHW, channels-last), every activation, with and without bias and residual;
// outputs poisoned. ResNet-style cases (bf16/f16 NHWC, relu, residual) must run fused.
#include <cstdlib>
#include <map>

#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

class ConvEpilogueTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

FusedActivation random_activation(std::mt19937_64& rng, bool allow_none) {
  const Activation kinds[] = {Activation::none,      Activation::relu, Activation::gelu,
                              Activation::gelu_tanh, Activation::silu, Activation::sigmoid,
                              Activation::tanh,      Activation::clip};
  const size_t first = allow_none ? 0 : 1;
  FusedActivation a;
  a.kind = kinds[std::uniform_int_distribution<size_t>(first, 7)(rng)];
  if (a.kind == Activation::clip) a.min = -0.5, a.max = 0.75;
  return a;
}

ConvConfig random_epilogue_config(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  const int64_t channels[] = {3, 8, 16, 24, 64};
  ConvConfig c;
  c.op = OpKind::conv;
  c.dtype = types[pick(0, 2)];
  c.batch = pick(1, 3);
  c.in_channels = channels[pick(0, 4)];
  c.out_channels = channels[pick(1, 4)];
  c.groups = 1;
  const int64_t filter = pick(0, 1) ? 3 : 1;
  const int64_t extent = pick(5, 12);
  c.spatial = {extent, extent};
  c.filter = {filter, filter};
  c.strides = {pick(1, 2), 1};
  c.dilations = {1, 1};
  c.pads_begin = {filter / 2, filter / 2};
  c.pads_end = {filter / 2, filter / 2};
  c.bias = pick(0, 3) != 0;
  c.channels_last = pick(0, 2) != 0;
  c.residual = pick(0, 1) == 1;
  c.activation = random_activation(rng, c.residual);
  if (c.residual) c.residual_activation = random_activation(rng, true);
  return c;
}

// Tolerance: the conv's (conv_test_util.h) doubled: the split paths round y once more
// before the epilogue, and the activations' own f32 rounding differs by an ulp or two.
double epilogue_tolerance(DType t, bool tf32) {
  return 2 * conv_l2_tolerance(t, tf32);
}

// The whole suite may run with FUSEBOX_CUDNN_FUSION=refuse (every cuDNN group split): the
// tests then check the split results and that nothing ran fused.
bool refused_by_environment() {
  const char* text = std::getenv("FUSEBOX_CUDNN_FUSION");
  return text != nullptr && std::string(text) == "refuse";
}

bool last_ran_fused() {
  const std::vector<ConvDecision> d = conv_decisions();
  return !d.empty() && d.back().path.rfind("cudnn (fused", 0) == 0 &&
         d.back().path.find("epilogue kernel") == std::string::npos;
}

TEST_F(ConvEpilogueTest, RandomizedEpiloguesMatchCpuFusedSplitAndOwn) {
  OpHarness h;
  TempDir cache("conv_epilogue");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", std::nullopt);
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", std::nullopt);
  std::mt19937_64 rng(20261124);
  constexpr int kConfigs = 120;
  int fused = 0;
  std::map<std::string, int> split_reasons;
  for (int i = 0; i < kConfigs; ++i) {
    const ConvConfig c = random_epilogue_config(rng);
    SCOPED_TRACE(cat("config ", i, ": ", c.describe()));
    const std::vector<Tensor> in = conv_inputs(c, 5000 + 10 * uint64_t(i));
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    {
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(h, c, in);
      EXPECT_LE(relative_l2_error(got, want), epilogue_tolerance(c.dtype, true)) << "default";
      if (last_ran_fused()) {
        ++fused;
      } else if (!conv_decisions().empty()) {
        split_reasons[conv_decisions().back().path]++;
      }
    }
    {
      ScopedEnv refuse("FUSEBOX_CUDNN_FUSION", "refuse");
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(h, c, in);
      EXPECT_LE(relative_l2_error(got, want), epilogue_tolerance(c.dtype, true)) << "refused";
      ASSERT_FALSE(conv_decisions().empty());
      EXPECT_EQ(conv_decisions().back().path.find("fused"), std::string::npos)
          << conv_decisions().back().path;
    }
    {
      ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
      const Tensor got = run_conv_on_gpu(h, c, in);
      EXPECT_LE(relative_l2_error(got, want), epilogue_tolerance(c.dtype, true)) << "own";
    }
  }
  std::printf("conv epilogues: %d of %d ran as one fused cuDNN graph; split:\n", fused, kConfigs);
  for (const auto& [path, count] : split_reasons) std::printf("  %4d  %s\n", count, path.c_str());
  if (refused_by_environment())
    EXPECT_EQ(fused, 0);
  else
    EXPECT_GT(fused, 0);
}

// ResNet's groups in half precision, NHWC: conv + bias + relu and the block end conv + bias +
// residual + relu run as one cuDNN graph each.
TEST_F(ConvEpilogueTest, ResnetGroupsRunFusedInHalfPrecision) {
  OpHarness h;
  TempDir cache("conv_epilogue_resnet");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool residual : {false, true}) {
      ConvConfig c;
      c.dtype = dtype;
      c.batch = 2;
      c.in_channels = 64;
      c.out_channels = 256;
      c.spatial = {14, 14};
      c.filter = {1, 1};
      c.strides = {1, 1};
      c.dilations = {1, 1};
      c.pads_begin = {0, 0};
      c.pads_end = {0, 0};
      c.bias = true;
      c.channels_last = true;
      c.residual = residual;
      (residual ? c.residual_activation : c.activation).kind = Activation::relu;
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 77);
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(h, c, in);
      EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(dtype, true));
      ASSERT_FALSE(conv_decisions().empty());
      EXPECT_EQ(last_ran_fused(), !refused_by_environment())
          << conv_decisions().back().path << ": " << conv_decisions().back().reason;
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
