// The convolution geometry both backends share (backends/common/conv_geometry.h): output
// extents for strides, dilations and pads; the rank-agnostic storage (1-D and 2-D as 3-D
// with leading extents of 1); every refusal an Error naming the node and what disagrees.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "backends/common/conv_geometry.h"
#include "fusebox/core/error.h"

namespace fusebox {
namespace {

const std::string kWhere = "conv 'stem'";

ConvAttrs attrs_2d(Shape strides, Shape dilations, Shape pads_begin, Shape pads_end,
                   int64_t groups = 1) {
  ConvAttrs a;
  a.strides = std::move(strides);
  a.dilations = std::move(dilations);
  a.pads_begin = std::move(pads_begin);
  a.pads_end = std::move(pads_end);
  a.groups = groups;
  return a;
}

// The Error's message of make_conv_geometry, or "" when it does not throw.
std::string refusal(const ConvAttrs& a, const Shape& x, const Shape& w, const Shape& y) {
  try {
    make_conv_geometry(a, x, w, y, kWhere);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConvGeometry, OutputExtentFollowsStridesDilationsAndPads) {
  // O = floor((D + pad_lo + pad_hi - dilation * (R - 1) - 1) / stride) + 1
  EXPECT_EQ(conv_output_extent(56, 3, 1, 1, 1, 1), 56);  // same padding
  EXPECT_EQ(conv_output_extent(56, 3, 2, 1, 1, 1), 28);  // ResNet's strided 3x3
  EXPECT_EQ(conv_output_extent(56, 3, 2, 1, 1, 0), 28);  // the high pad is slack here
  EXPECT_EQ(conv_output_extent(224, 7, 2, 1, 3, 3), 112);
  EXPECT_EQ(conv_output_extent(10, 3, 1, 2, 0, 0), 6);  // dilated reach 5
  EXPECT_EQ(conv_output_extent(10, 3, 3, 2, 2, 1), 3);  // (10 + 3 - 5) / 3 + 1
  EXPECT_EQ(conv_output_extent(5, 1, 2, 1, 0, 0), 3);   // strided 1x1 keeps the last pixel
  EXPECT_EQ(conv_output_extent(3, 5, 2, 1, 0, 0), 0);   // no window fits: floor, not truncation
  static_assert(conv_output_extent(7, 3, 2, 1, 0, 0) == 3);
}

TEST(ConvGeometry, StoresEveryRankAsThreeDimensional) {
  // 1-D: x [2, 4, 20], w [6, 2, 3] (groups 2), stride 2, dilation 2, pads 2/1: O = 10.
  ConvAttrs a;
  a.strides = {2}, a.dilations = {2}, a.pads_begin = {2}, a.pads_end = {1}, a.groups = 2;
  const ConvGeometry g = make_conv_geometry(a, {2, 4, 20}, {6, 2, 3}, {2, 6, 10}, kWhere);
  EXPECT_EQ(g.spatial_rank, 1);
  EXPECT_EQ(g.batch, 2);
  EXPECT_EQ(g.in_channels, 4);
  EXPECT_EQ(g.out_channels, 6);
  EXPECT_EQ(g.groups, 2);
  EXPECT_EQ(g.in_per_group(), 2);
  EXPECT_EQ(g.out_per_group(), 3);
  for (int d = 0; d < 2; ++d) {  // the leading fillers
    SCOPED_TRACE(d);
    EXPECT_EQ(g.in[d], 1);
    EXPECT_EQ(g.out[d], 1);
    EXPECT_EQ(g.filter[d], 1);
    EXPECT_EQ(g.stride[d], 1);
    EXPECT_EQ(g.dilation[d], 1);
    EXPECT_EQ(g.pad_lo[d], 0);
    EXPECT_EQ(g.pad_hi[d], 0);
  }
  EXPECT_EQ(g.in[2], 20);
  EXPECT_EQ(g.out[2], 10);
  EXPECT_EQ(g.filter[2], 3);
  EXPECT_EQ(g.stride[2], 2);
  EXPECT_EQ(g.dilation[2], 2);
  EXPECT_EQ(g.pad_lo[2], 2);
  EXPECT_EQ(g.pad_hi[2], 1);
  EXPECT_EQ(g.in_size(), 20);
  EXPECT_EQ(g.out_size(), 10);
  EXPECT_EQ(g.filter_size(), 3);

  // 2-D with asymmetric pads per dim: H (9 + 1 + 0 - 3) / 2 + 1 = 4, W 10 + 0 + 2 - 3 + 1 = 10.
  const ConvGeometry h = make_conv_geometry(attrs_2d({2, 1}, {1, 1}, {1, 0}, {0, 2}), {1, 3, 9, 10},
                                            {8, 3, 3, 3}, {1, 8, 4, 10}, kWhere);
  EXPECT_EQ(h.spatial_rank, 2);
  EXPECT_EQ(h.in[0], 1);
  EXPECT_EQ(h.in[1], 9);
  EXPECT_EQ(h.in[2], 10);
  EXPECT_EQ(h.out[1], 4);
  EXPECT_EQ(h.out[2], 10);
  EXPECT_EQ(h.pad_lo[1], 1);
  EXPECT_EQ(h.pad_hi[1], 0);
  EXPECT_EQ(h.pad_lo[2], 0);
  EXPECT_EQ(h.pad_hi[2], 2);
  EXPECT_EQ(h.filter_size(), 9);

  // 3-D: every dim its own.
  ConvAttrs b;
  b.strides = {1, 2, 3}, b.dilations = {1, 1, 2}, b.pads_begin = {0, 1, 2}, b.pads_end = {0, 1, 2};
  // D (4, 7, 11), R (1, 3, 3): O (4, (7 + 2 - 3) / 2 + 1 = 4, (11 + 4 - 5) / 3 + 1 = 4).
  const ConvGeometry t =
      make_conv_geometry(b, {1, 2, 4, 7, 11}, {5, 2, 1, 3, 3}, {1, 5, 4, 4, 4}, kWhere);
  EXPECT_EQ(t.spatial_rank, 3);
  EXPECT_EQ(t.in_size(), 4 * 7 * 11);
  EXPECT_EQ(t.out_size(), 64);
  EXPECT_EQ(t.stride[2], 3);
  EXPECT_EQ(t.dilation[2], 2);
}

TEST(ConvGeometry, RefusalsNameTheNodeAndTheReason) {
  const ConvAttrs same = attrs_2d({1, 1}, {1, 1}, {1, 1}, {1, 1});
  const Shape x = {2, 8, 10, 10}, w = {16, 8, 3, 3}, y = {2, 16, 10, 10};
  ASSERT_EQ(refusal(same, x, w, y), "");
  struct Case {
    const char* what;
    std::string message;
    const char* expected;
  };
  const Case cases[] = {
      {"wrong output height", refusal(same, x, w, {2, 16, 9, 10}),
       "output extent 9 does not match input extent 10"},
      {"4-D filter spatial", refusal(same, x, {16, 8, 3, 3, 3, 3}, y), "1 to 3 spatial dims"},
      {"rank mismatch", refusal(same, {2, 8, 10}, w, y), "must have the same rank"},
      {"attributes of another rank", refusal(attrs_2d({1}, {1}, {1}, {1}), x, w, y),
       "not normalised to 2 spatial dims"},
      {"channels against groups", refusal(attrs_2d({1, 1}, {1, 1}, {1, 1}, {1, 1}, 3), x, w, y),
       "channels do not match groups=3"},
      {"filter channels", refusal(same, x, {16, 4, 3, 3}, y), "channels do not match groups=1"},
      {"output channels", refusal(same, x, w, {2, 8, 10, 10}), "does not match input"},
      {"output batch", refusal(same, x, w, {3, 16, 10, 10}), "does not match input"},
      {"stride 0", refusal(attrs_2d({0, 1}, {1, 1}, {1, 1}, {1, 1}), x, w, y), "bad spatial dim 0"},
      {"dilation 0", refusal(attrs_2d({1, 1}, {1, 0}, {1, 1}, {1, 1}), x, w, y),
       "bad spatial dim 1"},
      {"negative pad", refusal(attrs_2d({1, 1}, {1, 1}, {-1, 1}, {1, 1}), x, w, y), "pads -1/1"},
      {"empty input", refusal(same, {2, 8, 0, 10}, w, y), "bad spatial dim 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_NE(c.message.find(kWhere), std::string::npos) << c.message;
    EXPECT_NE(c.message.find(c.expected), std::string::npos) << c.message;
  }
}

}  // namespace
}  // namespace fusebox
