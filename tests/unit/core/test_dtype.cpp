// Half / bfloat16 conversions checked against an independent oracle: the nearest
// representable value found by searching the sorted list of all finite values,
// ties to the one with an even bit pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "fusebox/core/dtype.h"

namespace fusebox {
namespace {

template <class H>
std::vector<std::pair<double, uint16_t>> finite_nonnegative_values() {
  std::vector<std::pair<double, uint16_t>> v;
  for (uint32_t b = 0; b < 0x8000; ++b) {
    float f = float(H::from_bits(uint16_t(b)));
    if (std::isfinite(f)) v.push_back({double(f), uint16_t(b)});
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Round-to-nearest-even by search. |x| at or past the midpoint between the
// largest finite value and the next power of two becomes infinity (IEEE).
template <class H>
uint16_t oracle(double x, const std::vector<std::pair<double, uint16_t>>& table,
                double overflow_threshold, uint16_t inf_bits) {
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double a = std::fabs(x);
  if (a >= overflow_threshold) return sign | inf_bits;
  auto hi = std::lower_bound(table.begin(), table.end(), std::make_pair(a, uint16_t(0)));
  if (hi == table.begin()) return sign | hi->second;
  if (hi == table.end()) return sign | (hi - 1)->second;
  auto lo = hi - 1;
  double dl = a - lo->first, dh = hi->first - a;
  if (dl < dh) return sign | lo->second;
  if (dh < dl) return sign | hi->second;
  return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
}

TEST(Half, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    Half h = Half::from_bits(uint16_t(b));
    float f = float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(float(Half(f)))) << b;
      continue;
    }
    EXPECT_EQ(Half(f).bits, b) << "bits " << b << " value " << f;
    EXPECT_EQ(Half(double(f)).bits, b) << "bits " << b << " value " << f;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(-2.0f).bits, 0xc000);
  EXPECT_EQ(Half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(Half(65519.99f).bits, 0x7bff);              // below the rounding midpoint to infinity
  EXPECT_EQ(Half(65520.0f).bits, 0x7c00);               // the midpoint rounds to even: infinity
  EXPECT_EQ(Half(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(Half(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie with 0 -> even (0)
  EXPECT_EQ(Half(std::ldexp(1.5f, -25)).bits, 0x0001);
  EXPECT_EQ(Half(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);      // tie -> even
  EXPECT_EQ(Half(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);  // tie -> even (up)
  EXPECT_TRUE(std::isinf(float(Half(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isnan(float(Half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Half(-0.0f).bits, 0x8000);
}

TEST(BFloat16, KnownValues) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);      // tie -> even
  EXPECT_EQ(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);  // tie -> even (up)
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -7)).bits, 0x3f81);
  EXPECT_TRUE(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(float(BFloat16(std::numeric_limits<float>::max()))));  // rounds up
  EXPECT_EQ(BFloat16(1e300).bits, 0x7f80);
}

TEST(BFloat16, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    BFloat16 h = BFloat16::from_bits(uint16_t(b));
    float f = float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(BFloat16(f).bits, b);
    EXPECT_EQ(BFloat16(double(f)).bits, b);
  }
}

// Random doubles across the whole half range: the direct double->half path must
// equal the search oracle (no double-rounding through float).
TEST(Half, RandomDoublesMatchOracle) {
  auto table = finite_nonnegative_values<Half>();
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> exp_dist(-27, 17), mant(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) {
    double x = std::ldexp(mant(rng), int(exp_dist(rng)));
    if (rng() & 1) x = -x;
    uint16_t want = oracle<Half>(x, table, 65520.0, 0x7c00);
    ASSERT_EQ(Half(x).bits, want) << "x = " << x;
    ASSERT_EQ(Half(float(x)).bits, oracle<Half>(double(float(x)), table, 65520.0, 0x7c00));
  }
}

// Values one float-ulp away from a half midpoint: rounding through float first
// would land exactly on the midpoint and round to even (wrong); direct is right.
TEST(Half, DoubleNearMidpointNoDoubleRounding) {
  double mid = 1.0 + std::ldexp(1.0, -11);    // midpoint between 1 and 1+2^-10
  double above = mid + std::ldexp(1.0, -40);  // slightly above: rounds up
  EXPECT_EQ(Half(above).bits, 0x3c01);
  EXPECT_EQ(Half(mid).bits, 0x3c00);
}

TEST(BFloat16, RandomDoublesMatchOracle) {
  auto table = finite_nonnegative_values<BFloat16>();
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> exp_dist(-130, 127), mant(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) {
    double x = std::ldexp(mant(rng), int(exp_dist(rng)));
    if (rng() & 1) x = -x;
    uint16_t got = BFloat16(x).bits;
    uint16_t want = oracle<BFloat16>(x, table, std::ldexp(2.0 - 1.0 / 256, 127), 0x7f80);
    ASSERT_EQ(got, want) << "x = " << x;
  }
}

TEST(DType, NamesAndSizes) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t;
    ASSERT_TRUE(parse_dtype(dtype_name(DType(i)), &t));
    EXPECT_EQ(t, DType(i));
  }
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::boolean), 1u);
  DType t;
  EXPECT_FALSE(parse_dtype("float99", &t));
}

}  // namespace
}  // namespace fusebox
