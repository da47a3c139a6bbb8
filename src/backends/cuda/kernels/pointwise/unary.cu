// Unary pointwise ops on the GPU: y[i] = f(x[i]), f picked by the op, computed in
// compute_t<T> (f32 for f16/bf16, f64 for f64) and rounded once to T, with the CPU
// backend's formulas (backends/cpu/pointwise.cpp). x may be strided (a view); y is
// contiguous. Integers take relu, neg, abs and clip (wrapping two's complement, as the
// CPU); identity copies bytes.
#include <cmath>
#include <limits>
#include <numbers>

#include "backends/common/activation.h"
#include "backends/cuda/kernels/common/elementwise.cuh"

namespace fusebox::cuda {

namespace {

// y = convert<T>(f(convert<C>(x))): the conversions around a compute-type functor.
template <class T, class F>
struct UnaryMath {
  F f;
  __device__ __forceinline__ T operator()(T x) const {
    return convert<T>(f(convert<compute_t<T>>(x)));
  }
};

template <class C>
__device__ __forceinline__ C sigmoid(C v) {  // never overflows: exp of a non-positive number
  if (v >= C(0)) return C(1) / (C(1) + dm::exp(-v));
  const C e = dm::exp(v);
  return e / (C(1) + e);
}

struct Relu {
  template <class C>
  __device__ C operator()(C v) const {
    return v < C(0) ? C(0) : v;
  }
};
template <class C>
struct LeakyRelu {
  C alpha;
  __device__ C operator()(C v) const { return v < C(0) ? alpha * v : v; }
};
struct GeluErf {  // 0.5 x (1 + erf(x / sqrt(2))), activation.h's formula
  template <class C>
  __device__ C operator()(C v) const {
    return C(0.5) * v * (C(1) + dm::erf(v * C(std::numbers::sqrt2 / 2)));
  }
};
struct GeluTanh {  // backends/common/activation.h (f32: x * sigmoid(2u), see there)
  template <class C>
  __device__ C operator()(C v) const {
    return activation_detail::gelu_tanh_(v);
  }
};
struct Silu {
  template <class C>
  __device__ C operator()(C v) const {
    return v * sigmoid(v);
  }
};
struct Sigmoid {
  template <class C>
  __device__ C operator()(C v) const {
    return sigmoid(v);
  }
};
struct Tanh {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::tanh(v);
  }
};
struct Exp {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::exp(v);
  }
};
struct Log {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::log(v);
  }
};
struct Sqrt {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::sqrt(v);
  }
};
struct Rsqrt {  // 1 / sqrt, not the approximate rsqrtf: the CPU's formula
  template <class C>
  __device__ C operator()(C v) const {
    return C(1) / dm::sqrt(v);
  }
};
struct Reciprocal {
  template <class C>
  __device__ C operator()(C v) const {
    return C(1) / v;
  }
};
struct Erf {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::erf(v);
  }
};
struct Floor {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::floor(v);
  }
};
struct Ceil {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::ceil(v);
  }
};
struct RoundEven {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::round_even(v);
  }
};
struct Sin {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::sin(v);
  }
};
struct Cos {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::cos(v);
  }
};
struct NegFloat {
  template <class C>
  __device__ C operator()(C v) const {
    return -v;
  }
};
struct AbsFloat {
  template <class C>
  __device__ C operator()(C v) const {
    return dm::fabs(v);
  }
};
// Integer negation and abs wrap (MIN stays MIN), as the CPU's wrapping_neg.
struct NegInt {
  template <class I>
  __device__ I operator()(I v) const {
    using U = std::make_unsigned_t<I>;
    return I(U(0) - U(v));
  }
};
struct AbsInt {
  template <class I>
  __device__ I operator()(I v) const {
    return v < I(0) ? NegInt{}(v) : v;
  }
};
// numpy clip: min(max(x, lo), hi); NaN stays NaN (comparisons with NaN are false).
template <class C>
struct Clip {
  C lo, hi;
  __device__ C operator()(C v) const {
    const C w = v < lo ? lo : v;
    return hi < w ? hi : w;
  }
};

// Clip bounds in the compute type. For integers they round inwards (min up, max down) and
// saturate, so +-infinity means unbounded (the CPU's clip_bounds).
template <class C>
Clip<C> clip_op(const Node& n) {
  const auto& a = std::get<ClipAttrs>(n.attrs);
  if constexpr (std::is_floating_point_v<C>) {
    return {C(a.min), C(a.max)};
  } else {
    auto saturate = [](double v) {
      constexpr C kMax = std::numeric_limits<C>::max(), kMin = std::numeric_limits<C>::min();
      if (v >= double(kMax)) return kMax;
      if (v <= double(kMin)) return kMin;
      return C(v);
    };
    return {saturate(std::ceil(a.min)), saturate(std::floor(a.max))};
  }
}

[[noreturn]] void unsupported(const Node& n, DType t) {
  throw Error(node_label(n), cat("is not defined for ", dtype_name(t), " tensors"));
}

template <class T>
void unary_float(Context& ctx, const Node& n, const DeviceTensor& x, const DeviceTensor& y) {
  using C = compute_t<T>;
  auto run = [&](auto f) { launch_map1<T, T>(ctx, n, x, y, UnaryMath<T, decltype(f)>{f}); };
  switch (n.op) {
    case OpKind::relu:
      return run(Relu{});
    case OpKind::leaky_relu:
      return run(LeakyRelu<C>{C(std::get<LeakyReluAttrs>(n.attrs).alpha)});
    case OpKind::gelu:
      if (std::get<GeluAttrs>(n.attrs).tanh_approximation) return run(GeluTanh{});
      return run(GeluErf{});
    case OpKind::silu:
      return run(Silu{});
    case OpKind::sigmoid:
      return run(Sigmoid{});
    case OpKind::tanh:
      return run(Tanh{});
    case OpKind::exp:
      return run(Exp{});
    case OpKind::log:
      return run(Log{});
    case OpKind::sqrt:
      return run(Sqrt{});
    case OpKind::rsqrt:
      return run(Rsqrt{});
    case OpKind::reciprocal:
      return run(Reciprocal{});
    case OpKind::neg:
      return run(NegFloat{});
    case OpKind::abs:
      return run(AbsFloat{});
    case OpKind::erf:
      return run(Erf{});
    case OpKind::sin:
      return run(Sin{});
    case OpKind::cos:
      return run(Cos{});
    case OpKind::floor:
      return run(Floor{});
    case OpKind::ceil:
      return run(Ceil{});
    case OpKind::round:
      return run(RoundEven{});
    case OpKind::clip:
      return run(clip_op<C>(n));
    default:
      break;
  }
  throw Error(node_label(n), "is not a unary op");
}

template <class T>
void unary_integer(Context& ctx, const Node& n, const DeviceTensor& x, const DeviceTensor& y) {
  auto run = [&](auto f) { launch_map1<T, T>(ctx, n, x, y, UnaryMath<T, decltype(f)>{f}); };
  switch (n.op) {
    case OpKind::relu:
      return run(Relu{});
    case OpKind::neg:
      return run(NegInt{});
    case OpKind::abs:
      return run(AbsInt{});
    case OpKind::clip:
      return run(clip_op<T>(n));
    default:
      unsupported(n, x.dtype);
  }
}

}  // namespace

void unary(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.shape == y.shape && x.dtype == y.dtype, node_label(n), "input ",
                dtype_name(x.dtype), shape_str(x.shape), " does not match the output ",
                dtype_name(y.dtype), shape_str(y.shape));
  if (n.op == OpKind::identity) return copy_strided(ctx, x, y);
  visit_device_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float_v<T>)
      unary_float<T>(ctx, n, x, y);
    else if constexpr (std::is_same_v<T, bool>)
      unsupported(n, x.dtype);
    else
      unary_integer<T>(ctx, n, x, y);
  });
}

}  // namespace fusebox::cuda
