// Gradients of the pointwise ops (unary_backward, binary_backward) and of the
// element-moving ops (slice_backward, pad_backward), and expand.
//
// unary_backward:  dx[i] = dy[i] * f'(x[i]), f' picked by the forward op, in
//                  compute_t<T> (f32 for f16/bf16), rounded once.
// binary_backward: (da, db)[i] = dy[i] * (d/da, d/db) f(a, b) at the broadcast shape:
//                  one strided nest over [dy = da = db, a, b], a broadcast operand
//                  walking with stride 0 (autodiff reduces da, db to the operands).
// slice_backward:  dx = 0, then dy copied to where the slice read: the forward's strided
//                  copy with source and destination swapped.
// pad_backward:    the adjoint of pad's index map, one dim at a time: along dim d,
//                  dx[.., i, ..] = sum of dy[.., o, ..] over the padded positions o that
//                  read i (the interior one, plus for reflect/edge the padding copied
//                  from i; none for a constant pad or a cropped i). Sums in f64.
// expand:          y = x broadcast: one strided copy whose source strides are 0 along
//                  the broadcast dims.
#include <cmath>
#include <cstring>
#include <utility>

#include "data_movement.h"
#include "kernel_util.h"
#include "kernels.h"
#include "pointwise_math.h"

namespace fusebox::cpu {

namespace {

// ---- unary -------------------------------------------------------------------

// dx = dy * df(x), elementwise.
template <class T, class F>
void map_unary_backward(const Tensor& dy, const Tensor& x, Tensor& dx, F df) {
  const T* pdy = dy.data<T>();
  const T* px = x.data<T>();
  T* pdx = dx.data<T>();
  parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      pdx[i] = convert<T>(to_compute(pdy[i]) * df(to_compute(px[i])));
  });
}

template <class T>
void unary_backward_typed(const Node& n, const Tensor& dy, const Tensor& x, Tensor& dx) {
  using C = compute_t<T>;
  const auto& a = std::get<UnaryBackwardAttrs>(n.attrs);
  if (with_float_derivative<C>(a.op, a.alpha, a.tanh_approximation, a.min, a.max,
                               [&](auto df) { map_unary_backward<T>(dy, x, dx, df); }))
    return;
  throw Error(node_label(n), cat("has no derivative for ", op_name(a.op)));
}

// ---- binary ------------------------------------------------------------------

// (da, db) = grads(dy, a, b) over the broadcast shape; E is b's element type.
template <class T, class E, class F>
void map_binary_backward(const Tensor& dy, const Tensor& a, const Tensor& b, Tensor& da, Tensor& db,
                         F grads) {
  const Shape& shape = dy.shape();
  StridedNest<3> nest{shape,
                      {contiguous_strides(shape), broadcast_strides(a.shape(), shape),
                       broadcast_strides(b.shape(), shape)}};
  nest.simplify();
  const T* pdy = dy.data<T>();
  const T* pa = a.data<T>();
  const E* pb = b.data<E>();
  T* pda = da.data<T>();
  T* pdb = db.data<T>();
  const int64_t sa = nest.inner_stride(1), sb = nest.inner_stride(2);
  nest.parallel_runs(kGrain, [&](const std::array<int64_t, 3>& off, int64_t count) {
    for (int64_t j = 0; j < count; ++j) {
      const int64_t i = off[0] + j;  // dy, da and db are contiguous at the output shape
      const auto [ga, gb] = grads(to_compute(pdy[i]), to_compute(pa[off[1] + j * sa]),
                                  to_compute(pb[off[2] + j * sb]));
      pda[i] = convert<T>(ga);
      pdb[i] = convert<T>(gb);
    }
  });
}

template <class T>
void binary_backward_typed(const Node& n, const Tensor& dy, const Tensor& a, const Tensor& b,
                           Tensor& da, Tensor& db) {
  using C = compute_t<T>;
  using Pair = std::pair<C, C>;
  const OpKind op = std::get<BinaryBackwardAttrs>(n.attrs).op;
  switch (op) {
    case OpKind::div:  // (dy / b, -dy a / b^2)
      return map_binary_backward<T, T>(dy, a, b, da, db, [](C g, C u, C v) {
        const C q = g / v;
        return Pair{q, -q * u / v};
      });
    // The operand the forward picked gets dy: a where a >= b (max) / a <= b (min) or a
    // is NaN, else b; ties go to a.
    case OpKind::max:
      return map_binary_backward<T, T>(dy, a, b, da, db, [](C g, C u, C v) {
        return u >= v || std::isnan(u) ? Pair{g, C(0)} : Pair{C(0), g};
      });
    case OpKind::min:
      return map_binary_backward<T, T>(dy, a, b, da, db, [](C g, C u, C v) {
        return u <= v || std::isnan(u) ? Pair{g, C(0)} : Pair{C(0), g};
      });
    case OpKind::pow:
      return visit_dtype(b.dtype(), [&](auto exponent_tag) {
        using E = decltype(exponent_tag);
        if constexpr (std::is_same_v<E, bool>) {
          throw Error(node_label(n), "pow's exponent cannot be bool");
        } else {
          // da = dy b a^(b-1), 0 where b == 0; db = dy log(a) a^b, 0 where a == 0 and
          // b >= 0 (PyTorch), where log(a) a^b would be -inf * 0.
          map_binary_backward<T, E>(dy, a, b, da, db, [](C g, C u, auto e) {
            const C v = C(e);
            const C ga = v == 0 ? C(0) : g * v * std::pow(u, v - C(1));
            const C gb = u == 0 && v >= 0 ? C(0) : g * std::log(u) * std::pow(u, v);
            return Pair{ga, gb};
          });
        }
      });
    default:
      break;
  }
  throw Error(node_label(n), cat("has no derivative for ", op_name(op)));
}

}  // namespace

// (dy, x) -> dx
void unary_backward(const Node& n, Inputs in, Outputs out) {
  const Tensor &dy = *in[0], &x = *in[1];
  FUSEBOX_CHECK(dy.dtype() == x.dtype() && dy.shape() == x.shape() && out[0].shape() == x.shape() &&
                    out[0].dtype() == x.dtype(),
                node_label(n), "dy ", shape_str(dy.shape()), ", x ", shape_str(x.shape()),
                " and dx ", shape_str(out[0].shape()), " must share a type");
  visit_float(n, x.dtype(),
              [&](auto tag) { unary_backward_typed<decltype(tag)>(n, dy, x, out[0]); });
}

// (dy, a, b) -> (da, db), both at dy's (the broadcast) shape.
void binary_backward(const Node& n, Inputs in, Outputs out) {
  const Tensor &dy = *in[0], &a = *in[1], &b = *in[2];
  Shape shape;
  FUSEBOX_CHECK(broadcast_shapes(a.shape(), b.shape(), &shape) && shape == dy.shape() &&
                    out[0].shape() == shape && out[1].shape() == shape && dy.dtype() == a.dtype(),
                node_label(n), "dy ", shape_str(dy.shape()), " is not the broadcast of a ",
                shape_str(a.shape()), " and b ", shape_str(b.shape()));
  visit_float(n, a.dtype(),
              [&](auto tag) { binary_backward_typed<decltype(tag)>(n, dy, a, b, out[0], out[1]); });
}

// (dy) -> dx of input_shape; the slice attributes are normalised against it.
void slice_backward(const Node& n, Inputs in, Outputs out) {
  const SliceAttrs& a = std::get<SliceBackwardAttrs>(n.attrs).slice;
  const Tensor& dy = *in[0];
  Tensor& dx = out[0];
  FUSEBOX_CHECK(a.normalized && dy.dtype() == dx.dtype() && dy.rank() == dx.rank(), node_label(n),
                "dy ", shape_str(dy.shape()), " and dx ", shape_str(dx.shape()),
                " do not fit a normalised slice");
  std::memset(dx.raw(), 0, dx.nbytes());  // +0.0 in every float dtype
  if (dy.numel() == 0) return;            // a start may then equal its extent: no offset to take
  Shape dst_strides = contiguous_strides(dx.shape());
  int64_t dst_offset = 0;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const size_t d = size_t(a.axes[i]);
    dst_offset += a.starts[i] * dst_strides[d];
    dst_strides[d] *= a.steps[i];
  }
  copy_strided(dy.shape(), dx, std::move(dst_strides), dst_offset, dy,
               contiguous_strides(dy.shape()), 0);
}

// (dy) -> dx of input_shape.
void pad_backward(const Node& n, Inputs in, Outputs out) {
  const PadAttrs& a = std::get<PadBackwardAttrs>(n.attrs).pad;
  const Tensor& dy = *in[0];
  Tensor& dx = out[0];
  const size_t rank = size_t(dx.rank());
  FUSEBOX_CHECK(a.pads.size() == 2 * rank && dy.rank() == dx.rank() && dy.dtype() == dx.dtype(),
                node_label(n), "pads ", shape_str(a.pads), " do not fit dy ", shape_str(dy.shape()),
                " and dx ", shape_str(dx.shape()));
  // g holds dy with dims [0, d) already folded back to dx's extents.
  Shape shape = dy.shape();
  std::vector<double> g = dy.to_doubles();
  for (size_t d = 0; d < rank; ++d) {
    const int64_t len = dx.dim(int64_t(d)), padded = shape[d];
    FUSEBOX_CHECK(padded == len + a.pads[d] + a.pads[rank + d], node_label(n), "dy ",
                  shape_str(dy.shape()), " is not dx ", shape_str(dx.shape()), " padded by ",
                  shape_str(a.pads));
    const int64_t outer = numel(Shape(shape.begin(), shape.begin() + int64_t(d)));
    const int64_t inner = numel(Shape(shape.begin() + int64_t(d) + 1, shape.end()));
    std::vector<double> folded(size_t(outer * len * inner), 0.0);
    // Serial over o (several o may read one i), parallel over the outer rows.
    parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(padded * inner, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) {
                     for (int64_t o = 0; o < padded; ++o) {
                       const int64_t i = pad_source(a.mode, o, a.pads[d], len);
                       if (i < 0) continue;
                       const double* src = g.data() + (r * padded + o) * inner;
                       double* dst = folded.data() + (r * len + i) * inner;
                       for (int64_t k = 0; k < inner; ++k) dst[k] += src[k];
                     }
                   }
                 });
    g = std::move(folded);
    shape[d] = len;
  }
  store_values(dx, g);
}

// x -> y = broadcast_to(x, shape)
void expand(const Node& n, Inputs in, Outputs out) {
  const Tensor& x = *in[0];
  Tensor& y = out[0];
  Shape merged;
  FUSEBOX_CHECK(x.dtype() == y.dtype() && broadcast_shapes(x.shape(), y.shape(), &merged) &&
                    merged == y.shape(),
                node_label(n), "x ", shape_str(x.shape()), " does not broadcast to ",
                shape_str(y.shape()));
  if (y.numel() == 0) return;
  copy_strided(y.shape(), y, contiguous_strides(y.shape()), 0, x,
               broadcast_strides(x.shape(), y.shape()), 0);
}

}  // namespace fusebox::cpu
