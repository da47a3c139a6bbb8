// The fused activations of op epilogues (Activation in fusebox/ir/ops.h: a conv's
// activation and residual_activation, a gemm's activation) on the GPU: the CUDA epilogue
// kernel (kernels/conv/epilogue.cu) computes them with these, in the compute type (f32 for
// f16/bf16). The formulas are the unfused ops' (cuda/kernels/pointwise/unary.cu, which takes
// gelu_tanh from here); the CPU computes epilogues with its own ops' formulas
// (cpu/pointwise_math.h activate_in_place). Includes only standard headers, so CUDA device
// code may include it.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "backends/common/index_math.h"  // FUSEBOX_HOST_DEVICE

namespace fusebox {

// An Activation by value, device-safe: `kind` is the Activation enumerator's value.
struct ActivationFn {
  enum Kind : uint8_t { none, relu, gelu, gelu_tanh, silu, sigmoid, tanh, clip };
  uint8_t kind = none;
  double min = 0, max = 0;  // clip's bounds
};

namespace activation_detail {

template <class C>
FUSEBOX_HOST_DEVICE C exp_(C v) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(C) == 4)
    return expf(v);
  else
    return ::exp(v);
#else
  return std::exp(v);
#endif
}
template <class C>
FUSEBOX_HOST_DEVICE C tanh_(C v) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(C) == 4)
    return tanhf(v);
  else
    return ::tanh(v);
#else
  return std::tanh(v);
#endif
}
template <class C>
FUSEBOX_HOST_DEVICE C erf_(C v) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(C) == 4)
    return erff(v);
  else
    return ::erf(v);
#else
  return std::erf(v);
#endif
}
// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). On the device in f32 as x *
// sigmoid(2u) = x / (1 + 2^(-2u log2(e))), the same value: one exp2 and one approximate
// reciprocal instead of tanhf's branchy polynomial, no cancellation for any u (a few ulps;
// 2u beyond exp2's range gives 0 or x, the limits). Why: gelu chains are compute-bound on
// an H100 with tanhf. kernels/pointwise/fused_preamble.cpp's fb_gelu_tanh is this formula
// in NVRTC source (the fused kernels match these bits).
template <class C>
FUSEBOX_HOST_DEVICE C gelu_tanh_(C v) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(C) == 4) {
    const float e = exp2f(-2.302208198144325f * (v + 0.044715f * v * v * v));
    return __fdividef(v, 1.0f + e);
  }
#endif
  const C k = C(0.79788456080286535588);
  return C(0.5) * v * (C(1) + tanh_(k * (v + C(0.044715) * v * v * v)));
}
template <class C>
FUSEBOX_HOST_DEVICE C sigmoid_(C v) {  // never overflows: exp of a non-positive number only
  if (v >= C(0)) return C(1) / (C(1) + exp_(-v));
  const C e = exp_(v);
  return e / (C(1) + e);
}

}  // namespace activation_detail

// f(v) for the activation; NaN stays NaN (relu and clip as the ops: v < 0 ? 0 : v and
// min(max(v, lo), hi) with NaN compared false).
template <class C>
FUSEBOX_HOST_DEVICE C activate(const ActivationFn& a, C v) {
  using namespace activation_detail;
  switch (a.kind) {
    case ActivationFn::relu:
      return v < C(0) ? C(0) : v;
    case ActivationFn::gelu:  // 0.5 x (1 + erf(x / sqrt(2))), x / sqrt(2) as x * (sqrt(2) / 2)
      // (PyTorch's formula; a division by a constant is an IEEE division on the GPU, several
      // times the cost of the multiply)
      return C(0.5) * v * (C(1) + erf_(v * C(std::numbers::sqrt2 / 2)));
    case ActivationFn::gelu_tanh:
      return gelu_tanh_(v);
    case ActivationFn::silu:
      return v * sigmoid_(v);
    case ActivationFn::sigmoid:
      return sigmoid_(v);
    case ActivationFn::tanh:
      return tanh_(v);
    case ActivationFn::clip: {
      const C lo = C(a.min), hi = C(a.max);
      const C up = v < lo ? lo : v;  // max(v, lo), NaN kept
      return up > hi ? hi : up;
    }
    default:
      return v;
  }
}

}  // namespace fusebox
