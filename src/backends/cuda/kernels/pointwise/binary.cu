// Binary pointwise ops on the GPU: y = f(a, b) with numpy broadcasting, a and b any
// strides (a broadcast dim has stride 0), y contiguous; the paths (vectorised, flat,
// N-d strided) are launch_map2's (kernels/common/elementwise.cuh). Semantics are the CPU backend's
// (backends/cpu/pointwise.cpp):
//   floats   computed in compute_t<T>, rounded once; max/min propagate NaN from either side
//   integers wrap (two's complement); div truncates toward zero and x / -1 wraps; a
//            division by zero stores 0 and raises the node's ErrorRecord, so that the run
//            fails with "integer division by zero (x / 0)" at check_error_flags (the CPU
//            throws the same message at once)
//   pow      the exponent may have any numeric dtype; a float base computes in its compute
//            type, an integer base in f64, converted back by the conversion rule (an
//            integral exponent exactly, by squaring: device pow is not correctly rounded)
#include "backends/cuda/kernels/common/elementwise.cuh"
#include "backends/cuda/runtime/error_flags.h"

namespace fusebox::cuda {

namespace {

// y = convert<T>(f(convert<C>(a), convert<C>(b))).
template <class T, class F>
struct BinaryMath {
  F f;
  __device__ __forceinline__ T operator()(T a, T b) const {
    using C = compute_t<T>;
    return convert<T>(f(convert<C>(a), convert<C>(b)));
  }
};

struct Add {
  template <class C>
  __device__ C operator()(C u, C v) const {
    return u + v;
  }
};
struct Sub {
  template <class C>
  __device__ C operator()(C u, C v) const {
    return u - v;
  }
};
struct Mul {
  template <class C>
  __device__ C operator()(C u, C v) const {
    return u * v;
  }
};
struct Div {
  template <class C>
  __device__ C operator()(C u, C v) const {
    return u / v;
  }
};
// NaN in either operand gives NaN (numpy maximum/minimum); for integers a != a is false.
struct Max {
  template <class C>
  __device__ C operator()(C u, C v) const {
    return (u > v || u != u) ? u : v;
  }
};
struct Min {
  template <class C>
  __device__ C operator()(C u, C v) const {
    return (u < v || u != u) ? u : v;
  }
};

// Wrapping integer arithmetic through the unsigned type (no undefined overflow).
struct AddInt {
  template <class I>
  __device__ I operator()(I u, I v) const {
    using U = std::make_unsigned_t<I>;
    return I(U(u) + U(v));
  }
};
struct SubInt {
  template <class I>
  __device__ I operator()(I u, I v) const {
    using U = std::make_unsigned_t<I>;
    return I(U(u) - U(v));
  }
};
struct MulInt {
  template <class I>
  __device__ I operator()(I u, I v) const {
    using U = std::make_unsigned_t<I>;
    return I(U(u) * U(v));
  }
};
struct DivInt {
  ErrorRecord* error;
  template <class I>
  __device__ I operator()(I u, I v) const {
    using U = std::make_unsigned_t<I>;
    if (v == I(0)) {
      raise_error(error, 0, int64_t(u));
      return I(0);
    }
    return v == I(-1) ? I(U(0) - U(u)) : I(u / v);  // -1: MIN / -1 wraps, not a trap
  }
};

// base^exponent in 64 bits (exponentiation by squaring); false when it does not fit.
__device__ __forceinline__ bool power_fits(uint64_t base, uint64_t exponent, uint64_t* out) {
  uint64_t result = 1, factor = base;
  for (uint64_t e = exponent; e > 0; e >>= 1) {
    // A product past 64 bits: now, or the square that a later bit of e will multiply in.
    if ((e & 1) && __umul64hi(result, factor) != 0) return false;
    if (e & 1) result *= factor;
    if (e > 1 && __umul64hi(factor, factor) != 0) return false;
    factor *= factor;
  }
  *out = result;
  return true;
}

// An integer base to an integral exponent, as the f64 the CPU's (correctly rounded)
// std::pow returns: exact integer arithmetic, so that 3^2 is 9.0 and never the 8.999...
// a device pow may give (which the conversion would truncate to 8). A magnitude past
// 2^64 falls back to pow (the conversion saturates it either way); a negative exponent
// gives 1 / base^-e: +inf for 0, +-1 for +-1, else |result| < 1 (truncated to 0).
__device__ __forceinline__ double integer_pow(int64_t base, int64_t exponent) {
  const bool negative = base < 0 && (exponent & 1) != 0;
  const uint64_t magnitude = base < 0 ? uint64_t(0) - uint64_t(base) : uint64_t(base);
  if (exponent < 0) {
    if (magnitude == 0) return INFINITY;
    if (magnitude == 1) return negative ? -1.0 : 1.0;
    return ::pow(double(base), double(exponent));
  }
  uint64_t result;
  if (!power_fits(magnitude, uint64_t(exponent), &result))
    return ::pow(double(base), double(exponent));
  const double value = double(result);  // rounds to nearest, as a correctly rounded pow
  return negative ? -value : value;
}

// An integer base to a non-integral exponent. A result that is an exact integer (4^1.5)
// must come out exactly, as the CPU's correctly rounded pow gives it, or the truncation
// would take the integer below. The exponent is a float, n / 2^m; an integer result k
// then satisfies k^(2^m) = base^n, checked exactly for m <= 6 when the device's result
// is within 1e-9 of an integer.
__device__ __forceinline__ double integer_base_pow(int64_t base, double exponent) {
  const double r = ::pow(double(base), exponent);
  if (base < 2 || !(exponent > 0) || !(r < 9.0e15)) return r;
  const double k = ::rint(r);
  if (::fabs(r - k) > 1e-9 * k) return r;
  double n = exponent;
  int m = 0;
  while (n != ::trunc(n) && m < 6) {
    n *= 2;
    ++m;
  }
  uint64_t lhs, rhs;
  if (n != ::trunc(n) || !power_fits(uint64_t(k), uint64_t(1) << m, &lhs) ||
      !power_fits(uint64_t(base), uint64_t(n), &rhs))
    return r;
  return lhs == rhs ? k : r;
}

// pow: base T, exponent E, both converted to P (T's compute type, or f64 for integers).
// An integer base is exact where the CPU's correctly rounded pow is: integer_pow for an
// integral exponent (of any dtype), integer_base_pow otherwise.
template <class T, class E>
struct Pow {
  using P = std::conditional_t<std::is_floating_point_v<compute_t<T>>, compute_t<T>, double>;
  __device__ __forceinline__ T operator()(T a, E b) const {
    const P base = convert<P>(convert<compute_t<T>>(a));
    const P exponent = convert<P>(convert<compute_t<E>>(b));
    if constexpr (std::is_integral_v<T>) {
      // |exponent| < 2^62 and integral: exact (the bound keeps the int64 conversion exact).
      if (exponent == ::trunc(exponent) && ::fabs(exponent) < 4.611686018427387904e18)
        return convert<T>(integer_pow(int64_t(a), int64_t(exponent)));
      return convert<T>(integer_base_pow(int64_t(a), exponent));
    }
    return convert<T>(dm::pow(base, exponent));
  }
};

[[noreturn]] void unsupported(const Node& n, DType t) {
  throw Error(node_label(n), cat("is not defined for ", dtype_name(t), " tensors"));
}

template <class T>
void binary_float(Context& ctx, const Node& n, const DeviceTensor& a, const DeviceTensor& b,
                  const DeviceTensor& y) {
  auto run = [&](auto f) { launch_map2<T, T, T>(ctx, n, a, b, y, BinaryMath<T, decltype(f)>{f}); };
  switch (n.op) {
    case OpKind::add:
      return run(Add{});
    case OpKind::sub:
      return run(Sub{});
    case OpKind::mul:
      return run(Mul{});
    case OpKind::div:
      return run(Div{});
    case OpKind::max:
      return run(Max{});
    case OpKind::min:
      return run(Min{});
    default:
      break;
  }
  throw Error(node_label(n), "is not a binary op");
}

template <class T>
void binary_integer(Context& ctx, const Node& n, const DeviceTensor& a, const DeviceTensor& b,
                    const DeviceTensor& y) {
  auto run = [&](auto f, const BufferList& extra_writes = {}) {
    launch_map2<T, T, T>(ctx, n, a, b, y, BinaryMath<T, decltype(f)>{f}, extra_writes);
  };
  switch (n.op) {
    case OpKind::add:
      return run(AddInt{});
    case OpKind::sub:
      return run(SubInt{});
    case OpKind::mul:
      return run(MulInt{});
    case OpKind::div: {
      if (y.numel() == 0) return;
      ErrorSlot slot = ErrorFlags::of(ctx.encoder).reserve(node_label(n), [](int64_t, int64_t u) {
        return cat("integer division by zero (", u, " / 0)");
      });
      return run(DivInt{slot.record}, {slot.range});
    }
    case OpKind::max:
      return run(Max{});
    case OpKind::min:
      return run(Min{});
    default:
      unsupported(n, a.dtype);
  }
}

// The exponent is read as T (same dtype) or as P, the type pow converts it to; any other
// dtype is first cast to P (a temporary), which gives the same values and keeps the kernel
// count at two per base dtype instead of one per exponent dtype.
template <class T>
void binary_pow(Context& ctx, const Node& n, const DeviceTensor& a, const DeviceTensor& b,
                const DeviceTensor& y) {
  using P = typename Pow<T, T>::P;
  constexpr DType kP = std::is_same_v<P, double> ? DType::f64 : DType::f32;
  if (b.dtype == a.dtype) return launch_map2<T, T, T>(ctx, n, a, b, y, Pow<T, T>{});
  if (b.dtype == kP) return launch_map2<T, P, T>(ctx, n, a, b, y, Pow<T, P>{});
  if (b.dtype == DType::boolean) unsupported(n, b.dtype);
  DeviceTensor exponent = b;
  if (!b.is_contiguous()) {  // cast reads contiguous tensors
    exponent = temporary_tensor(ctx, b.dtype, b.shape);
    copy_strided(ctx, b, exponent);
  }
  DeviceTensor converted = temporary_tensor(ctx, kP, b.shape);
  const DeviceTensor* cast_in[1] = {&exponent};
  cast(ctx, n, cast_in, Outputs(&converted, 1));
  launch_map2<T, P, T>(ctx, n, a, converted, y, Pow<T, P>{});
}

}  // namespace

void binary(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& a = *in[0];
  const DeviceTensor& b = *in[1];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(n.op == OpKind::pow || a.dtype == b.dtype, node_label(n),
                "operands have different dtypes: ", dtype_name(a.dtype), " and ",
                dtype_name(b.dtype));
  Shape shape;
  FUSEBOX_CHECK(
      broadcast_shapes(a.shape, b.shape, &shape) && shape == y.shape && a.dtype == y.dtype,
      node_label(n), "operands ", shape_str(a.shape), " and ", shape_str(b.shape),
      " do not broadcast to the output ", dtype_name(y.dtype), shape_str(y.shape));
  visit_device_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>)
      unsupported(n, a.dtype);
    else if (n.op == OpKind::pow)
      binary_pow<T>(ctx, n, a, b, y);
    else if constexpr (is_float_v<T>)
      binary_float<T>(ctx, n, a, b, y);
    else
      binary_integer<T>(ctx, n, a, b, y);
  });
}

}  // namespace fusebox::cuda
