// Pointwise ops.
//
// unary:  y[i] = f(x[i]), f picked by the op, computed in compute_t<T> (f32 for
//         f16/bf16) and rounded once to the output dtype.
// binary: y = f(a, b) with numpy broadcasting: a strided nest over [y, a, b]
//         where a broadcast operand has stride 0; one loop for every binary op.
// Integer arithmetic wraps (two's complement) rather than being undefined;
// integer division truncates toward zero and division by zero is an Error.
#include <cmath>

#include "fusebox/ir/pointwise_program.h"
#include "kernel_util.h"
#include "kernels.h"
#include "pointwise_math.h"

namespace fusebox::cpu {

namespace {

[[noreturn]] void unsupported(const Node& n, DType t) {
  throw Error(node_label(n), cat("is not defined for ", dtype_name(t), " tensors"));
}

// ---- unary -------------------------------------------------------------------

template <class T, class F>
void map_unary(const Tensor& x, Tensor& y, F f) {
  const T* src = x.data<T>();
  T* dst = y.data<T>();
  parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = convert<T>(f(to_compute(src[i])));
  });
}

template <class I>
I wrapping_neg(I v) {
  using U = std::make_unsigned_t<I>;
  return I(U(0) - U(v));
}

// Integer clip (the bounds rounded inwards); floats clip in with_float_unary.
template <class T>
void clip(const Node& n, const Tensor& x, Tensor& y) {
  const auto& a = std::get<ClipAttrs>(n.attrs);
  // Not a structured binding: clang before 16 (the fuzz build's) cannot capture one.
  const std::pair<T, T> bounds = clip_bounds<T>(a.min, a.max);
  map_unary<T>(
      x, y, [lo = bounds.first, hi = bounds.second](T v) { return std::min(std::max(v, lo), hi); });
}

// The formulas are pointwise_math.h's, shared with fused_pointwise.
template <class T>
void unary_float(const Node& n, const Tensor& x, Tensor& y) {
  if (!with_float_unary<compute_t<T>>(pointwise_instr(n, {}),
                                      [&](auto f) { map_unary<T>(x, y, f); }))
    throw Error(node_label(n), "is not a unary op");
}

template <class T>
void unary_integer(const Node& n, const Tensor& x, Tensor& y) {
  switch (n.op) {
    case OpKind::relu:
      return map_unary<T>(x, y, [](T v) { return v < 0 ? T(0) : v; });
    case OpKind::neg:
      return map_unary<T>(x, y, [](T v) { return wrapping_neg(v); });
    case OpKind::abs:
      return map_unary<T>(x, y, [](T v) { return v < 0 ? wrapping_neg(v) : v; });
    case OpKind::clip:
      return clip<T>(n, x, y);
    default:
      unsupported(n, x.dtype());
  }
}

// ---- binary ------------------------------------------------------------------

// y = f(a, b) over the broadcast shape of y. A is y's element type, E the
// second operand's (differs only for pow's exponent).
template <class T, class E, class F>
void map_binary(const Tensor& a, const Tensor& b, Tensor& y, F f) {
  StridedNest<3> nest{y.shape(),
                      {contiguous_strides(y.shape()), broadcast_strides(a.shape(), y.shape()),
                       broadcast_strides(b.shape(), y.shape())}};
  nest.simplify();
  const T* pa = a.data<T>();
  const E* pb = b.data<E>();
  T* py = y.data<T>();
  const int64_t sa = nest.inner_stride(1), sb = nest.inner_stride(2);
  nest.parallel_runs(kGrain, [&](const std::array<int64_t, 3>& off, int64_t count) {
    T* ry = py + off[0];  // y is contiguous: inner stride 1
    const T* ra = pa + off[1];
    const E* rb = pb + off[2];
    if (sa == 1 && sb == 1) {  // the common same-shape case, kept vectorisable
      for (int64_t j = 0; j < count; ++j)
        ry[j] = convert<T>(f(to_compute(ra[j]), to_compute(rb[j])));
    } else {
      for (int64_t j = 0; j < count; ++j)
        ry[j] = convert<T>(f(to_compute(ra[j * sa]), to_compute(rb[j * sb])));
    }
  });
}

template <class T>
void binary_float(const Node& n, const Tensor& a, const Tensor& b, Tensor& y) {
  if (!with_float_binary<compute_t<T>>(n.op, [&](auto f) { map_binary<T, T>(a, b, y, f); }))
    throw Error(node_label(n), "is not a binary op");
}

template <class T>
void binary_integer(const Node& n, const Tensor& a, const Tensor& b, Tensor& y) {
  using U = std::make_unsigned_t<T>;
  switch (n.op) {
    case OpKind::add:
      return map_binary<T, T>(a, b, y, [](T u, T v) { return T(U(u) + U(v)); });
    case OpKind::sub:
      return map_binary<T, T>(a, b, y, [](T u, T v) { return T(U(u) - U(v)); });
    case OpKind::mul:
      return map_binary<T, T>(a, b, y, [](T u, T v) { return T(U(u) * U(v)); });
    case OpKind::div:
      return map_binary<T, T>(a, b, y, [&n](T u, T v) {
        if (v == 0) throw Error(node_label(n), cat("integer division by zero (", u, " / 0)"));
        return v == -1 ? wrapping_neg(u) : T(u / v);  // -1: MIN / -1 wraps, not a trap
      });
    case OpKind::max:
      return map_binary<T, T>(a, b, y, [](T u, T v) { return std::max(u, v); });
    case OpKind::min:
      return map_binary<T, T>(a, b, y, [](T u, T v) { return std::min(u, v); });
    default:
      unsupported(n, a.dtype());
  }
}

// pow: the exponent may have any numeric dtype; the result has the base's. A
// float base computes in its compute type; an integer base in f64, converted
// back with the one conversion rule (truncation, saturation).
template <class T>
void binary_pow(const Node& n, const Tensor& a, const Tensor& b, Tensor& y) {
  visit_dtype(b.dtype(), [&](auto exponent_tag) {
    using E = decltype(exponent_tag);
    if constexpr (std::is_same_v<E, bool>) {
      unsupported(n, b.dtype());
    } else {
      using C = std::conditional_t<std::is_floating_point_v<compute_t<T>>, compute_t<T>, double>;
      map_binary<T, E>(a, b, y, [](auto u, auto v) { return std::pow(C(u), C(v)); });
    }
  });
}

}  // namespace

void unary(const Node& n, Inputs in, Outputs out) {
  const Tensor& x = *in[0];
  Tensor& y = out[0];
  if (n.op == OpKind::identity) {
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    return;
  }
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<compute_t<T>>)
      unary_float<T>(n, x, y);
    else if constexpr (std::is_same_v<T, bool>)
      unsupported(n, x.dtype());
    else
      unary_integer<T>(n, x, y);
  });
}

void binary(const Node& n, Inputs in, Outputs out) {
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  Tensor& y = out[0];
  FUSEBOX_CHECK(n.op == OpKind::pow || a.dtype() == b.dtype(), node_label(n),
                "operands have different dtypes: ", dtype_name(a.dtype()), " and ",
                dtype_name(b.dtype()));
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>)
      unsupported(n, a.dtype());
    else if (n.op == OpKind::pow)
      binary_pow<T>(n, a, b, y);
    else if constexpr (std::is_floating_point_v<compute_t<T>>)
      binary_float<T>(n, a, b, y);
    else
      binary_integer<T>(n, a, b, y);
  });
}

}  // namespace fusebox::cpu
