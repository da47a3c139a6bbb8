#include "zoo/layers.h"

#include <algorithm>
#include <cmath>

namespace fusebox::zoo {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Rng::uniform(double lo, double hi) {
  double u = double(next() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}

double Rng::normal_like() {
  uint64_t r = next();
  double sum = 0;
  for (int i = 0; i < 4; ++i) sum += (double((r >> (16 * i)) & 0xffff) + 0.5) * 0x1.0p-16;
  // Four U(0,1) have mean 2 and variance 4/12.
  return (sum - 2.0) * std::sqrt(3.0);
}

Rng tensor_rng(uint64_t seed, const std::string& tensor_name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : tensor_name) h = (h ^ c) * 0x100000001b3ULL;
  Rng mix(seed);
  return Rng(h ^ mix.next());
}

template <class Draw>
Tensor Layers::parameter(const std::string& name, const Shape& shape, Draw draw) {
  Rng rng = tensor_rng(opts_.seed, name);
  Tensor t = Tensor::empty(DType::f32, shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(draw(rng, i));
  return t;
}

ValueId Layers::add_parameter(const std::string& name, const Tensor& f32_values) {
  return g_.add_constant(name,
                         opts_.dtype == DType::f32 ? f32_values : f32_values.cast(opts_.dtype));
}

ValueId Layers::normal_parameter(const std::string& name, const Shape& shape, double stddev) {
  return add_parameter(
      name, parameter(name, shape, [&](Rng& r, int64_t) { return r.normal_like() * stddev; }));
}

ValueId Layers::filled_parameter(const std::string& name, const Shape& shape, double value) {
  return add_parameter(name, Tensor::full(DType::f32, shape, value));
}

ValueId Layers::linear(ValueId x, const std::string& name, int64_t out, const std::string& weight,
                       const std::string& bias) {
  const Shape s = g_.value(x).type.shape;
  const int64_t in = s.back(), rows = numel(s) / in;
  const ValueId w = normal_parameter(weight.empty() ? name + ".weight" : weight, {out, in}, 0.02);
  const ValueId b = filled_parameter(bias.empty() ? name + ".bias" : bias, {out}, 0.0);
  const ValueId flat = b_.name(name + ".rows").reshape(x, {rows, in});
  const ValueId y = b_.name(name).gemm(flat, w, b, GemmAttrs{.trans_b = true});
  Shape out_shape = s;
  out_shape.back() = out;
  return b_.name(name + ".unrows").reshape(y, out_shape);
}

ValueId Layers::logits(ValueId features, const std::string& name, int64_t num_classes) {
  const int64_t width = g_.value(features).type.shape.back();
  const ValueId w = normal_parameter(name + ".weight", {num_classes, width}, 0.02);
  const ValueId b = filled_parameter(name + ".bias", {num_classes}, 0.0);
  const ValueId y = b_.name(name).gemm(features, w, b, GemmAttrs{.trans_b = true});
  mark_logits(y);
  return y;
}

ValueId Layers::layer_norm(ValueId x, const std::string& name, double epsilon) {
  const int64_t width = g_.value(x).type.shape.back();
  const ValueId scale = filled_parameter(name + ".weight", {width}, 1.0);
  const ValueId bias = filled_parameter(name + ".bias", {width}, 0.0);
  return b_.name(name).layer_norm(x, scale, bias, NormAttrs{.axis = -1, .epsilon = epsilon});
}

ValueId Layers::scalar(double value) {
  return b_.constant(Tensor::full(opts_.dtype, {}, value));
}

void Layers::mark_logits(ValueId y) {
  g_.rename_value(y, "logits");
  g_.mark_output(y);
}

std::array<ValueId, 3> Layers::split_heads(ValueId qkv, const std::string& name, int64_t heads) {
  const Shape s = g_.value(qkv).type.shape;
  const int64_t batch = s[0], tokens = s[1], head = s[2] / 3 / heads;
  const ValueId split = b_.name(name + ".heads").reshape(qkv, {batch, tokens, 3, heads, head});
  const ValueId packed = b_.name(name + ".qkv").transpose(split, {2, 0, 3, 1, 4});  // [3,B,H,T,d]
  auto part = [&](int64_t i, const char* which) {
    const ValueId p = b_.name(name + "." + which).slice(packed, SliceAttrs{{i}, {i + 1}, {0}, {1}});
    return b_.name(name + "." + which + "_heads").reshape(p, {batch, heads, tokens, head});
  };
  return {part(0, "q"), part(1, "k"), part(2, "v")};
}

ValueId Layers::scaled_scores(ValueId q, ValueId k, const std::string& name) {
  const int64_t head = g_.value(q).type.shape.back();
  const ValueId kt = b_.name(name + ".k_t").transpose(k, {0, 1, 3, 2});
  const ValueId scores = b_.name(name + ".scores").matmul(q, kt);
  return b_.name(name + ".scaled").mul(scores, scalar(1.0 / std::sqrt(double(head))));
}

ValueId Layers::attend(ValueId scores, ValueId v, const std::string& name) {
  const Shape s = g_.value(v).type.shape;  // [B, H, T, d]
  const ValueId weights = b_.name(name + ".softmax").softmax(scores, -1);
  const ValueId context = b_.name(name + ".context").matmul(weights, v);
  const ValueId merged = b_.name(name + ".merge").transpose(context, {0, 2, 1, 3});
  return b_.name(name + ".merged").reshape(merged, {s[0], s[2], s[1] * s[3]});
}

ValueId Layers::he_conv(ValueId x, const std::string& name, int64_t out, int64_t kernel,
                        int64_t stride, int64_t groups, bool bias) {
  const int64_t in = channels(x);
  const double fan_in = double(in / groups * kernel * kernel);
  const ValueId w = normal_parameter(name + ".weight", {out, in / groups, kernel, kernel},
                                     std::sqrt(2.0 / fan_in));
  ConvAttrs a;
  a.strides = {stride, stride};
  a.pads_begin = a.pads_end = {(kernel - 1) / 2, (kernel - 1) / 2};
  a.groups = groups;
  const ValueId b = bias ? filled_parameter(name + ".bias", {out}, 0.0) : kNoValue;
  return b_.name(name).conv(x, w, b, a);
}

ValueId Layers::initial_batch_norm(ValueId x, const std::string& name, double epsilon,
                                   double momentum) {
  const int64_t c = channels(x);
  const ValueId s = filled_parameter(name + ".weight", {c}, 1.0);
  const ValueId b = filled_parameter(name + ".bias", {c}, 0.0);
  const ValueId m = filled_parameter(name + ".running_mean", {c}, 0.0);
  const ValueId v = filled_parameter(name + ".running_var", {c}, 1.0);
  const BatchNormAttrs a{.epsilon = epsilon, .momentum = momentum};
  b_.name(name);
  return opts_.training ? b_.batch_norm_training(x, s, b, m, v, a).at(0)
                        : b_.batch_norm(x, s, b, m, v, a);
}

const ChannelStats& Layers::stats(ValueId v) const {
  auto it = stats_.find(v);
  FUSEBOX_CHECK(it != stats_.end(), "zoo", "no statistics for '", g_.value(v).name, "'");
  return it->second;
}

ValueId Layers::input() {
  ValueId x =
      g_.add_input("input", opts_.dtype, {opts_.batch, 3, opts_.image_size, opts_.image_size});
  stats_[x] = {std::vector<double>(3, 0.0), std::vector<double>(3, 1.0 / 3.0)};
  return x;
}

ValueId Layers::conv(ValueId x, const std::string& name, int64_t out_channels, int64_t kernel,
                     int64_t stride, int64_t pad) {
  const int64_t in_channels = channels(x);
  const double stddev = std::sqrt(2.0 / double(out_channels * kernel * kernel));
  Tensor w = parameter(name + ".weight", {out_channels, in_channels, kernel, kernel},
                       [&](Rng& r, int64_t) { return r.normal_like() * stddev; });

  // y_k = sum over j, taps of w * x_j: mean_k = sum w * mean_j and, for independent
  // inputs, var_k = sum w^2 * var_j (zero padding at the borders ignored).
  const ChannelStats& in = stats(x);
  ChannelStats out{std::vector<double>(size_t(out_channels)),
                   std::vector<double>(size_t(out_channels))};
  const float* wp = w.data<float>();
  for (int64_t k = 0; k < out_channels; ++k) {
    for (int64_t j = 0; j < in_channels; ++j) {
      double sum = 0, sum_sq = 0;
      for (int64_t t = 0; t < kernel * kernel; ++t) {
        double v = wp[(k * in_channels + j) * kernel * kernel + t];
        sum += v;
        sum_sq += v * v;
      }
      out.mean[size_t(k)] += sum * in.mean[size_t(j)];
      out.var[size_t(k)] += sum_sq * in.var[size_t(j)];
    }
  }

  ConvAttrs a;
  a.strides = {stride, stride};
  a.pads_begin = {pad, pad};
  a.pads_end = {pad, pad};
  ValueId y = b_.name(name).conv(x, add_parameter(name + ".weight", w), kNoValue, a);
  stats_[y] = std::move(out);
  return y;
}

ValueId Layers::batch_norm(ValueId x, const std::string& name) {
  const ChannelStats& in = stats(x);
  const Shape c{channels(x)};
  Tensor scale =
      parameter(name + ".weight", c, [](Rng& r, int64_t) { return r.uniform(0.5, 1.5); });
  Tensor bias = parameter(name + ".bias", c, [](Rng& r, int64_t) { return r.uniform(-0.1, 0.1); });
  Tensor mean = parameter(name + ".running_mean", c, [&](Rng& r, int64_t i) {
    return in.mean[size_t(i)] + r.uniform(-0.1, 0.1) * std::sqrt(in.var[size_t(i)]);
  });
  Tensor var = parameter(name + ".running_var", c, [&](Rng& r, int64_t i) {
    return in.var[size_t(i)] * r.uniform(0.5, 1.5);
  });

  // torchvision's BatchNorm2d: eps 1e-5, momentum 0.1 (ONNX's momentum 0.9).
  const BatchNormAttrs a{.epsilon = 1e-5, .momentum = 0.9};
  ChannelStats out = in;
  for (size_t k = 0; k < out.mean.size(); ++k) {
    const double g = scale.data<float>()[k],
                 inv_std = 1.0 / std::sqrt(var.data<float>()[k] + a.epsilon);
    out.mean[k] = bias.data<float>()[k] + g * (in.mean[k] - mean.data<float>()[k]) * inv_std;
    out.var[k] = g * g * in.var[k] * inv_std * inv_std;
  }

  ValueId s = add_parameter(name + ".weight", scale), b = add_parameter(name + ".bias", bias);
  ValueId m = add_parameter(name + ".running_mean", mean);
  ValueId v = add_parameter(name + ".running_var", var);
  b_.name(name);
  ValueId y = opts_.training ? b_.batch_norm_training(x, s, b, m, v, a).at(0)
                             : b_.batch_norm(x, s, b, m, v, a);
  stats_[y] = std::move(out);
  return y;
}

ValueId Layers::relu(ValueId x, const std::string& name) {
  // relu(N(m, s^2)) to first order in m/s (small after a batch norm):
  // mean = m/2 + s*phi(0), E[y^2] = (m^2 + s^2)/2 + 2*m*s*phi(0).
  constexpr double phi0 = 0.3989422804014327;  // 1/sqrt(2*pi)
  ChannelStats out = stats(x);
  for (size_t k = 0; k < out.mean.size(); ++k) {
    const double m = out.mean[k], v = out.var[k], s = std::sqrt(v);
    const double mean = m / 2 + s * phi0, second = (m * m + v) / 2 + 2 * m * s * phi0;
    out.mean[k] = mean;
    out.var[k] = std::max(second - mean * mean, 0.0);
  }
  ValueId y = b_.name(name).relu(x);
  stats_[y] = std::move(out);
  return y;
}

ValueId Layers::add(ValueId a, ValueId b, const std::string& name) {
  ChannelStats out = stats(a);
  const ChannelStats& sb = stats(b);
  for (size_t k = 0; k < out.mean.size(); ++k) {
    out.mean[k] += sb.mean[k];
    out.var[k] += sb.var[k];  // as if independent
  }
  ValueId y = b_.name(name).add(a, b);
  stats_[y] = std::move(out);
  return y;
}

ValueId Layers::max_pool(ValueId x, const std::string& name, int64_t kernel, int64_t stride,
                         int64_t pad) {
  PoolAttrs a;
  a.kernel = {kernel, kernel};
  a.strides = {stride, stride};
  a.pads_begin = {pad, pad};
  a.pads_end = {pad, pad};
  ValueId y = b_.name(name).max_pool(x, a);

  // The zoo pools right after a relu: y = relu(z), z ~ N(~0, sigma^2), sigma^2 =
  // 2 E[y^2]. relu and max commute, so a window's max is relu(max of n normals): for
  // these means well above 0, mean = sigma * e_n, var = sigma^2 * v_n, with e_n and v_n
  // the mean and variance of the max of n independent standard normals (neighbours
  // are correlated, which the measured stats show matters little).
  FUSEBOX_CHECK(kernel == 2 || kernel == 3, "zoo", "no max statistics for a ", kernel, "x", kernel,
                " window");
  const double e_n = kernel == 2 ? 1.0294 : 1.4850, v_n = kernel == 2 ? 0.4917 : 0.3574;
  ChannelStats out = stats(x);
  for (size_t k = 0; k < out.mean.size(); ++k) {
    const double sigma_sq = 2 * (out.mean[k] * out.mean[k] + out.var[k]);
    out.mean[k] = std::sqrt(sigma_sq) * e_n;
    out.var[k] = sigma_sq * v_n;
  }
  stats_[y] = std::move(out);
  return y;
}

ValueId Layers::classifier(ValueId features, int64_t num_classes) {
  ValueId pooled = b_.name("avgpool").global_avg_pool(features);
  ValueId flat = b_.name("flatten").flatten(pooled, 1);
  const int64_t in = channels(features);
  const double bound = 1.0 / std::sqrt(double(in));
  auto uniform = [&](Rng& r, int64_t) { return r.uniform(-bound, bound); };
  ValueId w = add_parameter("fc.weight", parameter("fc.weight", {num_classes, in}, uniform));
  ValueId bias = add_parameter("fc.bias", parameter("fc.bias", {num_classes}, uniform));
  ValueId logits = b_.name("fc").gemm(flat, w, bias, GemmAttrs{.trans_b = true});
  mark_logits(logits);
  return logits;
}

}  // namespace fusebox::zoo
