// Element types and host half / bfloat16 with round-to-nearest-even conversion.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace fusebox {

enum class DType : uint8_t { f64, f32, f16, bf16, i64, i32, boolean };

constexpr int kNumDTypes = 7;

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", "bool", ...
bool parse_dtype(const std::string& name, DType* out);
inline bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16;
}
inline bool is_integer(DType t) {
  return t == DType::i64 || t == DType::i32;
}
// f16 or bf16: the low precisions mixed precision computes in.
inline bool is_low_float(DType t) {
  return t == DType::f16 || t == DType::bf16;
}
// The dtype statistics of float values of dtype x are kept in (norms' mean and inverse
// deviation, ONNX stash_type 1; a loss over f16/bf16 logits): f64 for f64, else f32.
inline DType stash_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

// IEEE binary16. Conversions round to nearest, ties to even; NaN stays NaN,
// overflow becomes infinity, subnormals are kept.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f);
  explicit Half(double d);
  explicit operator float() const;
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

// bfloat16: the upper half of an f32, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f);
  explicit BFloat16(double d);
  explicit operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

// Maps a C++ type to its DType.
// clang-format off
template <class T> struct dtype_of;
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };
// clang-format on

// Calls f(T{}) with T the C++ type of `t`: visit_dtype(t, [&](auto tag){ using T = decltype(tag);
// ... }).
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f64:
      return f(double{});
    case DType::f32:
      return f(float{});
    case DType::f16:
      return f(Half{});
    case DType::bf16:
      return f(BFloat16{});
    case DType::i64:
      return f(int64_t{});
    case DType::i32:
      return f(int32_t{});
    case DType::boolean:
      return f(bool{});
  }
  return f(float{});
}

}  // namespace fusebox
