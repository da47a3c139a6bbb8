// The pool window arithmetic both backends share (backends/common/pool_window.h), without a
// GPU: each output's taps and avg_pool's divisor against a walk over every tap (padding,
// dilation, ceil_mode's last window), the inverse map the CUDA gradients gather by, and the
// shape checks naming the node.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "backends/common/pool_window.h"
#include "fusebox/core/error.h"
#include "fusebox/ir/ops.h"

namespace fusebox {
namespace {

const std::string kWhere = "max_pool 'pool1'";

// One spatial dim of extent `in` as the innermost of a 3-D window.
PoolWindow window_1d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation,
                     int64_t pad_lo, int64_t pad_hi) {
  PoolWindow w;
  w.batch = 1, w.channels = 1;
  w.in[2] = in, w.out[2] = out, w.kernel[2] = kernel, w.stride[2] = stride;
  w.dilation[2] = dilation, w.pad_lo[2] = pad_lo, w.pad_hi[2] = pad_hi;
  return w;
}

void expect_taps(const TapRange& t, int64_t first, int64_t count, int64_t padded) {
  EXPECT_EQ(t.count, count);
  if (count > 0) {
    EXPECT_EQ(t.first, first);
  }
  EXPECT_EQ(t.padded, padded);
}

TEST(PoolWindow, PaddingIsNeverATapButCountsWithCountIncludePad) {
  // D 5, kernel 3, stride 2, pads 1/1: O 3, windows [-1, 1], [1, 3], [3, 5].
  const PoolWindow w = window_1d(5, 3, 3, 2, 1, 1, 1);
  expect_taps(window_taps(w, 2, 0), 0, 2, 3);
  expect_taps(window_taps(w, 2, 1), 1, 3, 3);
  expect_taps(window_taps(w, 2, 2), 3, 2, 3);
  const TapRange one{0, 1, 1};
  EXPECT_EQ(window_divisor(one, one, window_taps(w, 2, 0), false), 2);
  EXPECT_EQ(window_divisor(one, one, window_taps(w, 2, 0), true), 3);
}

TEST(PoolWindow, CeilModeLastWindowPastTheEndPaddingCountsOnlyUpToIt) {
  // D 6, kernel 3, stride 2, pads 0/0, ceil_mode: O = ceil((6 - 3) / 2) + 1 = 3 (the last
  // window starts at 4, inside x). Its taps 4, 5, 6: two in x, none in padding, one past it.
  const PoolWindow w = window_1d(6, 3, 3, 2, 1, 0, 0);
  expect_taps(window_taps(w, 2, 2), 4, 2, 2);
  // With an end pad of 1 the third tap is padding: count_include_pad divides by 3.
  const PoolWindow padded = window_1d(6, 3, 3, 2, 1, 0, 1);
  expect_taps(window_taps(padded, 2, 2), 4, 2, 3);
  // Begin pad 1, end pad 1, D 6: ceil gives O 4, the last window [5, 7] holds x[5], the end
  // pad 6 and 7 beyond it: padded 2.
  const PoolWindow both = window_1d(6, 4, 3, 2, 1, 1, 1);
  expect_taps(window_taps(both, 2, 3), 5, 1, 2);
}

TEST(PoolWindow, DilatedWindowMayHaveNoTapInBounds) {
  // D 1, kernel 2, dilation 3, pads 2/2: the window at -2 taps -2 and 1, both outside x.
  const PoolWindow w = window_1d(1, 2, 2, 1, 3, 2, 2);
  expect_taps(window_taps(w, 2, 0), 0, 0, 2);
  // The next one taps -1 and 2: begin and end padding.
  expect_taps(window_taps(w, 2, 1), 0, 0, 2);
}

TEST(PoolWindow, LeadingDimsOfLowerRanksAreSingleTaps) {
  const PoolWindow w = window_1d(7, 3, 3, 2, 1, 0, 0);
  for (int d = 0; d < 2; ++d) expect_taps(window_taps(w, d, 0), 0, 1, 1);
  EXPECT_EQ(w.in_size(), 7);
  EXPECT_EQ(w.out_size(), 3);
}

// Over random windows: window_taps and windows_holding / is_window_tap agree with a walk
// over every tap j < kernel of every output.
TEST(PoolWindow, TapsAndTheirInverseMatchAWalkOverEveryTap) {
  std::mt19937_64 rng(11);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t in = pick(1, 12), kernel = pick(1, 4), stride = pick(1, 3), dilation = pick(1, 3);
    const int64_t reach = dilation * (kernel - 1) + 1;
    const int64_t pad_lo = pick(0, reach - 1), pad_hi = pick(0, reach - 1);
    const int64_t padded_in = in + pad_lo + pad_hi;
    if (padded_in < reach) continue;
    // floor or ceil mode, as shape inference gives O (a last window starting in the end
    // padding is dropped).
    int64_t last = (padded_in - reach) / stride;
    if (pick(0, 1) == 1 && (padded_in - reach) % stride != 0 && (last + 1) * stride < in + pad_lo)
      ++last;
    const PoolWindow w = window_1d(in, last + 1, kernel, stride, dilation, pad_lo, pad_hi);
    SCOPED_TRACE(::testing::Message()
                 << "D " << in << " kernel " << kernel << " stride " << stride << " dilation "
                 << dilation << " pads " << pad_lo << "/" << pad_hi << " O " << w.out[2]);
    for (int64_t o = 0; o < w.out[2]; ++o) {
      int64_t first = -1, count = 0, padded = 0;
      for (int64_t j = 0; j < kernel; ++j) {
        const int64_t i = o * stride - pad_lo + j * dilation;
        if (i >= 0 && i < in) {
          if (count++ == 0) first = i;
          EXPECT_EQ(i, first + (count - 1) * dilation) << "in-bounds taps are consecutive";
        }
        padded += i >= -pad_lo && i < in + pad_hi;
      }
      expect_taps(window_taps(w, 2, o), first, count, padded);
    }
    for (int64_t i = 0; i < in; ++i) {
      const OutputSpan span = windows_holding(w, 2, i);
      for (int64_t o = 0; o < w.out[2]; ++o) {
        bool holds = false;
        for (int64_t j = 0; j < kernel; ++j) holds |= o * stride - pad_lo + j * dilation == i;
        const bool found = o >= span.first && o <= span.last && is_window_tap(w, 2, i, o);
        EXPECT_EQ(found, holds) << "input " << i << " output " << o;
      }
    }
  }
}

PoolAttrs pool_attrs(Shape kernel) {
  PoolAttrs a;
  const size_t rank = kernel.size();
  a.kernel = std::move(kernel);
  a.strides.assign(rank, 1);
  a.dilations.assign(rank, 1);
  a.pads_begin.assign(rank, 0);
  a.pads_end.assign(rank, 0);
  return a;
}

// The Error's message of make_pool_window, or "" when it does not throw.
std::string refusal(const PoolAttrs& a, const Shape& x, const Shape& y) {
  try {
    make_pool_window(a, x, y, kWhere);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PoolWindow, MakeStoresEveryRankAsThreeDimensionalAndNamesTheNodeWhenItRefuses) {
  PoolAttrs a = pool_attrs({3, 2});
  a.strides = {2, 1}, a.pads_begin = {1, 0}, a.pads_end = {1, 1};
  const PoolWindow w = make_pool_window(a, {2, 3, 9, 8}, {2, 3, 5, 8}, kWhere);
  EXPECT_EQ(w.batch, 2);
  EXPECT_EQ(w.channels, 3);
  EXPECT_EQ(w.planes(), 6);
  EXPECT_EQ(w.in[0], 1);
  EXPECT_EQ(w.kernel[0], 1);
  EXPECT_EQ(w.in[1], 9);
  EXPECT_EQ(w.out[1], 5);
  EXPECT_EQ(w.kernel[1], 3);
  EXPECT_EQ(w.stride[1], 2);
  EXPECT_EQ(w.pad_lo[1], 1);
  EXPECT_EQ(w.pad_hi[2], 1);

  struct Case {
    const char* what;
    std::string message;
    const char* expected;
  };
  PoolAttrs zero_stride = pool_attrs({2});
  zero_stride.strides = {0};
  PoolAttrs negative_pad = pool_attrs({2});
  negative_pad.pads_end = {-1};
  const Case cases[] = {
      {"rank 2", refusal(pool_attrs({}), {2, 3}, {2, 3}), "1 to 3 spatial dims"},
      {"channels differ", refusal(pool_attrs({2}), {2, 3, 8}, {2, 4, 7}), "1 to 3 spatial dims"},
      {"attributes of another rank", refusal(pool_attrs({2, 2}), {2, 3, 8}, {2, 3, 7}),
       "not normalised to 1 spatial dims"},
      {"stride 0", refusal(zero_stride, {2, 3, 8}, {2, 3, 7}), "bad window in spatial dim 0"},
      {"negative pad", refusal(negative_pad, {2, 3, 8}, {2, 3, 7}), "pads 0 and -1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_NE(c.message.find(kWhere), std::string::npos) << c.message;
    EXPECT_NE(c.message.find(c.expected), std::string::npos) << c.message;
  }
}

}  // namespace
}  // namespace fusebox
