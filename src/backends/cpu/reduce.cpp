// Reductions: reduce_sum / reduce_mean / reduce_max, arg_max / arg_min, cumsum, softmax /
// log_softmax and cross_entropy.
//
// Float sums accumulate in f64; a max propagates NaN. Softmax rows are computed
// in f64 and stable (the row max is subtracted before exp), then rounded once.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

namespace {

// ---- reduce_* ----------------------------------------------------------------

// acc = step(acc, v) over the elements of one reduction, at base + the nest's offsets.
template <class T, class Acc, class Step>
Acc fold(const StridedNest<1>& nest, int64_t count, const T* base, Acc acc, Step step) {
  const int64_t s = nest.inner_stride(0);
  if (nest.shape.size() == 1) {  // the common case after simplify(): no odometer needed
    for (int64_t j = 0; j < count; ++j) acc = step(acc, base[j * s]);
    return acc;
  }
  nest.for_each_run(0, count, [&](const std::array<int64_t, 1>& off, int64_t run) {
    for (int64_t j = 0; j < run; ++j) acc = step(acc, base[off[0] + j * s]);
  });
  return acc;
}

// y[o] = finish(fold(init, step) over the reduced elements of output o), where
// `kept` walks the outputs (y offset, x offset) and `reduced` one output's inputs.
template <class T, class Acc, class Step, class Finish>
void reduce_each(const Tensor& x, Tensor& y, const StridedNest<2>& kept,
                 const StridedNest<1>& reduced, Acc init, Step step, Finish finish) {
  const int64_t count = numel(reduced.shape);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const int64_t sy = kept.inner_stride(0), sx = kept.inner_stride(1);
  kept.parallel_runs(std::max<int64_t>(1, kGrain / std::max<int64_t>(count, 1)),
                     [&](const std::array<int64_t, 2>& off, int64_t run) {
                       for (int64_t j = 0; j < run; ++j)
                         py[off[0] + j * sy] =
                             finish(fold(reduced, count, px + off[1] + j * sx, init, step));
                     });
}

template <class T>
void reduce_typed(const Node& n, const Tensor& x, Tensor& y, const StridedNest<2>& kept,
                  const StridedNest<1>& reduced) {
  const int64_t count = numel(reduced.shape);
  if constexpr (std::is_floating_point_v<compute_t<T>>) {
    using C = compute_t<T>;
    auto add = [](double acc, T v) { return acc + double(to_compute(v)); };
    switch (n.op) {
      case OpKind::reduce_sum:
        return reduce_each<T>(x, y, kept, reduced, 0.0, add,
                              [](double s) { return convert<T>(s); });
      case OpKind::reduce_mean:
        return reduce_each<T>(x, y, kept, reduced, 0.0, add,
                              [count](double s) { return convert<T>(s / double(count)); });
      case OpKind::reduce_max:  // over nothing: -inf, as ONNX ReduceMax
        return reduce_each<T>(
            x, y, kept, reduced, -std::numeric_limits<C>::infinity(),
            [](C acc, T v) {
              C c = to_compute(v);
              return c > acc || std::isnan(c) ? c : acc;  // NaN sticks: NaN > c is false
            },
            [](C m) { return convert<T>(m); });
      default:
        break;
    }
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {   // mean: floats only
    auto add = [](uint64_t acc, T v) { return acc + uint64_t(int64_t(v)); };  // wraps
    switch (n.op) {
      case OpKind::reduce_sum:
        return reduce_each<T>(x, y, kept, reduced, uint64_t(0), add,
                              [](uint64_t s) { return T(int64_t(s)); });
      case OpKind::reduce_max:
        return reduce_each<T>(
            x, y, kept, reduced, std::numeric_limits<T>::lowest(),
            [](T acc, T v) { return std::max(acc, v); }, [](T m) { return m; });
      default:
        break;
    }
  }
  throw Error(node_label(n), cat("is not defined for ", dtype_name(x.dtype()), " tensors"));
}

// ---- softmax rows --------------------------------------------------------------

// x viewed as [outer, len, inner]: a row is the `len` elements x[o, :, i], at
// stride `inner`. For every row, in parallel, computes in f64
//   m = max(row),  lse = log(sum(exp(row - m)))
// and calls emit(row_index, offset_of_first_element, m, lse), so that
// log_softmax = row - m - lse and softmax = exp(row - m - lse).
template <class T, class Emit>
void for_each_softmax_row(const T* x, int64_t outer, int64_t len, int64_t inner, Emit emit,
                          int64_t dim = -1) {
  // `dim`: the extent of the row's dim when only its first `len` entries count (a padded
  // cross_entropy's classes); len by default.
  const int64_t extent = dim < 0 ? len : dim;
  parallel_for(outer * inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   const int64_t base = (r / inner) * extent * inner + r % inner;
                   double m = -INFINITY;
                   for (int64_t j = 0; j < len; ++j) {
                     double v = double(to_compute(x[base + j * inner]));
                     if (v > m || std::isnan(v)) m = v;
                     if (std::isnan(m)) break;
                   }
                   // All -inf: 0 keeps row - m free of inf - inf (the row comes out NaN
                   // through lse = -inf, as PyTorch's). A +inf: the row is NaN, as
                   // PyTorch's and onnxruntime's (inf - inf), not [nan, 0, ...].
                   if (std::isinf(m)) m = m > 0 ? NAN : 0.0;
                   double sum = 0.0;
                   for (int64_t j = 0; j < len; ++j)
                     sum += std::exp(double(to_compute(x[base + j * inner])) - m);
                   emit(r, base, m, std::log(sum));
                 }
               });
}

struct RowView {
  int64_t outer, len, inner;
};

RowView rows_around(const Shape& s, int64_t axis) {
  return {numel(Shape(s.begin(), s.begin() + axis)), s[size_t(axis)],
          numel(Shape(s.begin() + axis + 1, s.end()))};
}

}  // namespace

// reduce_*: the dims split into kept ones (walked by the outputs) and reduced
// ones (walked for each output); axes are normalised, sorted and explicit.
void reduce(const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<ReduceAttrs>(n.attrs);
  const Tensor& x = *in[0];
  const Shape in_strides = contiguous_strides(x.shape());
  StridedNest<2> kept;
  StridedNest<1> reduced;
  for (int64_t d = 0; d < x.rank(); ++d) {
    const bool is_reduced = std::find(attrs.axes.begin(), attrs.axes.end(), d) != attrs.axes.end();
    if (is_reduced) {
      reduced.shape.push_back(x.dim(d));
      reduced.strides[0].push_back(in_strides[size_t(d)]);
    } else {
      kept.shape.push_back(x.dim(d));
      kept.strides[1].push_back(in_strides[size_t(d)]);
    }
  }
  kept.strides[0] = contiguous_strides(kept.shape);  // y is the kept dims, row-major
  FUSEBOX_CHECK(out[0].numel() == numel(kept.shape), node_label(n), "output ",
                shape_str(out[0].shape()), " does not match the kept dims ", shape_str(kept.shape));
  kept.simplify();
  reduced.simplify();
  visit_dtype(x.dtype(),
              [&](auto tag) { reduce_typed<decltype(tag)>(n, x, out[0], kept, reduced); });
}

// arg_max / arg_min: x viewed as rows [outer, len, inner] around the axis; each row's first
// (select_last_index: last) position of its largest / smallest element, a NaN counting as
// both (the first NaN wins, or the last). Compared in the compute type (integers exactly).
void arg_reduce(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<ArgReduceAttrs>(n.attrs);
  const Tensor& x = *in[0];
  const RowView v = rows_around(x.shape(), a.axis);
  const bool is_max = n.op == OpKind::arg_max;
  int64_t* py = out[0].data<int64_t>();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    auto is_nan = [](C c) {
      if constexpr (std::is_floating_point_v<C>)
        return std::isnan(c);
      else
        return false;
    };
    // Whether `c` replaces the current best `b`.
    auto better = [&](C c, C b) {
      if (is_nan(b)) return a.select_last_index && is_nan(c);
      if (is_nan(c)) return true;
      if (c == b) return a.select_last_index;
      return is_max ? c > b : c < b;
    };
    const T* px = x.data<T>();
    parallel_for(v.outer * v.inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(v.len, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t r = begin; r < end; ++r) {
                     const int64_t base = (r / v.inner) * v.len * v.inner + r % v.inner;
                     int64_t best = 0;
                     C b = to_compute(px[base]);
                     for (int64_t j = 1; j < v.len; ++j) {
                       const C c = to_compute(px[base + j * v.inner]);
                       if (better(c, b)) best = j, b = c;
                     }
                     py[r] = best;
                   }
                 });
  });
}

// top_k: each row [outer, len, inner] around the axis ordered by a stable sort of its
// positions (so equal elements keep the lower index first), NaN above every number; the
// first k give the values and their indices.
void top_k(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<TopKAttrs>(n.attrs);
  const Tensor& x = *in[0];
  const RowView v = rows_around(x.shape(), a.axis);
  int64_t* pi = out[1].data<int64_t>();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    // a before b in the result: larger first (largest) or smaller first, NaN the largest.
    auto before = [&](C c, C b) {
      if constexpr (std::is_floating_point_v<C>) {
        if (std::isnan(c) || std::isnan(b)) return a.largest ? !std::isnan(b) : !std::isnan(c);
      }
      return a.largest ? c > b : c < b;
    };
    const T* px = x.data<T>();
    T* py = out[0].data<T>();
    parallel_for(v.outer * v.inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(v.len, 1)),
                 [&](int64_t begin, int64_t end) {
                   std::vector<int64_t> order(size_t(v.len));
                   for (int64_t r = begin; r < end; ++r) {
                     const int64_t base = (r / v.inner) * v.len * v.inner + r % v.inner;
                     const int64_t out_base = (r / v.inner) * a.k * v.inner + r % v.inner;
                     for (int64_t j = 0; j < v.len; ++j) order[size_t(j)] = j;
                     std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
                       return before(to_compute(px[base + i * v.inner]),
                                     to_compute(px[base + j * v.inner]));
                     });
                     for (int64_t t = 0; t < a.k; ++t) {
                       py[out_base + t * v.inner] = px[base + order[size_t(t)] * v.inner];
                       pi[out_base + t * v.inner] = order[size_t(t)];
                     }
                   }
                 });
  });
}

// cumsum: rows [outer, len, inner] around the axis, each summed in order (reverse: from
// the end); exclusive leaves the element itself out. Floats sum in f64 and round each
// output once; integers sum modulo 2^64 and wrap into their dtype (as the op's rule).
void cumsum(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<CumSumAttrs>(n.attrs);
  const Tensor& x = *in[0];
  const RowView v = rows_around(x.shape(), a.axis);
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error(node_label(n), "is not defined for bool tensors");
    } else {
      using S = std::conditional_t<std::is_integral_v<T>, uint64_t, double>;
      const T* px = x.data<T>();
      T* py = out[0].data<T>();
      parallel_for(v.outer * v.inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(v.len, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       const int64_t base = (r / v.inner) * v.len * v.inner + r % v.inner;
                       S sum = 0;
                       for (int64_t s = 0; s < v.len; ++s) {
                         const int64_t at = base + (a.reverse ? v.len - 1 - s : s) * v.inner;
                         const S here = S(to_compute(px[at]));
                         if (!a.exclusive) sum += here;
                         if constexpr (std::is_integral_v<T>)
                           py[at] = T(int64_t(sum));  // wraps: two's complement
                         else
                           py[at] = convert<T>(sum);
                         if (a.exclusive) sum += here;
                       }
                     }
                   });
    }
  });
}

void softmax(const Node& n, Inputs in, Outputs out) {
  const Tensor& x = *in[0];
  const RowView v = rows_around(x.shape(), std::get<SoftmaxAttrs>(n.attrs).axis);
  const bool log = n.op == OpKind::log_softmax;
  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = out[0].data<T>();
    for_each_softmax_row(px, v.outer, v.len, v.inner,
                         [&](int64_t, int64_t base, double m, double lse) {
                           for (int64_t j = 0, i = base; j < v.len; ++j, i += v.inner) {
                             const double shifted = double(to_compute(px[i])) - m - lse;
                             py[i] = convert<T>(log ? shifted : std::exp(shifted));
                           }
                         });
  });
}

// cross_entropy: log_prob = log_softmax(logits, dim 1); for each position p of
// labels [N, D...] with label l, loss[p] = -weight[l] * log_prob[n, l, d...], or 0
// when l == ignore_index. Mean divides by the sum of the counted weights (all
// labels ignored: 0 / 0 = NaN, as PyTorch). The lse_stash form writes each position's
// log-sum-exp (m + lse) instead of log_prob, over the first `classes` entries of dim 1.
void cross_entropy(const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<CrossEntropyAttrs>(n.attrs);
  const Tensor& logits = *in[0];
  const Tensor& labels_t = *in[1];
  const Tensor* weight_t = in.size() > 2 ? in[2] : nullptr;
  FUSEBOX_CHECK(logits.rank() >= 2, node_label(n), "expects logits [N, C, D...], got ",
                shape_str(logits.shape()));
  const RowView v = rows_around(logits.shape(), 1);
  const int64_t classes = attrs.classes.value_or(v.len);
  FUSEBOX_CHECK(classes >= 1 && classes <= v.len, node_label(n), "classes ", classes,
                " is outside [1, ", v.len, "]");
  FUSEBOX_CHECK(labels_t.numel() == v.outer * v.inner, node_label(n), "labels ",
                shape_str(labels_t.shape()), " do not match logits ", shape_str(logits.shape()));
  FUSEBOX_CHECK(is_integer(labels_t.dtype()), node_label(n), "labels must be i64 or i32, got ",
                dtype_name(labels_t.dtype()));
  FUSEBOX_CHECK(!weight_t || weight_t->numel() == classes, node_label(n), "weight has ",
                weight_t ? weight_t->numel() : 0, " elements for ", classes, " classes");

  // Labels first, so that a bad one fails before any work.
  std::vector<int64_t> labels(size_t(labels_t.numel()));
  std::vector<double> label_weight(labels.size(), 1.0);  // 0 for ignored positions
  const std::vector<double> weight = weight_t ? weight_t->to_doubles() : std::vector<double>();
  visit_dtype(labels_t.dtype(), [&](auto tag) {
    using L = decltype(tag);
    if constexpr (std::is_integral_v<L>) {
      const L* src = labels_t.data<L>();
      for (size_t p = 0; p < labels.size(); ++p) labels[p] = int64_t(src[p]);
    }
  });
  for (size_t p = 0; p < labels.size(); ++p) {
    const int64_t l = labels[p];
    if (attrs.ignore_index && l == *attrs.ignore_index) {
      label_weight[p] = 0.0;
      continue;
    }
    FUSEBOX_CHECK(l >= 0 && l < classes, node_label(n), "label ", l, " at position ",
                  position_str(int64_t(p), labels_t.shape()), " is outside [0, ", classes, ")");
    if (!weight.empty()) label_weight[p] = weight[size_t(l)];
  }

  std::vector<double> loss(labels.size(), 0.0);
  std::vector<double> row_lse(attrs.lse_stash ? labels.size() : 0);
  visit_float(n, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = logits.data<T>();
    T* log_prob = out.size() > 1 && !attrs.lse_stash ? out[1].data<T>() : nullptr;
    for_each_softmax_row(
        px, v.outer, classes, v.inner,
        [&](int64_t row, int64_t base, double m, double lse) {
          // Row `row` = (n, d...) is also the label's flat position.
          if (log_prob) {
            for (int64_t j = 0, i = base; j < v.len; ++j, i += v.inner)
              log_prob[i] = convert<T>(double(to_compute(px[i])) - m - lse);
          }
          const size_t p = size_t(row);
          if (!row_lse.empty()) row_lse[p] = m + lse;
          if (label_weight[p] != 0.0) {
            const double x = double(to_compute(px[base + labels[p] * v.inner]));
            loss[p] = -label_weight[p] * (x - m - lse);
          }
        },
        v.len);
  });
  if (attrs.lse_stash && out.size() > 1) store_values(out[1], row_lse);

  if (attrs.reduction == Reduction::none) {
    store_values(out[0], loss);
    return;
  }
  double total = 0.0, total_weight = 0.0;
  for (size_t p = 0; p < loss.size(); ++p) {
    total += loss[p];
    total_weight += label_weight[p];
  }
  store_values(out[0], std::vector<double>{
                           attrs.reduction == Reduction::sum ? total : total / total_weight});
}

}  // namespace fusebox::cpu
