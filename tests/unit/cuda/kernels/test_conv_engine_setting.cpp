// FUSEBOX_CONV_ENGINE and the engine list (kernels/conv/engines.h), without a GPU: parsing,
// the errors for an unknown engine or variant, contradictions with FUSEBOX_CONV_BACKEND and
// FUSEBOX_CONV_PLAN_INDEX, the old FUSEBOX_CONV_IGEMM_TILE refused with its translation, the
// in-process override, and the list's order.
#include <gtest/gtest.h>

#include "backends/cuda/kernels/conv/engines.h"
#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::error_message;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ConvEngineSetting, ParsesNameAndVariant) {
  {
    ScopedEnv engine("FUSEBOX_CONV_ENGINE", std::nullopt);
    EXPECT_TRUE(conv_settings().engine.empty());
  }
  {
    ScopedEnv engine("FUSEBOX_CONV_ENGINE", "implicit_gemm:128x64");
    const ConvEngineChoice c = conv_settings().engine;
    EXPECT_EQ(c.name, "implicit_gemm");
    EXPECT_EQ(c.variant, "128x64");
    EXPECT_EQ(c.text(), "implicit_gemm:128x64");
  }
  {
    ScopedEnv engine("FUSEBOX_CONV_ENGINE", "depthwise");
    EXPECT_EQ(conv_settings().engine.name, "depthwise");
    EXPECT_EQ(conv_settings().engine.variant, "");
  }
  {
    // cuDNN's variant is the plan index, as FUSEBOX_CONV_PLAN_INDEX.
    ScopedEnv engine("FUSEBOX_CONV_ENGINE", "cudnn:3"),
        index("FUSEBOX_CONV_PLAN_INDEX", std::nullopt);
    EXPECT_EQ(conv_settings().forced_plan_index, 3);
  }
  for (const char* bad : {":128x64", "implicit_gemm:", "Implicit_GEMM", "cut-lass", "a b"}) {
    ScopedEnv engine("FUSEBOX_CONV_ENGINE", bad);
    const std::string m = error_message([] { (void)settings(); });
    EXPECT_TRUE(contains(m, cat("FUSEBOX_CONV_ENGINE='", bad, "'"))) << m;
  }
}

TEST(ConvEngineSetting, ContradictionsAreErrors) {
  {
    ScopedEnv engine("FUSEBOX_CONV_ENGINE", "cutlass"), backend("FUSEBOX_CONV_BACKEND", "cudnn");
    const std::string m = error_message([] { (void)settings(); });
    EXPECT_TRUE(contains(m, "FUSEBOX_CONV_BACKEND=cudnn")) << m;
  }
  {
    ScopedEnv engine("FUSEBOX_CONV_ENGINE", "cudnn"), backend("FUSEBOX_CONV_BACKEND", "own");
    const std::string m = error_message([] { (void)settings(); });
    EXPECT_TRUE(contains(m, "FUSEBOX_CONV_BACKEND=own")) << m;
  }
  {
    ScopedEnv engine("FUSEBOX_CONV_ENGINE", "cudnn:2"), index("FUSEBOX_CONV_PLAN_INDEX", "5");
    const std::string m = error_message([] { (void)settings(); });
    EXPECT_TRUE(contains(m, "FUSEBOX_CONV_PLAN_INDEX=5")) << m;
  }
  ScopedEnv engine("FUSEBOX_CONV_ENGINE", "cudnn"), backend("FUSEBOX_CONV_BACKEND", "cudnn");
  EXPECT_EQ(conv_settings().engine.name, "cudnn");
}

// The old tile setting chose engines too: it is refused with the FUSEBOX_CONV_ENGINE value
// that does what it did.
TEST(ConvEngineSetting, OldTileSettingNamesItsReplacement) {
  const std::pair<const char*, const char*> cases[] = {
      {"128x64", "FUSEBOX_CONV_ENGINE=implicit_gemm:128x64"},
      {"wg128x128", "FUSEBOX_CONV_ENGINE=implicit_gemm:wg128x128"},
      {"cutlass64x128", "FUSEBOX_CONV_ENGINE=cutlass:64x128"},
      {"halo", "FUSEBOX_CONV_ENGINE=halo_wgrad"},
      {"patch", "FUSEBOX_CONV_ENGINE=patch_wgrad"},
      {"phase", "FUSEBOX_CONV_ENGINE=phase_dgrad"}};
  for (const auto& [tile, replacement] : cases) {
    ScopedEnv old("FUSEBOX_CONV_IGEMM_TILE", tile);
    const std::string m = error_message([] { (void)settings(); });
    EXPECT_TRUE(contains(m, replacement)) << m;
    EXPECT_TRUE(contains(m, cat("FUSEBOX_CONV_IGEMM_TILE='", tile, "'"))) << m;
  }
}

TEST(ConvEngineSetting, EngineNamesAndVariantsAreChecked) {
  const std::string unknown = error_message([] {
    (void)checked_conv_engine({"winograd", ""}, "FUSEBOX_CONV_ENGINE", "conv 'stem'");
  });
  EXPECT_TRUE(contains(unknown, "FUSEBOX_CONV_ENGINE='winograd' names no engine")) << unknown;
  EXPECT_TRUE(contains(unknown, "conv 'stem'")) << unknown;
  for (const ConvEngine* e : conv_engines()) EXPECT_TRUE(contains(unknown, e->name())) << unknown;

  EXPECT_EQ(checked_conv_engine({"implicit_gemm", "wg128x64"}, "FUSEBOX_CONV_ENGINE").name(),
            std::string("implicit_gemm"));
  EXPECT_EQ(checked_conv_engine({"cutlass", "128x64"}, "FUSEBOX_CONV_ENGINE").name(),
            std::string("cutlass"));
  EXPECT_EQ(checked_conv_engine({"cudnn", "12"}, "FUSEBOX_CONV_ENGINE").name(),
            std::string("cudnn"));
  const std::pair<ConvEngineChoice, const char*> bad[] = {
      {{"implicit_gemm", "96x96"}, "128x128, 128x64"},  // lists its tiles
      {{"cutlass", "wg128x128"}, "128x128, 128x64, 64x128"},
      {{"im2col", "32x32"}, "128x128"},
      {{"cudnn", "first"}, "plan index"},
      {{"halo_wgrad", "3x3"}, "takes no variant"},
      {{"direct", "f64"}, "takes no variant"}};
  for (const auto& [choice, part] : bad) {
    const std::string m =
        error_message([&] { (void)checked_conv_engine(choice, "FUSEBOX_CONV_ENGINE"); });
    EXPECT_TRUE(contains(m, cat("FUSEBOX_CONV_ENGINE='", choice.text(), "'"))) << m;
    EXPECT_TRUE(contains(m, part)) << m;
  }
}

// The in-process override acts as the variable, over it, and goes away.
TEST(ConvEngineSetting, OverrideActsAsTheVariable) {
  ScopedEnv engine("FUSEBOX_CONV_ENGINE", "direct"), backend("FUSEBOX_CONV_BACKEND", std::nullopt);
  {
    ScopedConvEngine forced("implicit_gemm:64x64");
    EXPECT_EQ(conv_settings().engine.text(), "implicit_gemm:64x64");
    {
      ScopedConvEngine inner("");  // none: the environment decides again
      EXPECT_EQ(conv_settings().engine.text(), "direct");
    }
    EXPECT_EQ(conv_settings().engine.text(), "implicit_gemm:64x64");
  }
  EXPECT_EQ(conv_settings().engine.text(), "direct");
  EXPECT_FALSE(conv_engine_override().has_value());
}

// The default policy's order (engines.cpp states why): a change shows here.
TEST(ConvEngineSetting, ListIsInPolicyOrder) {
  std::vector<std::string> names;
  for (const ConvEngine* e : conv_engines()) names.push_back(e->name());
  const std::vector<std::string> want = {
      "depthwise",      "cudnn",  "halo_wgrad", "patch_wgrad",   "phase_dgrad",
      "space_to_depth", "im2col", "cutlass",    "implicit_gemm", "direct"};
  EXPECT_EQ(names, want);
  for (const std::string& n : want) EXPECT_EQ(find_conv_engine(n)->name(), n);
  EXPECT_EQ(find_conv_engine("igemm"), nullptr);
  EXPECT_TRUE(find_conv_engine("halo_wgrad")->implements(ConvOp::wgrad));
  EXPECT_FALSE(find_conv_engine("halo_wgrad")->implements(ConvOp::fprop));
  EXPECT_TRUE(find_conv_engine("phase_dgrad")->implements(ConvOp::dgrad));
  EXPECT_FALSE(find_conv_engine("phase_dgrad")->implements(ConvOp::wgrad));
}

}  // namespace
}  // namespace fusebox::cuda::testing
