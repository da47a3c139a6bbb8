// Gradients of the reductions: softmax / log_softmax, cross_entropy and reduce_max.
//
// softmax_backward:       per row along the axis, in f64: s = sum(dy * y);
//                         dx = y * (dy - s).
// log_softmax_backward:   s = sum(dy); dx = dy - exp(y) * s.
// cross_entropy_backward: per position p = (n, d...) with label l and class weight
//                         w = weight[l] (1 without weights), and k = w * dloss[p] (none),
//                         w * dloss (sum) or w * dloss / sum of the counted weights (mean):
//                         dlogits[n, j, d...] = k * (exp(log_prob[n, j, d...]) - [j == l]),
//                         0 for an ignored position. The lse_stash form reads the logits
//                         and each position's log-sum-exp instead of log_prob:
//                         exp(log_prob) = exp(logits - lse); 0 past `classes`.
// reduce_max_backward:    per output o, the reduced elements equal to y[o] (the NaN ones
//                         when y[o] is NaN) share dy[o] evenly; the others get 0.
#include <algorithm>
#include <cmath>

#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

namespace {

// A tensor viewed as [outer, len, inner] around `axis`: a row is the `len` elements
// at stride `inner` starting at offset (r / inner) * len * inner + r % inner.
struct Rows {
  int64_t outer, len, inner;

  Rows(const Shape& s, int64_t axis)
      : outer(numel(Shape(s.begin(), s.begin() + axis))),
        len(s[size_t(axis)]),
        inner(numel(Shape(s.begin() + axis + 1, s.end()))) {}
  int64_t count() const { return outer * inner; }
  int64_t base(int64_t r) const { return (r / inner) * len * inner + r % inner; }

  // Calls row(r, base) for every row, in parallel.
  template <class F>
  void parallel(F&& row) const {
    parallel_for(count(), std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t r = begin; r < end; ++r) row(r, base(r));
                 });
  }
};

// The labels as i64, checked against [0, classes) unless equal to ignore_index, and
// each position's weight: weight[label] (1 without weights), 0 when ignored. The same
// rule as the forward cross_entropy's.
struct Labels {
  std::vector<int64_t> label;
  std::vector<double> weight;
};

Labels read_labels(const Node& n, const Tensor& labels, const Tensor* weight, int64_t classes) {
  const auto& attrs = std::get<CrossEntropyAttrs>(n.attrs);
  Labels out;
  out.label.resize(size_t(labels.numel()));
  out.weight.assign(out.label.size(), 1.0);
  const std::vector<double> class_weight = weight ? weight->to_doubles() : std::vector<double>();
  visit_dtype(labels.dtype(), [&](auto tag) {
    using L = decltype(tag);
    if constexpr (std::is_integral_v<L> && !std::is_same_v<L, bool>) {
      const L* src = labels.data<L>();
      for (size_t p = 0; p < out.label.size(); ++p) out.label[p] = int64_t(src[p]);
    } else {
      throw Error(node_label(n),
                  cat("labels must be i64 or i32, got ", dtype_name(labels.dtype())));
    }
  });
  for (size_t p = 0; p < out.label.size(); ++p) {
    const int64_t l = out.label[p];
    if (attrs.ignore_index && l == *attrs.ignore_index) {
      out.weight[p] = 0.0;
      continue;
    }
    FUSEBOX_CHECK(l >= 0 && l < classes, node_label(n), "label ", l, " at flat position ", p,
                  " of labels ", shape_str(labels.shape()), " is outside [0, ", classes, ")");
    if (!class_weight.empty()) out.weight[p] = class_weight[size_t(l)];
  }
  return out;
}

}  // namespace

// (dy, y) -> dx for softmax and log_softmax.
void softmax_backward(const Node& n, Inputs in, Outputs out) {
  const Tensor &dy = *in[0], &y = *in[1];
  FUSEBOX_CHECK(dy.shape() == y.shape() && dy.dtype() == y.dtype(), node_label(n), "dy ",
                shape_str(dy.shape()), " and y ", shape_str(y.shape()), " must share a type");
  const Rows rows(y.shape(), std::get<SoftmaxAttrs>(n.attrs).axis);
  const bool log = n.op == OpKind::log_softmax_backward;
  visit_float(n, y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    const T* py = y.data<T>();
    T* pdx = out[0].data<T>();
    rows.parallel([&](int64_t, int64_t base) {
      const int64_t step = rows.inner, end = base + rows.len * step;
      double s = 0.0;
      for (int64_t i = base; i < end; i += step)
        s += double(to_compute(pdy[i])) * (log ? 1.0 : double(to_compute(py[i])));
      for (int64_t i = base; i < end; i += step) {
        const double g = double(to_compute(pdy[i])), v = double(to_compute(py[i]));
        pdx[i] = convert<T>(log ? g - std::exp(v) * s : v * (g - s));
      }
    });
  });
}

// (dloss, log_prob, labels, weight?) -> dlogits, or (dloss, lse, labels, weight?, logits)
void cross_entropy_backward(const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<CrossEntropyAttrs>(n.attrs);
  const Tensor &dloss = *in[0], &labels_t = *in[2];
  const Tensor* weight = in.size() > 3 ? in[3] : nullptr;
  FUSEBOX_CHECK(!attrs.lse_stash || (in.size() > 4 && in[4]), node_label(n),
                "the lse_stash form needs the input logits");
  // The tensor of dlogits' shape: log_prob, or the lse_stash form's logits.
  const Tensor& x = attrs.lse_stash ? *in[4] : *in[1];
  FUSEBOX_CHECK(x.rank() >= 2, node_label(n), "expects logits [N, C, D...], got ",
                shape_str(x.shape()));
  const Rows rows(x.shape(), 1);
  const int64_t classes = attrs.classes.value_or(rows.len);
  FUSEBOX_CHECK(labels_t.numel() == rows.count() && (!weight || weight->numel() == classes) &&
                    dloss.numel() == (attrs.reduction == Reduction::none ? rows.count() : 1) &&
                    (!attrs.lse_stash || in[1]->numel() == rows.count()),
                node_label(n), "labels ", shape_str(labels_t.shape()), ", dloss ",
                shape_str(dloss.shape()), " and weight do not fit logits ", shape_str(x.shape()));
  const Labels labels = read_labels(n, labels_t, weight, classes);

  // k[p]: the factor of position p's gradient.
  const std::vector<double> dl = dloss.to_doubles();
  std::vector<double> k(labels.weight.size());
  double total_weight = 0.0;
  for (double w : labels.weight) total_weight += w;
  for (size_t p = 0; p < k.size(); ++p) {
    const double w = labels.weight[p];
    switch (attrs.reduction) {
      case Reduction::none:
        k[p] = w * dl[p];
        break;
      case Reduction::sum:
        k[p] = w * dl[0];
        break;
      case Reduction::mean:  // every position ignored: all gradients 0, as PyTorch
        k[p] = w == 0.0 ? 0.0 : w * dl[0] / total_weight;
        break;
    }
  }
  const std::vector<double> lse = attrs.lse_stash ? in[1]->to_doubles() : std::vector<double>();

  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* dx = out[0].data<T>();
    rows.parallel([&](int64_t r, int64_t base) {  // row r is label position r
      const size_t p = size_t(r);
      for (int64_t j = 0, i = base; j < rows.len; ++j, i += rows.inner) {
        const double onehot = j == labels.label[p] ? 1.0 : 0.0;
        const double log_prob = double(to_compute(px[i])) - (attrs.lse_stash ? lse[p] : 0.0);
        // An ignored position (k = 0) gives 0 even where its log_prob is not finite.
        dx[i] =
            convert<T>(k[p] == 0.0 || j >= classes ? 0.0 : k[p] * (std::exp(log_prob) - onehot));
      }
    });
  });
}

// (dy, x, y) -> dx: the dims split into kept ones (walked by the outputs, dy and y
// row-major over them) and reduced ones (walked for each output, in x and dx alike).
void reduce_max_backward(const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<ReduceAttrs>(n.attrs);
  const Tensor &dy = *in[0], &x = *in[1], &y = *in[2];
  Tensor& dx = out[0];
  const Shape x_strides = contiguous_strides(x.shape());
  StridedNest<2> kept;
  StridedNest<1> reduced;
  for (int64_t d = 0; d < x.rank(); ++d) {
    const bool is_reduced = std::find(attrs.axes.begin(), attrs.axes.end(), d) != attrs.axes.end();
    if (is_reduced) {
      reduced.shape.push_back(x.dim(d));
      reduced.strides[0].push_back(x_strides[size_t(d)]);
    } else {
      kept.shape.push_back(x.dim(d));
      kept.strides[1].push_back(x_strides[size_t(d)]);
    }
  }
  kept.strides[0] = contiguous_strides(kept.shape);
  FUSEBOX_CHECK(dy.numel() == numel(kept.shape) && y.numel() == dy.numel() &&
                    dy.dtype() == x.dtype() && y.dtype() == x.dtype(),
                node_label(n), "dy ", shape_str(dy.shape()), " and y ", shape_str(y.shape()),
                " do not match the kept dims ", shape_str(kept.shape), " of x");
  kept.simplify();
  reduced.simplify();
  const int64_t count = numel(reduced.shape), rs = reduced.inner_stride(0);
  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* px = x.data<T>();
    const T *pdy = dy.data<T>(), *py = y.data<T>();
    T* pdx = dx.data<T>();
    // Calls f(offset) for each reduced element of the output whose first one is at `base`.
    auto for_each_reduced = [&](int64_t base, auto&& f) {
      reduced.for_each_run(0, count, [&](const std::array<int64_t, 1>& off, int64_t run) {
        for (int64_t j = 0; j < run; ++j) f(base + off[0] + j * rs);
      });
    };
    const int64_t so = kept.inner_stride(0), sx = kept.inner_stride(1);
    kept.parallel_runs(std::max<int64_t>(1, kGrain / std::max<int64_t>(count, 1)),
                       [&](const std::array<int64_t, 2>& off, int64_t run) {
                         for (int64_t j = 0; j < run; ++j) {
                           const int64_t o = off[0] + j * so, base = off[1] + j * sx;
                           const C m = to_compute(py[o]);
                           const bool nan = std::isnan(m);
                           auto is_max = [&](int64_t i) {
                             const C v = to_compute(px[i]);
                             return nan ? std::isnan(v) : v == m;
                           };
                           int64_t ties = 0;
                           for_each_reduced(base, [&](int64_t i) { ties += is_max(i); });
                           const C share = to_compute(pdy[o]) / C(std::max<int64_t>(ties, 1));
                           for_each_reduced(base, [&](int64_t i) {
                             pdx[i] = convert<T>(is_max(i) ? share : C(0));
                           });
                         }
                       });
  });
}

}  // namespace fusebox::cpu
