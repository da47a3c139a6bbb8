// Training batch norms on the fast CPU path (a training step's forward and backward; f32,
// dense NCHW as the step holds them): the project's kernels, per channel, over the N rows of
// `inner` contiguous elements of that channel, 16 lanes a vector step in float with each row's
// lanes summed into f64 per channel, the channels split over the threads.
//
//   forward:  mean, var (population) per channel; y = (x - mean) * scale * inv_std + bias
//             [+ residual] [relu]; the running statistics moved by momentum; saved mean and
//             inv_std = 1 / sqrt(var + eps) as outputs 3 and 4
//   backward: g = dy [+ dy_addend] [* (y > 0)]; dbias = sum g, dscale = sum g * x_hat;
//             dx = scale * inv_std * (g - dbias / M - x_hat * dscale / M) (training form; the
//             inference form's dx = scale * inv_std * g); g written out with dy_output
//
// Why oneDNN's batch normalization does not run them: its fused relu reads a workspace the
// forward writes (the IR's backward reads y, or recomputes it), and the IR's residual, two-term
// dy and dy_output forms have no oneDNN counterpart. The reference kernels (backends/cpu)
// compute in f64 element by element and stay the oracle; these agree with them to float
// rounding (the tests' 1e-4 / 1e-5). Synchronized, f16 / bf16 / f64 and mixed-dtype norms run
// on the reference kernels.
#include <cmath>
#include <vector>

#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/lanes.h"
#include "backends/cpu_fast/threads.h"

namespace fusebox::cpu_fast {
namespace {

// The channel's rows: x[n, c, :] for n < batch, each `inner` long, `stride` apart.
struct Rows {
  int64_t batch, inner, stride;
  int64_t at(int64_t n, int64_t c) const { return n * stride + c * inner; }
};

inline double lane_sum(const Lanes& v) {
  double s = 0;
  for (int64_t l = 0; l < kLanes; ++l) s += double(v[l]);
  return s;
}

// Sum over one row of `inner` elements (at `row`) of x - shift, squared when `square`, in
// float lanes, returned in f64.
inline double row_sum(const float* row, int64_t inner, float shift, bool square) {
  Lanes acc{};
  int64_t i = 0;
  for (; i + kLanes <= inner; i += kLanes) {
    Lanes v;
    load_lanes(row + i, v);
    v -= shift;
    acc += square ? v * v : v;
  }
  double s = lane_sum(acc);
  for (; i < inner; ++i) {
    const float v = row[i] - shift;
    s += double(square ? v * v : v);
  }
  return s;
}

// ---- forward --------------------------------------------------------------------------

struct ForwardArgs {
  const float *x, *residual, *scale, *bias;
  float* y;
  bool relu;
  double epsilon;
  Rows rows;
  double* mean;  // [C] out
  double* var;   // [C] out (population)
};

FUSEBOX_LANES_CLONES
void forward_channels(const ForwardArgs& a, int64_t c0, int64_t c1) {
  const Rows& r = a.rows;
  const double count = double(r.batch * r.inner);
  for (int64_t c = c0; c < c1; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < r.batch; ++n) {
      sum += row_sum(a.x + r.at(n, c), r.inner, 0.f, false);
    }
    const double mean = sum / count;
    const float m = float(mean);
    double sq = 0;
    for (int64_t n = 0; n < r.batch; ++n) {
      sq += row_sum(a.x + r.at(n, c), r.inner, m, true);
    }
    const double var = sq / count;
    a.mean[c] = mean;
    a.var[c] = var;
    // As the training form stores its statistics (f32), then scale.
    const float inv_std = float(1.0 / std::sqrt(var + a.epsilon));
    const float k = float(double(inv_std) * double(a.scale[c])), b = a.bias[c];
    for (int64_t n = 0; n < r.batch; ++n) {
      const float* xr = a.x + r.at(n, c);
      const float* rr = a.residual ? a.residual + r.at(n, c) : nullptr;
      float* yr = a.y + r.at(n, c);
      int64_t i = 0;
      for (; i + kLanes <= r.inner; i += kLanes) {
        Lanes v;
        load_lanes(xr + i, v);
        v = (v - m) * k + b;
        if (rr) {
          Lanes res;
          load_lanes(rr + i, res);
          v += res;
        }
        if (a.relu) v = v < 0.f ? Lanes{} : v;
        store_lanes(yr + i, v);
      }
      for (; i < r.inner; ++i) {
        float v = (xr[i] - m) * k + b;
        if (rr) v += rr[i];
        if (a.relu) v = v < 0.f ? 0.f : v;
        yr[i] = v;
      }
    }
  }
}

class BatchNormForward final : public Kernel {
 public:
  BatchNormForward(BatchNormAttrs attrs, bool residual) : attrs_(attrs), residual_(residual) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const Tensor& x = *in[0];
    const int64_t channels = x.dim(1),
                  inner = x.numel() / std::max<int64_t>(1, x.dim(0) * channels);
    std::vector<double> mean(static_cast<size_t>(channels)), var(static_cast<size_t>(channels));
    const ForwardArgs a{x.data<float>(),      residual_ ? in[5]->data<float>() : nullptr,
                        in[1]->data<float>(), in[2]->data<float>(),
                        out[0].data<float>(), attrs_.relu,
                        attrs_.epsilon,       {x.dim(0), inner, channels * inner},
                        mean.data(),          var.data()};
    split_over_threads(channels, 1, [&](int64_t c0, int64_t c1) { forward_channels(a, c0, c1); });
    const float* running_mean = in[3]->data<float>();
    const float* running_var = in[4]->data<float>();
    for (int64_t c = 0; c < channels; ++c) {
      const double m = attrs_.momentum;
      const double values[] = {double(running_mean[c]) * m + mean[size_t(c)] * (1.0 - m),
                               double(running_var[c]) * m + var[size_t(c)] * (1.0 - m),
                               mean[size_t(c)], 1.0 / std::sqrt(var[size_t(c)] + attrs_.epsilon)};
      for (size_t o = 1; o < out.size() && o <= 4; ++o)
        out[o].data<float>()[c] = float(values[o - 1]);
    }
  }

  std::string describe() const override {
    return cat("own batch_norm (training", attrs_.relu ? ", relu" : "",
               residual_ ? ", residual" : "", ")");
  }

 private:
  BatchNormAttrs attrs_;
  bool residual_;
};

// ---- backward -------------------------------------------------------------------------

struct BackwardArgs {
  const float *dy, *addend, *y, *x, *scale, *mean, *inv_std;
  float *dx, *used, *dscale, *dbias;
  bool training;
  Rows rows;
};

// g at element i of a row: dy [+ addend] [masked by y > 0], as the reference rounds them.
struct Gradient {
  const float *dy, *addend, *y;
  void at(int64_t i, Lanes& g) const {
    load_lanes(dy + i, g);
    Lanes other;
    if (addend) {
      load_lanes(addend + i, other);
      g += other;
    }
    if (y) {
      load_lanes(y + i, other);
      g = other > 0.f ? g : g * 0.f;
    }
  }
  float one(int64_t i) const {
    float g = dy[i];
    if (addend) g += addend[i];
    if (y) g = y[i] > 0.f ? g : g * 0.f;
    return g;
  }
};

FUSEBOX_LANES_CLONES
void backward_channels(const BackwardArgs& a, int64_t c0, int64_t c1) {
  const Rows& r = a.rows;
  const double count = double(r.batch * r.inner);
  for (int64_t c = c0; c < c1; ++c) {
    const float m = a.mean[c], s = a.inv_std[c];
    double sum_g = 0, sum_gx = 0;
    for (int64_t n = 0; n < r.batch; ++n) {
      const int64_t at = r.at(n, c);
      const Gradient g{a.dy + at, a.addend ? a.addend + at : nullptr, a.y ? a.y + at : nullptr};
      const float* xr = a.x + at;
      float* used = a.used ? a.used + at : nullptr;
      Lanes acc_g{}, acc_gx{};
      int64_t i = 0;
      for (; i + kLanes <= r.inner; i += kLanes) {
        Lanes gv, xv;
        g.at(i, gv);
        load_lanes(xr + i, xv);
        if (used) store_lanes(used + i, gv);
        acc_g += gv;
        acc_gx += gv * ((xv - m) * s);
      }
      sum_g += lane_sum(acc_g);
      sum_gx += lane_sum(acc_gx);
      for (; i < r.inner; ++i) {
        const float gv = g.one(i);
        if (used) used[i] = gv;
        sum_g += double(gv);
        sum_gx += double(gv) * ((double(xr[i]) - m) * s);
      }
    }
    a.dbias[c] = float(sum_g);
    a.dscale[c] = float(sum_gx);
    if (!a.dx) continue;
    const float k = float(double(a.scale[c]) * double(s));
    const float mean_g = a.training ? float(sum_g / count) : 0.f;
    const float mean_gx = a.training ? float(sum_gx / count) : 0.f;
    for (int64_t n = 0; n < r.batch; ++n) {
      const int64_t at = r.at(n, c);
      // The g stage 1 wrote where it wrote one, else computed again.
      const Gradient g{a.used ? a.used + at : a.dy + at,
                       a.used || !a.addend ? nullptr : a.addend + at,
                       a.used || !a.y ? nullptr : a.y + at};
      const float* xr = a.x + at;
      float* dxr = a.dx + at;
      int64_t i = 0;
      for (; i + kLanes <= r.inner; i += kLanes) {
        Lanes gv, xv;
        g.at(i, gv);
        load_lanes(xr + i, xv);
        const Lanes x_hat = (xv - m) * s;
        const Lanes v = k * (gv - mean_g - x_hat * mean_gx);
        store_lanes(dxr + i, v);
      }
      for (; i < r.inner; ++i) {
        const float x_hat = (xr[i] - m) * s;
        dxr[i] = k * (g.one(i) - mean_g - x_hat * mean_gx);
      }
    }
  }
}

class BatchNormBackward final : public Kernel {
 public:
  explicit BatchNormBackward(BatchNormAttrs attrs) : attrs_(attrs) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const Tensor& x = *in[1];
    auto input = [&](size_t i) -> const float* {
      return i < in.size() && in[i] ? in[i]->data<float>() : nullptr;
    };
    const int64_t channels = x.dim(1),
                  inner = x.numel() / std::max<int64_t>(1, x.dim(0) * channels);
    const BackwardArgs a{in[0]->data<float>(),
                         input(7),
                         attrs_.relu ? input(5) : nullptr,
                         x.data<float>(),
                         in[2]->data<float>(),
                         in[3]->data<float>(),
                         in[4]->data<float>(),
                         out[0].data<float>(),
                         attrs_.dy_output ? out[3].data<float>() : nullptr,
                         out[1].data<float>(),
                         out[2].data<float>(),
                         attrs_.training,
                         {x.dim(0), inner, channels * inner}};
    split_over_threads(channels, 1, [&](int64_t c0, int64_t c1) { backward_channels(a, c0, c1); });
  }

  std::string describe() const override {
    return cat("own batch_norm_backward", attrs_.relu ? " (relu)" : "",
               attrs_.dy_output ? " writing the dy it used" : "");
  }

 private:
  BatchNormAttrs attrs_;
};

}  // namespace

Planned plan_batch_norm(const Graph& g, const Node& n) {
  const auto& a = std::get<BatchNormAttrs>(n.attrs);
  auto refuse = [](std::string why) { return Planned{nullptr, std::move(why)}; };
  if (a.sync) return refuse("a synchronized batch norm (its statistics over every rank)");
  if (!a.training) return refuse("the inference form (folded into convolutions where it can be)");
  if (n.op == OpKind::batch_norm && n.inputs.size() > 6 && n.inputs[6] != kNoValue)
    return refuse("x's statistics given by its producer (batch_stats)");
  for (ValueId v : n.inputs)
    if (v != kNoValue && g.value(v).type.dtype != DType::f32) return refuse("not all f32");
  for (ValueId v : n.outputs)
    if (g.value(v).type.dtype != DType::f32) return refuse("not all f32");
  const size_t x_input = n.op == OpKind::batch_norm ? 0 : 1;
  if (g.value(n.inputs[x_input]).type.shape.size() < 2) return refuse("x of rank < 2");
  if (n.op == OpKind::batch_norm) {
    const bool residual = n.inputs.size() > 5 && n.inputs[5] != kNoValue;
    return {std::make_unique<BatchNormForward>(a, residual), ""};
  }
  return {std::make_unique<BatchNormBackward>(a), ""};
}

}  // namespace fusebox::cpu_fast
