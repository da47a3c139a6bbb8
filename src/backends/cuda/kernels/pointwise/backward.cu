// Gradients of the pointwise ops on the GPU, with the CPU backend's formulas
// (backends/cpu/backward.cpp):
//
// unary_backward:  dx[i] = dy[i] * f'(x[i]), f' picked by the forward op, computed in
//                  compute_t<T> (f32 for f16/bf16) and rounded once: launch_map2 over
//                  (dy, x), so the vectorised / flat / strided paths are pointwise_util's.
// binary_backward: (da, db)[i] = dy[i] * (d/da, d/db) f(a[off_a], b[off_b]) over the
//                  broadcast shape (dy, da and db contiguous at that shape; a and b walk
//                  it with stride 0 along their broadcast dims): one kernel writing both
//                  outputs. pow's exponent of another dtype than the base is first cast
//                  to the base's compute type (what the CPU's C(e) does per element).
#include <numbers>

#include "backends/cuda/kernels/common/elementwise.cuh"

namespace fusebox::cuda {

namespace {

// ---- unary -------------------------------------------------------------------------------

// dx = convert<T>(dy * df(x)) in the compute type.
template <class T, class F>
struct UnaryGrad {
  F df;
  __device__ __forceinline__ T operator()(T dy, T x) const {
    using C = compute_t<T>;
    return convert<T>(convert<C>(dy) * df(convert<C>(x)));
  }
};

// 1 / (1 + e^-v), the CPU's formula: e^-v overflows to inf for very negative v, giving 0.
template <class C>
__device__ __forceinline__ C logistic(C v) {
  return C(1) / (C(1) + dm::exp(-v));
}

template <class C>
struct ReluGrad {  // relu'(0) = 0
  __device__ C operator()(C v) const { return v > C(0) ? C(1) : C(0); }
};
template <class C>
struct LeakyReluGrad {  // slope alpha at 0 (PyTorch)
  C alpha;
  __device__ C operator()(C v) const { return v > C(0) ? C(1) : alpha; }
};
// u = k (v + 0.044715 v^3), k = sqrt(2/pi):
// d/dv 0.5 v (1 + tanh u) = 0.5 (1 + tanh u) + 0.5 v (1 - tanh^2 u) k (1 + 3*0.044715 v^2)
template <class C>
struct GeluTanhGrad {
  __device__ C operator()(C v) const {
    const C k = C(std::numbers::sqrt2) * C(std::numbers::inv_sqrtpi);
    const C t = dm::tanh(k * (v + C(0.044715) * v * v * v));
    return C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * k * (C(1) + C(3 * 0.044715) * v * v);
  }
};
// d/dv v Phi(v) = Phi(v) + v phi(v)
template <class C>
struct GeluErfGrad {
  __device__ C operator()(C v) const {
    const C cdf = C(0.5) * (C(1) + dm::erf(v * C(std::numbers::sqrt2 / 2)));
    const C pdf = dm::exp(C(-0.5) * v * v) * C(std::numbers::inv_sqrtpi * std::numbers::sqrt2 / 2);
    return cdf + v * pdf;
  }
};
template <class C>
struct SiluGrad {  // s (1 + v (1 - s))
  __device__ C operator()(C v) const {
    const C s = logistic(v);
    return s * (C(1) + v * (C(1) - s));
  }
};
template <class C>
struct SigmoidGrad {
  __device__ C operator()(C v) const {
    const C s = logistic(v);
    return s * (C(1) - s);
  }
};
template <class C>
struct TanhGrad {
  __device__ C operator()(C v) const {
    const C t = dm::tanh(v);
    return C(1) - t * t;
  }
};
template <class C>
struct ExpGrad {
  __device__ C operator()(C v) const { return dm::exp(v); }
};
template <class C>
struct LogGrad {
  __device__ C operator()(C v) const { return C(1) / v; }
};
template <class C>
struct SqrtGrad {
  __device__ C operator()(C v) const { return C(0.5) / dm::sqrt(v); }
};
template <class C>
struct RsqrtGrad {  // -0.5 v^(-3/2)
  __device__ C operator()(C v) const { return C(-0.5) / (v * dm::sqrt(v)); }
};
template <class C>
struct ReciprocalGrad {
  __device__ C operator()(C v) const { return C(-1) / (v * v); }
};
template <class C>
struct NegGrad {
  __device__ C operator()(C) const { return C(-1); }
};
template <class C>
struct AbsGrad {  // sign(v), 0 at 0
  __device__ C operator()(C v) const { return v > C(0) ? C(1) : v < C(0) ? C(-1) : C(0); }
};
template <class C>
struct ErfGrad {
  __device__ C operator()(C v) const {
    return C(2) * C(std::numbers::inv_sqrtpi) * dm::exp(-v * v);
  }
};
template <class C>
struct ZeroGrad {  // floor, ceil, round: piecewise constant (PyTorch's 0)
  __device__ C operator()(C) const { return C(0); }
};
template <class C>
struct SinGrad {
  __device__ C operator()(C v) const { return dm::cos(v); }
};
template <class C>
struct CosGrad {
  __device__ C operator()(C v) const { return -dm::sin(v); }
};
template <class C>
struct ClipGrad {  // passes where lo <= v <= hi, bounds inclusive (PyTorch)
  C lo, hi;
  __device__ C operator()(C v) const { return v >= lo && v <= hi ? C(1) : C(0); }
};

template <class T>
void unary_backward_typed(Context& ctx, const Node& n, const DeviceTensor& dy,
                          const DeviceTensor& x, const DeviceTensor& dx) {
  using C = compute_t<T>;
  const auto& a = std::get<UnaryBackwardAttrs>(n.attrs);
  auto run = [&](auto df) {
    launch_map2<T, T, T>(ctx, n, dy, x, dx, UnaryGrad<T, decltype(df)>{df});
  };
  switch (a.op) {
    case OpKind::relu:
      return run(ReluGrad<C>{});
    case OpKind::leaky_relu:
      return run(LeakyReluGrad<C>{C(a.alpha)});
    case OpKind::gelu:
      if (a.tanh_approximation) return run(GeluTanhGrad<C>{});
      return run(GeluErfGrad<C>{});
    case OpKind::silu:
      return run(SiluGrad<C>{});
    case OpKind::sigmoid:
      return run(SigmoidGrad<C>{});
    case OpKind::tanh:
      return run(TanhGrad<C>{});
    case OpKind::exp:
      return run(ExpGrad<C>{});
    case OpKind::log:
      return run(LogGrad<C>{});
    case OpKind::sqrt:
      return run(SqrtGrad<C>{});
    case OpKind::rsqrt:
      return run(RsqrtGrad<C>{});
    case OpKind::reciprocal:
      return run(ReciprocalGrad<C>{});
    case OpKind::neg:
      return run(NegGrad<C>{});
    case OpKind::abs:
      return run(AbsGrad<C>{});
    case OpKind::erf:
      return run(ErfGrad<C>{});
    case OpKind::sin:
      return run(SinGrad<C>{});
    case OpKind::cos:
      return run(CosGrad<C>{});
    case OpKind::floor:
    case OpKind::ceil:
    case OpKind::round:
      return run(ZeroGrad<C>{});
    case OpKind::clip:
      return run(ClipGrad<C>{C(a.min), C(a.max)});
    default:
      break;
  }
  throw Error(node_label(n), cat("has no derivative for ", op_name(a.op)));
}

// ---- binary ------------------------------------------------------------------------------

template <class C>
struct GradPair {
  C a, b;
};

template <class C>
struct DivGrad {  // (dy / b, -dy a / b^2)
  __device__ GradPair<C> operator()(C g, C u, C v) const {
    const C q = g / v;
    return {q, -q * u / v};
  }
};
// The operand the forward picked gets dy: a where a >= b (max) / a <= b (min) or a is
// NaN, else b; ties go to a.
template <class C>
struct MaxGrad {
  __device__ GradPair<C> operator()(C g, C u, C v) const {
    return u >= v || dm::isnan(u) ? GradPair<C>{g, C(0)} : GradPair<C>{C(0), g};
  }
};
template <class C>
struct MinGrad {
  __device__ GradPair<C> operator()(C g, C u, C v) const {
    return u <= v || dm::isnan(u) ? GradPair<C>{g, C(0)} : GradPair<C>{C(0), g};
  }
};
// da = dy b a^(b-1), 0 where b == 0; db = dy log(a) a^b, 0 where a == 0 and b >= 0
// (PyTorch), where log(a) a^b would be -inf * 0.
template <class C>
struct PowGrad {
  __device__ GradPair<C> operator()(C g, C u, C v) const {
    const C ga = v == C(0) ? C(0) : g * v * dm::pow(u, v - C(1));
    const C gb = u == C(0) && v >= C(0) ? C(0) : g * dm::log(u) * dm::pow(u, v);
    return {ga, gb};
  }
};

// Flat index i of the broadcast shape: off[0] == i (dy, da, db contiguous), off[1] and
// off[2] the elements of a and b. E is b's element type (T, or T's compute type).
template <class T, class E, class F, class Index>
__global__ void binary_grad_kernel(const T* dy, const T* a, const E* b, T* da, T* db,
                                   StridedLayout<3> layout, Index n, F grads) {
  using C = compute_t<T>;
  for (Index i = Index(global_thread_index()); i < n; i += Index(grid_stride())) {
    int64_t off[3];
    layout.offsets(i, off);
    const GradPair<C> g =
        grads(convert<C>(dy[off[0]]), convert<C>(a[off[1]]), convert<C>(b[off[2]]));
    da[off[0]] = convert<T>(g.a);
    db[off[0]] = convert<T>(g.b);
  }
}

template <class T, class E, class F>
void launch_binary_grad(Context& ctx, const Node& n, const DeviceTensor& dy, const DeviceTensor& a,
                        const DeviceTensor& b, const DeviceTensor& da, const DeviceTensor& db,
                        F grads) {
  const int64_t count = dy.numel();
  if (count == 0) return;
  const StridedLayout<3> layout =
      make_layout<3>(n, dy.shape,
                     {dy.strides, broadcast_strides(a.shape, a.strides, dy.shape),
                      broadcast_strides(b.shape, b.strides, dy.shape)});
  const BufferList reads{dy.range(), a.range(), b.range()}, writes{da.range(), db.range()};
  const unsigned blocks = launch_blocks(count);
  if (fits_u32(count))
    ctx.encoder.launch(binary_grad_kernel<T, E, F, uint32_t>, blocks, kDefaultThreads, 0, reads,
                       writes, dy.as<T>(), a.as<T>(), b.as<E>(), da.as<T>(), db.as<T>(), layout,
                       uint32_t(count), grads);
  else
    ctx.encoder.launch(binary_grad_kernel<T, E, F, uint64_t>, blocks, kDefaultThreads, 0, reads,
                       writes, dy.as<T>(), a.as<T>(), b.as<E>(), da.as<T>(), db.as<T>(), layout,
                       uint64_t(count), grads);
}

template <class T>
void binary_backward_typed(Context& ctx, const Node& n, const DeviceTensor& dy,
                           const DeviceTensor& a, const DeviceTensor& b, const DeviceTensor& da,
                           const DeviceTensor& db) {
  using C = compute_t<T>;
  const OpKind op = std::get<BinaryBackwardAttrs>(n.attrs).op;
  switch (op) {
    case OpKind::div:
      return launch_binary_grad<T, T>(ctx, n, dy, a, b, da, db, DivGrad<C>{});
    case OpKind::max:
      return launch_binary_grad<T, T>(ctx, n, dy, a, b, da, db, MaxGrad<C>{});
    case OpKind::min:
      return launch_binary_grad<T, T>(ctx, n, dy, a, b, da, db, MinGrad<C>{});
    case OpKind::pow: {
      FUSEBOX_CHECK(b.dtype != DType::boolean, node_label(n), "pow's exponent cannot be bool");
      if (b.dtype == a.dtype)
        return launch_binary_grad<T, T>(ctx, n, dy, a, b, da, db, PowGrad<C>{});
      // Another dtype: cast to C first (the CPU converts each element with C(e)).
      constexpr DType kC = std::is_same_v<C, double> ? DType::f64 : DType::f32;
      DeviceTensor exponent = b;
      if (b.dtype != kC) {
        DeviceTensor source = b;
        if (!b.is_contiguous()) {  // cast reads contiguous tensors
          source = temporary_tensor(ctx, b.dtype, b.shape);
          copy_strided(ctx, b, source);
        }
        exponent = temporary_tensor(ctx, kC, b.shape);
        const DeviceTensor* cast_in[1] = {&source};
        cast(ctx, n, cast_in, Outputs(&exponent, 1));
      }
      return launch_binary_grad<T, C>(ctx, n, dy, a, exponent, da, db, PowGrad<C>{});
    }
    default:
      break;
  }
  throw Error(node_label(n), cat("has no derivative for ", op_name(op)));
}

}  // namespace

// (dy, x) -> dx; dy and x may be strided views.
void unary_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor &dy = *in[0], &x = *in[1];
  const DeviceTensor& dx = out[0];
  FUSEBOX_CHECK(
      dy.dtype == x.dtype && dy.shape == x.shape && dx.shape == x.shape && dx.dtype == x.dtype,
      node_label(n), "dy ", shape_str(dy.shape), ", x ", shape_str(x.shape), " and dx ",
      shape_str(dx.shape), " must share a type");
  visit_device_float(n, x.dtype,
                     [&](auto tag) { unary_backward_typed<decltype(tag)>(ctx, n, dy, x, dx); });
}

// (dy, a, b) -> (da, db), both at dy's (the broadcast) shape; dy contiguous, a and b any
// strides.
void binary_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor &dy = *in[0], &a = *in[1], &b = *in[2];
  Shape shape;
  FUSEBOX_CHECK(broadcast_shapes(a.shape, b.shape, &shape) && shape == dy.shape &&
                    out[0].shape == shape && out[1].shape == shape && dy.dtype == a.dtype &&
                    out[0].dtype == a.dtype && out[1].dtype == a.dtype && dy.is_contiguous(),
                node_label(n), "dy ", shape_str(dy.shape),
                " is not the (contiguous) broadcast of a ", shape_str(a.shape), " and b ",
                shape_str(b.shape));
  FUSEBOX_CHECK(std::get<BinaryBackwardAttrs>(n.attrs).op == OpKind::pow || b.dtype == a.dtype,
                node_label(n), "operands have different dtypes: ", dtype_name(a.dtype), " and ",
                dtype_name(b.dtype));
  visit_device_float(n, a.dtype, [&](auto tag) {
    binary_backward_typed<decltype(tag)>(ctx, n, dy, a, b, out[0], out[1]);
  });
}

}  // namespace fusebox::cuda
