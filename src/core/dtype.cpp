#include "fusebox/core/dtype.h"

#include <cmath>

namespace fusebox {

// The two switches below read as tables.
// clang-format off
size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::boolean: return "bool";
  }
  return "?";
}
// clang-format on

bool parse_dtype(const std::string& name, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == dtype_name(DType(i))) {
      *out = DType(i);
      return true;
    }
  }
  return false;
}

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Double -> float rounding to odd: exact when representable, otherwise the
// truncated value with its lowest bit set. Rounding that result to a format
// with at least 2 fewer significand bits (half: 11, bfloat16: 8) gives the same
// answer as rounding the double directly, so no double-rounding error.
float round_to_odd_float(double d) {
  if (std::isnan(d)) return float(d);
  float f = float(d);
  if (double(f) == d) return f;
  if (std::isinf(f))
    f = std::nextafter(f, 0.0f);  // beyond float range: largest finite, odd
  else if (std::fabs(double(f)) > std::fabs(d))
    f = std::nextafter(f, 0.0f);
  return bits_float(float_bits(f) | 1u);
}

uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14)
    // Subnormal half: value = m * 2^-24. Add 0.5 (in units of 2^-24) via float magic.
    float af = bits_float(abs);
    // Adding 0.5 makes the FPU round the significand to an integer multiple of 2^-24 (RNE).
    float r = af + 0.5f;
    return uint16_t(sign | (float_bits(r) - 0x3f000000u));
  }
  // Normal: rebias exponent (127 -> 15) and round 13 dropped bits to nearest even.
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // -(112 << 23) + rounding bias
  return uint16_t(sign | (abs >> 13));
}

float half_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return uint16_t(x >> 16);
}

}  // namespace

Half::Half(float f) : bits(float_to_half_bits(f)) {}
Half::Half(double d) : bits(float_to_half_bits(round_to_odd_float(d))) {}
Half::operator float() const {
  return half_bits_to_float(bits);
}
BFloat16::BFloat16(float f) : bits(float_to_bf16_bits(f)) {}
BFloat16::BFloat16(double d) : bits(float_to_bf16_bits(round_to_odd_float(d))) {}

}  // namespace fusebox
