// The scalar formulas of the float pointwise ops, as functions of the compute type C (float
// for f32, f16 and bf16; double for f64). pointwise.cpp maps them over tensors, one op per
// pass, and fused_pointwise.cpp over a program's values: one copy of each formula, so a
// fused chain computes the unfused ops' bits.
//
//   with_float_unary<C>(instr, use)   calls use(f), f: C -> C, for relu .. clip with the
//                                     instruction's attributes (alpha, tanh, clip bounds)
//   with_float_binary<C>(op, use)     calls use(f), f: (C, C) -> C, for add .. pow
//   with_float_derivative<C>(op, ...) calls use(df), df: C -> C, a unary op's derivative
//                                     (unary_backward's formulas: dx = dy * df(x))
//   with_float_binary_instr<C>(ins, use)  a two-operand instruction: binary ops, unary_backward
//   activate_in_place<C>(a, y, n)     a fused epilogue's activation (ir/ops.h FusedActivation:
//                                     a conv's or gemm's) by the unary op's formula
// Both return false (calling nothing) for any other op. A node's attributes come in as
// pointwise_instr(node, {}) (ir/pointwise_program.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "fusebox/ir/ops.h"
#include "kernel_util.h"

namespace fusebox::cpu {

template <class C>
C sigmoid(C v) {  // never overflows: exp of a non-positive number only
  if (v >= 0) return C(1) / (C(1) + std::exp(-v));
  C e = std::exp(v);
  return e / (C(1) + e);
}

// Clip bounds as values of the compute type. For integers the bounds round
// inwards (min up, max down) and saturate, so +-infinity means unbounded.
template <class C>
std::pair<C, C> clip_bounds(double min, double max) {
  if constexpr (std::is_floating_point_v<C>)
    return {C(min), C(max)};
  else
    return {convert<C>(std::ceil(min)), convert<C>(std::floor(max))};
}

template <class C, class Use>
bool with_float_unary(const PointwiseInstr& ins, Use&& use) {
  auto call = [&](auto f) {
    use(f);
    return true;
  };
  switch (ins.op) {
    case OpKind::relu:
      return call([](C v) { return v < 0 ? C(0) : v; });
    case OpKind::leaky_relu: {
      const C alpha = C(ins.alpha);
      return call([alpha](C v) { return v < 0 ? alpha * v : v; });
    }
    case OpKind::gelu:
      if (ins.tanh_approximation) {
        // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        const C k = std::numbers::sqrt2_v<C> * std::numbers::inv_sqrtpi_v<C>;
        return call([k](C v) {
          return C(0.5) * v * (C(1) + std::tanh(k * (v + C(0.044715) * v * v * v)));
        });
      }
      // 0.5 x (1 + erf(x / sqrt(2))), activation.h's formula
      return call(
          [](C v) { return C(0.5) * v * (C(1) + std::erf(v * C(std::numbers::sqrt2 / 2))); });
    case OpKind::silu:
      return call([](C v) { return v * sigmoid(v); });
    case OpKind::sigmoid:
      return call([](C v) { return sigmoid(v); });
    case OpKind::tanh:
      return call([](C v) { return std::tanh(v); });
    case OpKind::exp:
      return call([](C v) { return std::exp(v); });
    case OpKind::log:
      return call([](C v) { return std::log(v); });
    case OpKind::sqrt:
      return call([](C v) { return std::sqrt(v); });
    case OpKind::rsqrt:
      return call([](C v) { return C(1) / std::sqrt(v); });
    case OpKind::reciprocal:
      return call([](C v) { return C(1) / v; });
    case OpKind::neg:
      return call([](C v) { return -v; });
    case OpKind::abs:
      return call([](C v) { return std::fabs(v); });
    case OpKind::erf:
      return call([](C v) { return std::erf(v); });
    case OpKind::sin:
      return call([](C v) { return std::sin(v); });
    case OpKind::cos:
      return call([](C v) { return std::cos(v); });
    case OpKind::floor:
      return call([](C v) { return std::floor(v); });
    case OpKind::ceil:
      return call([](C v) { return std::ceil(v); });
    case OpKind::round:  // half to even (the default rounding mode)
      return call([](C v) { return std::nearbyint(v); });
    case OpKind::clip: {
      // numpy clip: min(max(x, lo), hi), so lo > hi gives hi; NaN stays NaN.
      // Not a structured binding: clang before 16 (the fuzz build's) cannot capture one.
      const std::pair<C, C> bounds = clip_bounds<C>(ins.min, ins.max);
      return call(
          [lo = bounds.first, hi = bounds.second](C v) { return std::min(std::max(v, lo), hi); });
    }
    default:
      return false;
  }
}

template <class C, class Use>
bool with_float_binary(OpKind op, Use&& use) {
  auto call = [&](auto f) {
    use(f);
    return true;
  };
  switch (op) {
    case OpKind::add:
      return call([](C u, C v) { return u + v; });
    case OpKind::sub:
      return call([](C u, C v) { return u - v; });
    case OpKind::mul:
      return call([](C u, C v) { return u * v; });
    case OpKind::div:
      return call([](C u, C v) { return u / v; });
    // NaN in either operand gives NaN (numpy maximum/minimum, torch.max/min).
    case OpKind::max:
      return call([](C u, C v) { return u > v || std::isnan(u) ? u : v; });
    case OpKind::min:
      return call([](C u, C v) { return u < v || std::isnan(u) ? u : v; });
    case OpKind::pow:  // the exponent converted to C first (binary_pow in pointwise.cpp)
      return call([](C u, C v) { return std::pow(u, v); });
    default:
      return false;
  }
}

// 1 / (1 + e^-v): e^-v overflows to inf for very negative v, giving 0, never NaN (the
// derivatives' form; the forward's sigmoid above avoids the overflow instead).
template <class C>
C logistic(C v) {
  return C(1) / (C(1) + std::exp(-v));
}

// Calls use(df), df: C -> C the derivative of unary op `op` (unary_backward's forward op;
// alpha, tanh_approximation, min and max its attributes), with the formulas unary_backward
// computes dx = dy * df(x) by; false for an op without one.
template <class C, class Use>
bool with_float_derivative(OpKind op, double alpha, bool tanh_approximation, double min, double max,
                           Use&& use) {
  auto call = [&](auto f) {
    use(f);
    return true;
  };
  switch (op) {
    case OpKind::relu:  // relu'(0) = 0
      return call([](C v) { return v > 0 ? C(1) : C(0); });
    case OpKind::leaky_relu: {  // slope alpha at 0 (PyTorch)
      const C a = C(alpha);
      return call([a](C v) { return v > 0 ? C(1) : a; });
    }
    case OpKind::gelu:
      if (tanh_approximation) {
        // u = k (v + 0.044715 v^3), k = sqrt(2/pi):
        // d/dv 0.5 v (1 + tanh u) = 0.5 (1 + tanh u) + 0.5 v (1 - tanh^2 u) k (1 + 3*0.044715 v^2)
        const C k = std::numbers::sqrt2_v<C> * std::numbers::inv_sqrtpi_v<C>;
        return call([k](C v) {
          const C t = std::tanh(k * (v + C(0.044715) * v * v * v));
          return C(0.5) * (C(1) + t) +
                 C(0.5) * v * (C(1) - t * t) * k * (C(1) + C(3 * 0.044715) * v * v);
        });
      }
      // d/dv v Phi(v) = Phi(v) + v phi(v)
      return call([](C v) {
        const C cdf = C(0.5) * (C(1) + std::erf(v * C(std::numbers::sqrt2 / 2)));
        const C pdf =
            std::exp(C(-0.5) * v * v) * C(std::numbers::inv_sqrtpi * std::numbers::sqrt2 / 2);
        return cdf + v * pdf;
      });
    case OpKind::silu:  // s (1 + v (1 - s))
      return call([](C v) {
        const C s = logistic(v);
        return s * (C(1) + v * (C(1) - s));
      });
    case OpKind::sigmoid:
      return call([](C v) {
        const C s = logistic(v);
        return s * (C(1) - s);
      });
    case OpKind::tanh:
      return call([](C v) {
        const C t = std::tanh(v);
        return C(1) - t * t;
      });
    case OpKind::exp:
      return call([](C v) { return std::exp(v); });
    case OpKind::log:
      return call([](C v) { return C(1) / v; });
    case OpKind::sqrt:
      return call([](C v) { return C(0.5) / std::sqrt(v); });
    case OpKind::rsqrt:  // -0.5 v^(-3/2)
      return call([](C v) { return C(-0.5) / (v * std::sqrt(v)); });
    case OpKind::reciprocal:
      return call([](C v) { return C(-1) / (v * v); });
    case OpKind::neg:
      return call([](C) { return C(-1); });
    case OpKind::abs:  // sign(v), 0 at 0
      return call([](C v) { return v > 0 ? C(1) : v < 0 ? C(-1) : C(0); });
    case OpKind::erf:
      return call([](C v) { return C(2) * std::numbers::inv_sqrtpi_v<C> * std::exp(-v * v); });
    case OpKind::sin:
      return call([](C v) { return std::cos(v); });
    case OpKind::cos:
      return call([](C v) { return -std::sin(v); });
    case OpKind::floor:  // piecewise constant: 0 (as PyTorch)
    case OpKind::ceil:
    case OpKind::round:
      return call([](C) { return C(0); });
    case OpKind::clip: {  // passes where min <= v <= max, bounds inclusive (PyTorch)
      const C lo = C(min), hi = C(max);
      return call([lo, hi](C v) { return v >= lo && v <= hi ? C(1) : C(0); });
    }
    default:
      return false;
  }
}

// A two-operand program instruction (ir/pointwise_program.h): calls use(f), f: (C, C) -> C,
// for the binary ops and unary_backward (dy, x) -> dy * df(x); false for any other op.
template <class C, class Use>
bool with_float_binary_instr(const PointwiseInstr& ins, Use&& use) {
  if (ins.op != OpKind::unary_backward) return with_float_binary<C>(ins.op, use);
  return with_float_derivative<C>(ins.of, ins.alpha, ins.tanh_approximation, ins.min, ins.max,
                                  [&](auto df) { use([df](C dy, C x) { return dy * df(x); }); });
}

// y[i] = a(y[i]) for i < count, a being the unary op the activation stands for (none: y
// unchanged): the epilogues of conv and gemm compute the unfused ops' formulas.
template <class C>
void activate_in_place(const FusedActivation& a, C* y, int64_t count) {
  PointwiseInstr ins;
  switch (a.kind) {
    case Activation::none:
      return;
    case Activation::relu:
      ins.op = OpKind::relu;
      break;
    case Activation::gelu:
    case Activation::gelu_tanh:
      ins.op = OpKind::gelu;
      ins.tanh_approximation = a.kind == Activation::gelu_tanh;
      break;
    case Activation::silu:
      ins.op = OpKind::silu;
      break;
    case Activation::sigmoid:
      ins.op = OpKind::sigmoid;
      break;
    case Activation::tanh:
      ins.op = OpKind::tanh;
      break;
    case Activation::clip:
      ins.op = OpKind::clip;
      ins.min = a.min;
      ins.max = a.max;
      break;
  }
  with_float_unary<C>(ins, [&](auto f) {
    parallel_for(count, 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = f(y[i]);
    });
  });
}

}  // namespace fusebox::cpu
