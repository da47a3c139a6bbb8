// Normalisation: batch_norm, batch_norm_apply, layer_norm, rms_norm.
//
// Everything runs in f64 and is rounded once to the output dtype: statistics
// (means, variances, mean squares) with two passes (mean first, then squared
// deviations), and the per-element (x - mean) * inv_std too, since rounding the
// mean to f32 first would cost the precision a large common offset leaves.
// Statistics outputs are written in whatever dtype inference gave them. One exception: a
// training batch_norm whose statistics are stored in x's compute type normalises with them as
// stored, so that batch_norm_apply (y computed again from the saved statistics, for the
// backward) gives its bits; the rounding costs f32 x no more than its own quantisation.
#include <cmath>

#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

namespace {

// An optional per-element parameter (scale, bias) broadcast to `to` and
// flattened; empty when the input is absent.
std::vector<double> expand_param(const Node& n, const Tensor* p, const Shape& to) {
  if (!p) return {};
  Shape merged;
  FUSEBOX_CHECK(broadcast_shapes(p->shape(), to, &merged) && merged == to, node_label(n),
                "parameter of shape ", shape_str(p->shape()), " does not broadcast to ",
                shape_str(to));
  return broadcast_values<double>(*p, to);
}

// One normaliser for layer_norm (centre = true) and rms_norm (centre = false):
// each of `rows` contiguous rows of `cols` elements becomes
//   y = (x - mean) * inv * scale + bias,  inv = 1 / sqrt(var + eps)
// where mean and var are the row's mean and population variance, or, without
// centring, mean = 0 and var = mean(x^2). Fills mean[r] and inv[r]. y is Y: T, or another
// dtype in the mixed form (ir/ops.h NormAttrs).
template <class T, class Y>
void normalize_rows(const Node& n, Inputs in, Tensor& y, bool centre, double eps,
                    std::vector<double>& mean, std::vector<double>& inv) {
  const Tensor& x = *in[0];
  const int64_t axis = std::get<NormAttrs>(n.attrs).axis;
  const Shape norm_shape(x.shape().begin() + axis, x.shape().end());
  const int64_t cols = numel(norm_shape);
  const int64_t rows = numel(Shape(x.shape().begin(), x.shape().begin() + axis));
  const std::vector<double> scale = expand_param(n, in.size() > 1 ? in[1] : nullptr, norm_shape);
  const std::vector<double> bias = expand_param(n, in.size() > 2 ? in[2] : nullptr, norm_shape);
  mean.assign(size_t(rows), 0.0);
  inv.assign(size_t(rows), 0.0);
  const T* px = x.data<T>();
  Y* py = y.data<Y>();
  parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   const T* xr = px + r * cols;
                   Y* yr = py + r * cols;
                   double m = 0.0;
                   if (centre) {
                     for (int64_t j = 0; j < cols; ++j) m += double(to_compute(xr[j]));
                     m /= double(cols);
                   }
                   double sq = 0.0;
                   for (int64_t j = 0; j < cols; ++j) {
                     double d = double(to_compute(xr[j])) - m;
                     sq += d * d;
                   }
                   const double iv = 1.0 / std::sqrt(sq / double(cols) + eps);
                   mean[size_t(r)] = m;
                   inv[size_t(r)] = iv;
                   for (int64_t j = 0; j < cols; ++j) {
                     double v = (double(to_compute(xr[j])) - m) * iv;
                     if (!scale.empty()) v *= scale[size_t(j)];
                     if (!bias.empty()) v += bias[size_t(j)];
                     // The mixed form of an f32 norm is its f32 y rounded to Y (the cast it
                     // stands for): through f32, not from the double at once.
                     if constexpr (std::is_same_v<T, float> && !std::is_same_v<Y, float>)
                       yr[j] = convert<Y>(double(float(v)));
                     else
                       yr[j] = convert<Y>(v);
                   }
                 }
               });
}

// A sync batch norm's statistics: this rank's per-channel mean and population variance over
// `count` elements replaced by those of every rank's together.
void merge_ranks(dist::Communicator* world, int64_t count, std::vector<double>& mean,
                 std::vector<double>& var) {
  const size_t channels = mean.size();
  std::vector<double> own(channels * 3);
  for (size_t c = 0; c < channels; ++c) {
    own[3 * c] = double(count);
    own[3 * c + 1] = mean[c];
    own[3 * c + 2] = var[c] * double(count);  // M2
  }
  const std::vector<double> all = gather_ranks(world, own);
  const size_t ranks = all.size() / own.size();
  for (size_t c = 0; c < channels; ++c) {
    double n = 0, m = 0, m2 = 0;
    for (size_t r = 0; r < ranks; ++r) {
      const double* t = &all[(r * channels + c) * 3];
      const double total = n + t[0];
      if (total == 0) continue;
      const double delta = t[1] - m, weight = t[0] / total;
      m2 += t[2] + delta * delta * n * weight;
      m += delta * weight;
      n = total;
    }
    mean[c] = m;
    var[c] = n > 0 ? m2 / n : 0.0;
  }
}

}  // namespace

// batch_norm over x [N, C, D...]: channel c's elements are the N rows
// x[n, c, :] of `inner` = prod(D) elements each.
//   inference: y = (x - running_mean) * inv_std * scale + bias, inv_std from running_var.
//   training:  mean/var are the batch's (population variance); the running
//              statistics move toward them: running * momentum + batch * (1 - momentum).
//   relu:      y rounded to T, then relu as pointwise.cpp computes it (v < 0 ? 0 : v in
//              compute_t<T>), so that the fused node is bit for bit batch_norm then relu.
//   residual:  (input 5) y rounded to T plus the residual, as pointwise.cpp's add (in
//              compute_t<T>, rounded to T), before the relu: bit for bit batch_norm, add,
//              relu.
//   sync:      (training) each rank's (count, mean, M2) per channel, gathered from every
//              rank of `world` and merged in rank order (Chan et al.): the statistics of
//              the ranks' x together, the same bits on every rank.
namespace {

// batch_norm's and batch_norm_apply's x [N, C, D...] (checked: rank >= 2, inputs 1-4 of C
// elements each) as N * C rows of `inner` elements.
struct BatchNormRows {
  int64_t batch = 0, channels = 0, inner = 0;
};
BatchNormRows batch_norm_rows(const Node& n, Inputs in) {
  const Tensor& x = *in[0];
  FUSEBOX_CHECK(x.rank() >= 2, node_label(n), "expects x of rank >= 2, got ", shape_str(x.shape()));
  const BatchNormRows rows{x.dim(0), x.dim(1),
                           numel(Shape(x.shape().begin() + 2, x.shape().end()))};
  for (const Tensor* p : {in[1], in[2], in[3], in[4]}) {
    FUSEBOX_CHECK(p->numel() == rows.channels, node_label(n), "per-channel input has ", p->numel(),
                  " elements for ", rows.channels, " channels");
  }
  return rows;
}

// Stage "apply" of batch_norm and batch_norm_apply: y = (x - mean[c]) * k[c] + bias[c] in
// f64, rounded to T, then the residual added and the relu, each as the unfused op.
template <class T>
void apply_batch_norm(const T* px, T* py, const T* residual, bool relu, int64_t batch,
                      int64_t channels, int64_t inner, const std::vector<double>& mean,
                      const std::vector<double>& k, const std::vector<double>& bias) {
  using C = compute_t<T>;
  const auto activate = [](T y) { return convert<T>(to_compute(y) < C(0) ? C(0) : to_compute(y)); };
  parallel_for(batch * channels, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   const size_t c = size_t(r % channels);
                   const double m = mean[c], kc = k[c], b = bias[c];
                   const T* xr = px + r * inner;
                   T* yr = py + r * inner;
                   for (int64_t i = 0; i < inner; ++i)
                     yr[i] = convert<T>((double(to_compute(xr[i])) - m) * kc + b);
                   if (residual) {
                     const T* rr = residual + r * inner;
                     for (int64_t i = 0; i < inner; ++i)
                       yr[i] = convert<T>(to_compute(yr[i]) + to_compute(rr[i]));
                   }
                   if (relu)
                     for (int64_t i = 0; i < inner; ++i) yr[i] = activate(yr[i]);
                 }
               });
}

// Whether per-channel values of dtype `param` are x's compute type (the statistics a training
// forward normalises with as stored).
template <class T>
bool stored_in_compute_type(DType param) {
  return param == (std::is_same_v<compute_t<T>, double> ? DType::f64 : DType::f32);
}

// `values` as a per-channel tensor of dtype `param` stores them.
std::vector<double> as_stored(std::vector<double> values, DType param) {
  if (param == DType::f32)
    for (double& v : values) v = double(float(v));
  return values;
}

// Per channel c of x [N, C, D...] (T): the mean of its N * D elements and the sum of their
// squared deviations from it, two passes in f64.
template <class T>
void channel_moments(const T* px, int64_t batch, int64_t channels, int64_t inner,
                     std::vector<double>& mean, std::vector<double>& m2) {
  mean.assign(size_t(channels), 0.0);
  m2.assign(size_t(channels), 0.0);
  const int64_t count = batch * inner;
  parallel_for(channels, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double sum = 0.0, sq = 0.0;
      for (int64_t b = 0; b < batch; ++b) {
        const T* row = px + (b * channels + c) * inner;
        for (int64_t i = 0; i < inner; ++i) sum += double(to_compute(row[i]));
      }
      const double m = sum / double(count);
      for (int64_t b = 0; b < batch; ++b) {
        const T* row = px + (b * channels + c) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          double d = double(to_compute(row[i])) - m;
          sq += d * d;
        }
      }
      mean[size_t(c)] = m;
      m2[size_t(c)] = sq;
    }
  });
}

}  // namespace

void channel_moments(const Node& n, const Tensor& x, Tensor& moments) {
  const std::string where = node_label(n);
  FUSEBOX_CHECK(x.rank() >= 2, where, "expects a tensor of rank >= 2, got ", shape_str(x.shape()));
  const int64_t batch = x.dim(0), channels = x.dim(1);
  const int64_t inner = numel(Shape(x.shape().begin() + 2, x.shape().end()));
  FUSEBOX_CHECK(moments.dtype() == DType::f64 && moments.shape() == Shape({channels, 3}), where,
                "the channel statistics must be f64 [", channels, ", 3], got ",
                dtype_name(moments.dtype()), " ", shape_str(moments.shape()));
  std::vector<double> mean, m2;
  visit_float(n, x.dtype(), [&](auto tag) {
    channel_moments(x.data<decltype(tag)>(), batch, channels, inner, mean, m2);
  });
  double* out = moments.data<double>();
  for (int64_t c = 0; c < channels; ++c) {
    out[3 * c] = double(batch * inner);
    out[3 * c + 1] = mean[size_t(c)];
    out[3 * c + 2] = m2[size_t(c)];
  }
}

void batch_norm(dist::Communicator* world, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<BatchNormAttrs>(n.attrs);
  const Tensor& x = *in[0];
  const BatchNormRows rows = batch_norm_rows(n, in);
  const int64_t batch = rows.batch, channels = rows.channels, inner = rows.inner;
  FUSEBOX_CHECK(
      in.size() <= 5 || !in[5] || (in[5]->shape() == x.shape() && in[5]->dtype() == x.dtype()),
      node_label(n), "the residual must be ", dtype_name(x.dtype()), shape_str(x.shape()),
      " like x");
  const std::vector<double> scale = in[1]->to_doubles(), bias = in[2]->to_doubles();
  const std::vector<double> running_mean = in[3]->to_doubles(), running_var = in[4]->to_doubles();
  const Tensor* given = in.size() > 6 ? in[6] : nullptr;
  FUSEBOX_CHECK(!given || (attrs.training && !attrs.sync && given->dtype() == DType::f64 &&
                           given->shape() == Shape({channels, 3})),
                node_label(n), "batch_stats must be f64 [", channels,
                ", 3] of a training batch norm without sync");

  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    std::vector<double> mean = running_mean, var = running_var;
    if (attrs.training) {
      const int64_t count = batch * inner;
      std::vector<double> m2;
      if (given) {  // x's statistics from its producer (ir/ops.h batch_stats)
        const double* g = given->data<double>();
        m2.resize(size_t(channels));
        for (int64_t c = 0; c < channels; ++c) {
          FUSEBOX_CHECK(g[3 * c] == double(count), node_label(n), "batch_stats count ", g[3 * c],
                        " of channel ", c, " is not x's ", count, " elements per channel");
          mean[size_t(c)] = g[3 * c + 1];
          m2[size_t(c)] = g[3 * c + 2];
        }
      } else {
        channel_moments(px, batch, channels, inner, mean, m2);
      }
      for (int64_t c = 0; c < channels; ++c) var[size_t(c)] = m2[size_t(c)] / double(count);
      if (attrs.sync) merge_ranks(world, count, mean, var);
    }
    std::vector<double> inv_std(size_t(channels), 0.0);
    for (size_t c = 0; c < inv_std.size(); ++c)
      inv_std[c] = 1.0 / std::sqrt(var[c] + attrs.epsilon);
    // The statistics as the training form stores them, where batch_norm_apply can recompute y.
    const bool stored = attrs.training && stored_in_compute_type<T>(in[1]->dtype());
    const std::vector<double> m = stored ? as_stored(mean, in[1]->dtype()) : mean;
    std::vector<double> k = stored ? as_stored(inv_std, in[1]->dtype()) : inv_std;
    for (size_t c = 0; c < k.size(); ++c) k[c] *= scale[c];
    const T* residual = in.size() > 5 && in[5] ? in[5]->data<T>() : nullptr;
    apply_batch_norm<T>(px, out[0].data<T>(), residual, attrs.relu, batch, channels, inner, m, k,
                        bias);

    if (attrs.training && out.size() > 1) {
      std::vector<double> new_mean(size_t(channels), 0.0), new_var(size_t(channels), 0.0);
      for (size_t c = 0; c < new_mean.size(); ++c) {
        new_mean[c] = running_mean[c] * attrs.momentum + mean[c] * (1.0 - attrs.momentum);
        new_var[c] = running_var[c] * attrs.momentum + var[c] * (1.0 - attrs.momentum);
      }
      const std::vector<double>* stats[] = {&new_mean, &new_var, &mean, &inv_std};
      for (size_t o = 1; o < out.size() && o <= 4; ++o) store_values(out[o], *stats[o - 1]);
    }
  });
}

// batch_norm_apply: the training forward's y from its saved statistics (ir/ops.h), with the
// forward's arithmetic (apply_batch_norm).
void batch_norm_apply(const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<BatchNormAttrs>(n.attrs);
  const Tensor& x = *in[0];
  const BatchNormRows rows = batch_norm_rows(n, in);
  const int64_t batch = rows.batch, channels = rows.channels, inner = rows.inner;
  const std::vector<double> scale = in[1]->to_doubles(), bias = in[2]->to_doubles();
  const std::vector<double> mean = in[3]->to_doubles();
  std::vector<double> k = in[4]->to_doubles();
  for (size_t c = 0; c < k.size(); ++c) k[c] *= scale[c];
  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    apply_batch_norm<T>(x.data<T>(), out[0].data<T>(), nullptr, attrs.relu, batch, channels, inner,
                        mean, k, bias);
  });
}

namespace {

// Calls normalize_rows<T, Y> for x's dtype T and y's Y.
void normalize(const Node& n, Inputs in, Tensor& y, bool centre, std::vector<double>& mean,
               std::vector<double>& inv) {
  visit_float(n, in[0]->dtype(), [&](auto x_tag) {
    visit_float(n, y.dtype(), [&](auto y_tag) {
      normalize_rows<decltype(x_tag), decltype(y_tag)>(
          n, in, y, centre, std::get<NormAttrs>(n.attrs).epsilon, mean, inv);
    });
  });
}

}  // namespace

void layer_norm(const Node& n, Inputs in, Outputs out) {
  std::vector<double> mean, inv_std;
  normalize(n, in, out[0], true, mean, inv_std);
  if (out.size() > 1) store_values(out[1], mean);
  if (out.size() > 2) store_values(out[2], inv_std);
}

void rms_norm(const Node& n, Inputs in, Outputs out) {
  std::vector<double> mean, inv_rms;
  Inputs x_and_scale = in.first(std::min<size_t>(in.size(), 2));  // rms_norm has no bias
  normalize(n, x_and_scale, out[0], false, mean, inv_rms);
  if (out.size() > 1) store_values(out[1], inv_rms);
}

}  // namespace fusebox::cpu
