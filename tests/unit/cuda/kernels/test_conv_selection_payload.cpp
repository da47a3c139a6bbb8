// Autotuning's decision payload on disk (kernels/conv/selection.h), without a GPU: version 2
// names the winning engine and its form; a version-1 decision (before engines had names) is
// read as it was meant (the default policy's engine); anything else is refused with a reason,
// never misread.
#include <gtest/gtest.h>

#include "backends/cuda/kernels/conv/selection.h"

namespace fusebox::cuda {
namespace {

std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

TEST(ConvSelectionPayload, RoundTripsTheWinningEngine) {
  ConvSelection s;
  s.own = true;
  s.own_ms = 0.0299;
  s.cudnn_ms = 0.0402;
  s.own_plan = "cutlass128x128x64 sm90 bf16 tma-im2col";
  s.cudnn_plan = "eng0";
  s.own_engine = "cutlass";
  s.own_unfused = true;
  const std::string payload = encode_conv_selection(s);
  EXPECT_EQ(payload.rfind("fusebox-conv-select 2\n", 0), 0u) << payload;
  std::string why;
  const std::optional<ConvSelection> back = decode_conv_selection(bytes_of(payload), why);
  ASSERT_TRUE(back.has_value()) << why;
  EXPECT_TRUE(back->own);
  EXPECT_NEAR(back->own_ms, 0.0299, 1e-6);
  EXPECT_NEAR(back->cudnn_ms, 0.0402, 1e-6);
  EXPECT_EQ(back->own_plan, s.own_plan);
  EXPECT_EQ(back->cudnn_plan, "eng0");
  EXPECT_EQ(back->own_engine, "cutlass");
  EXPECT_TRUE(back->own_unfused);
  EXPECT_NE(back->describe().find("cutlass + epilogue kernel 0.0299 ms"), std::string::npos)
      << back->describe();
}

TEST(ConvSelectionPayload, ReadsVersionOneAsTheDefaultEngine) {
  std::string why;
  const std::optional<ConvSelection> v1 = decode_conv_selection(
      bytes_of("fusebox-conv-select 1\nown\n0.020000\n0.030000\nigemm bf16\neng7\n"), why);
  ASSERT_TRUE(v1.has_value()) << why;
  EXPECT_TRUE(v1->own);
  EXPECT_EQ(v1->own_engine, "");  // engines.cpp replays the default policy's engine
  EXPECT_FALSE(v1->own_unfused);
  EXPECT_NE(v1->describe().find("own 0.0200 ms (igemm bf16)"), std::string::npos) << v1->describe();
}

TEST(ConvSelectionPayload, RefusesWhatItDoesNotRead) {
  const std::pair<const char*, const char*> bad[] = {
      {"fusebox-conv-select 3\nown\n1\n2\na\nb\nc\nfused\n", "this build reads"},
      {"fusebox-conv-select 2\nown\n1\n2\na\nb\n", "this build reads"},  // v2 without its lines
      {"fusebox-conv-select 2\nboth\n1\n2\na\nb\nc\nfused\n", "winner 'both'"},
      {"fusebox-conv-select 2\nown\nfast\n2\na\nb\nc\nfused\n", "malformed times"},
      {"fusebox-conv-select 2\nown\n1\n2\na\nb\nc\nhalf\n", "form 'half'"},
      {"not a selection", "not a selection payload"}};
  for (const auto& [text, reason] : bad) {
    std::string why;
    EXPECT_FALSE(decode_conv_selection(bytes_of(text), why).has_value()) << text;
    EXPECT_NE(why.find(reason), std::string::npos) << text << ": " << why;
  }
}

}  // namespace
}  // namespace fusebox::cuda
