// The fused activations of op epilogues (Activation in fusebox/ir/ops.h: a conv's
// activation and residual_activation), host and device: the CPU reference and the CUDA
// epilogue kernel compute them with these, in the compute type (f32 for f16/bf16). The
// formulas are the unfused ops' (backends/cpu/pointwise.cpp, cuda/kernels/pointwise/unary.cu).
// Includes only standard headers, so CUDA device code may include it.
#pragma once

#include <cmath>
#include <cstdint>

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
    case ActivationFn::gelu:  // 0.5 x (1 + erf(x / sqrt(2)))
      return C(0.5) * v * (C(1) + erf_(v / C(1.4142135623730950488)));
    case ActivationFn::gelu_tanh: {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const C k = C(0.79788456080286535588);
      return C(0.5) * v * (C(1) + tanh_(k * (v + C(0.044715) * v * v * v)));
    }
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
