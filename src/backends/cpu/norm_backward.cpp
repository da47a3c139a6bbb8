// Gradients of the normalisations: batch_norm, layer_norm, rms_norm.
//
// Like the forward kernels (norm.cpp), everything runs in f64 and is rounded once.
// With xhat = (x - mean) * inv_std over a group of M elements (a channel for
// batch_norm, a row for layer_norm) and g = dy * scale:
//   dscale = sum(dy * xhat), dbias = sum(dy)   (summed over the groups)
//   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))
// the two subtracted means being the batch statistics' dependence on x; batch_norm's
// inference form (training = false) treats the statistics as constants: dx = inv_std * g.
// rms_norm, y = x * r * scale with r = 1 / sqrt(mean(x^2) + eps):
//   dscale = sum(dy * x * r),  dx = r * (g - x * r^2 * mean(g * x)).
// The saved statistics are inputs, never recomputed.
#include <cmath>

#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

namespace {

// layer_norm (centre) and rms_norm over `rows` contiguous rows of `cols` elements:
// stat[r] is the row's inverse std (inverse rms), mean[r] its mean (empty for rms).
// Writes dx and returns the per-column sums (dscale, dbias) over the normalised dims.
template <class T>
std::pair<std::vector<double>, std::vector<double>> norm_rows_backward(
    const Tensor& dy, const Tensor& x, const std::vector<double>& scale,
    const std::vector<double>& mean, const std::vector<double>& inv, int64_t rows, int64_t cols,
    Tensor& dx) {
  const bool centre = !mean.empty();
  const T* pdy = dy.data<T>();
  const T* px = x.data<T>();
  T* pdx = dx.data<T>();
  // xhat for layer_norm; x * r for rms_norm (the y before scale either way).
  auto normalised = [&](int64_t r, int64_t i) {
    return (double(to_compute(px[i])) - (centre ? mean[size_t(r)] : 0.0)) * inv[size_t(r)];
  };
  parallel_for(
      rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t base = r * cols;
          double sum_g = 0.0, sum_g_xhat = 0.0;
          for (int64_t j = 0; j < cols; ++j) {
            const double g =
                double(to_compute(pdy[base + j])) * (scale.empty() ? 1.0 : scale[size_t(j)]);
            sum_g += g;
            sum_g_xhat += g * normalised(r, base + j);
          }
          const double mean_g = centre ? sum_g / double(cols) : 0.0;
          const double mean_g_xhat = sum_g_xhat / double(cols);
          const double iv = inv[size_t(r)];
          for (int64_t j = 0; j < cols; ++j) {
            const double g =
                double(to_compute(pdy[base + j])) * (scale.empty() ? 1.0 : scale[size_t(j)]);
            pdx[base + j] = convert<T>(iv * (g - mean_g - normalised(r, base + j) * mean_g_xhat));
          }
        }
      });
  std::vector<double> dscale(size_t(cols), 0.0), dbias(size_t(cols), 0.0);
  parallel_for(cols, std::max<int64_t>(1, kGrain / std::max<int64_t>(rows, 1)),
               [&](int64_t c0, int64_t c1) {
                 for (int64_t j = c0; j < c1; ++j) {
                   double s = 0.0, b = 0.0;
                   for (int64_t r = 0; r < rows; ++r) {
                     const double g = double(to_compute(pdy[r * cols + j]));
                     s += g * normalised(r, r * cols + j);
                     b += g;
                   }
                   dscale[size_t(j)] = s;
                   dbias[size_t(j)] = b;
                 }
               });
  return {std::move(dscale), std::move(dbias)};
}

// (dy, x, scale?, [mean,] inv) -> (dx, dscale[, dbias]) for layer_norm / rms_norm.
void norm_backward(const Node& n, Inputs in, Outputs out, bool centre) {
  const int64_t axis = std::get<NormAttrs>(n.attrs).axis;
  const Tensor &dy = *in[0], &x = *in[1];
  const Tensor* scale = in[2];
  const Shape norm_shape(x.shape().begin() + axis, x.shape().end());
  const int64_t cols = numel(norm_shape), rows = x.numel() / std::max<int64_t>(cols, 1);
  const std::vector<double> mean = centre ? in[3]->to_doubles() : std::vector<double>();
  const std::vector<double> inv = in[centre ? 4 : 3]->to_doubles();
  FUSEBOX_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype() && int64_t(inv.size()) == rows &&
                    (!centre || int64_t(mean.size()) == rows),
                node_label(n), "dy ", shape_str(dy.shape()), " and the statistics do not fit x ",
                shape_str(x.shape()), " normalised from axis ", axis);
  Shape merged;
  FUSEBOX_CHECK(
      !scale || (broadcast_shapes(scale->shape(), norm_shape, &merged) && merged == norm_shape),
      node_label(n), "scale ", shape_str(scale->shape()), " does not broadcast to ",
      shape_str(norm_shape));
  const std::vector<double> scale_values =
      scale ? broadcast_values<double>(*scale, norm_shape) : std::vector<double>();
  visit_float(n, x.dtype(), [&](auto tag) {
    const auto [dscale, dbias] =
        norm_rows_backward<decltype(tag)>(dy, x, scale_values, mean, inv, rows, cols, out[0]);
    const Shape param_shape = scale ? scale->shape() : norm_shape;
    store_values(out[1], sum_to_shape(dscale, norm_shape, param_shape));
    if (centre) store_values(out[2], sum_to_shape(dbias, norm_shape, param_shape));
  });
}

}  // namespace

// (dy, x, scale, saved_mean, saved_inv_std, y?, bias?, dy_addend?) -> (dx, dscale, dbias,
// dy_used?); channel c's elements are the N rows x[n, c, :] of `inner` = prod(D) elements each.
// dy is first dy + dy_addend when given, in compute_t<T> rounded to T as pointwise.cpp's add.
// With relu, every read of dy reads relu's gradient at y instead (y is read: the bias that
// would let a backend recompute it is not used here), rounded to T as backward.cpp's
// unary_backward writes it (dy * 1 where y > 0, else dy * 0 in compute_t<T>), so that the
// fused node is bit for bit add, unary_backward then batch_norm_backward; dy_used (output 3,
// with dy_output) is that dy. With sync (and
// training) mean(dy) and mean(dy * x_hat) are over every rank of `world` (their sums gathered
// and added in rank order); dscale and dbias stay this rank's sums.
void batch_norm_backward(dist::Communicator* world, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<BatchNormAttrs>(n.attrs);
  const bool training = attrs.training;
  const Tensor &dy = *in[0], &x = *in[1];
  FUSEBOX_CHECK(x.rank() >= 2 && dy.shape() == x.shape() && dy.dtype() == x.dtype(), node_label(n),
                "expects dy and x [N, C, D...] alike, got ", shape_str(dy.shape()), " and ",
                shape_str(x.shape()));
  const Tensor* y = attrs.relu && in.size() > 5 ? in[5] : nullptr;
  FUSEBOX_CHECK(!attrs.relu || (y && y->shape() == x.shape() && y->dtype() == x.dtype()),
                node_label(n), "relu needs y (input 5) like x ", shape_str(x.shape()));
  const Tensor* addend = in.size() > 7 ? in[7] : nullptr;
  FUSEBOX_CHECK(!addend || (addend->shape() == x.shape() && addend->dtype() == x.dtype()),
                node_label(n), "dy_addend (input 7) must be like dy ", shape_str(x.shape()));
  FUSEBOX_CHECK(out.size() == (attrs.dy_output ? 4u : 3u), node_label(n), "expects ",
                attrs.dy_output ? 4 : 3, " outputs, got ", out.size());
  const int64_t batch = x.dim(0), channels = x.dim(1);
  const int64_t inner = numel(Shape(x.shape().begin() + 2, x.shape().end()));
  const std::vector<double> scale = in[2]->to_doubles(), mean = in[3]->to_doubles(),
                            inv_std = in[4]->to_doubles();
  for (const std::vector<double>* p : {&scale, &mean, &inv_std}) {
    FUSEBOX_CHECK(int64_t(p->size()) == channels, node_label(n), "per-channel input has ",
                  p->size(), " elements for ", channels, " channels");
  }
  std::vector<double> dscale(size_t(channels), 0.0), dbias(size_t(channels), 0.0);
  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* py = y ? y->data<T>() : nullptr;
    const T* padd = addend ? addend->data<T>() : nullptr;
    auto grad = [&](int64_t i) {
      const C d = padd ? to_compute(convert<T>(to_compute(pdy[i]) + to_compute(padd[i])))
                       : to_compute(pdy[i]);
      if (!py) return double(d);
      const C mask = to_compute(py[i]) > C(0) ? C(1) : C(0);
      return double(to_compute(convert<T>(d * mask)));
    };
    auto xhat = [&](size_t c, int64_t i) {
      return (double(to_compute(px[i])) - mean[c]) * inv_std[c];
    };
    parallel_for(channels, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double s = 0.0, b = 0.0;
        for (int64_t r = c; r < batch * channels; r += channels) {
          for (int64_t i = r * inner; i < (r + 1) * inner; ++i) {
            const double g = grad(i);
            s += g * xhat(size_t(c), i);
            b += g;
          }
        }
        dscale[size_t(c)] = s;
        dbias[size_t(c)] = b;
      }
    });
    // scale is constant per channel: dx = scale * inv_std * (dy - mean(dy) - xhat mean(dy xhat)).
    double count = double(batch * inner);
    std::vector<double> sum_dy = dbias, sum_dy_xhat = dscale;
    if (attrs.sync && training) {
      std::vector<double> own(size_t(channels) * 2);
      for (size_t c = 0; c < size_t(channels); ++c) {
        own[2 * c] = dbias[c];
        own[2 * c + 1] = dscale[c];
      }
      const std::vector<double> all = gather_ranks(world, own);
      const size_t ranks = all.size() / own.size();
      for (size_t c = 0; c < size_t(channels); ++c) {
        sum_dy[c] = sum_dy_xhat[c] = 0.0;
        for (size_t r = 0; r < ranks; ++r) {
          sum_dy[c] += all[(r * size_t(channels) + c) * 2];
          sum_dy_xhat[c] += all[(r * size_t(channels) + c) * 2 + 1];
        }
      }
      count *= double(ranks);  // the ranks' shards have one shape
    }
    if (attrs.dy_output) {
      T* used = out[3].data<T>();
      parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) used[i] = convert<T>(grad(i));
      });
    }
    T* pdx = out[0].data<T>();
    parallel_for(batch * channels, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) {
                     const size_t c = size_t(r % channels);
                     const double k = scale[c] * inv_std[c];
                     const double mean_dy = training ? sum_dy[c] / count : 0.0;
                     const double mean_dy_xhat = training ? sum_dy_xhat[c] / count : 0.0;
                     for (int64_t i = r * inner; i < (r + 1) * inner; ++i) {
                       pdx[i] = convert<T>(k * (grad(i) - mean_dy - xhat(c, i) * mean_dy_xhat));
                     }
                   }
                 });
  });
  store_values(out[1], dscale);
  store_values(out[2], dbias);
}

void layer_norm_backward(const Node& n, Inputs in, Outputs out) {
  norm_backward(n, in, out, true);
}

void rms_norm_backward(const Node& n, Inputs in, Outputs out) {
  norm_backward(n, in, out, false);
}

}  // namespace fusebox::cpu
