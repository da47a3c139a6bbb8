// The SGD and AdamW updates on the fast CPU path (a training step's one node per parameter
// tensor): the reference kernels' formulas (backends/cpu/optimizer.cpp, PyTorch's),
//   sgd:   g = grad + weight_decay * param; buf = momentum * buf + (1 - dampening) * g
//          g = nesterov ? g + momentum * buf : buf (momentum != 0); param -= lr * g
//   adamw: param *= 1 - lr * weight_decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
//          param -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
// (the scalars in f64 first, as the reference), 16 lanes a step in f32 over the threads. The
// reference's element loop does not vectorise in the baseline build (its pointers may alias: the
// updates write in place), and was a fifth of ResNet-18's CPU training step. The values may differ
// from the reference's by the fused multiply-adds the vector clones contract (within the tests'
// tolerance). The plain forms only: f32 state, no loss scale, skip or low copy (those run on the
// reference kernels).
#include <algorithm>
#include <cmath>

#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/lanes.h"
#include "backends/cpu_fast/threads.h"

namespace fusebox::cpu_fast {
namespace {

struct SgdArgs {
  const float *param, *grad, *buf;
  float *new_param, *new_buf;
  float rate, momentum, keep, decay;
  bool use_momentum, nesterov;
};

// Elements [first, last): each read before its outputs are written (they may be its inputs'
// bytes: the step updates its state in place).
FUSEBOX_LANES_CLONES void sgd_range(const SgdArgs& a, int64_t first, int64_t last) {
  int64_t i = first;
  for (; i + kLanes <= last; i += kLanes) {
    Lanes p, g, b;
    load_lanes(a.param + i, p);
    load_lanes(a.grad + i, g);
    load_lanes(a.buf + i, b);
    g += a.decay * p;
    b = a.momentum * b + a.keep * g;
    if (a.use_momentum) g = a.nesterov ? g + a.momentum * b : b;
    p -= a.rate * g;
    store_lanes(a.new_param + i, p);
    store_lanes(a.new_buf + i, b);
  }
  for (; i < last; ++i) {
    const float p = a.param[i];
    float g = a.grad[i] + a.decay * p;
    const float b = a.momentum * a.buf[i] + a.keep * g;
    if (a.use_momentum) g = a.nesterov ? g + a.momentum * b : b;
    a.new_param[i] = p - a.rate * g;
    a.new_buf[i] = b;
  }
}

struct AdamWArgs {
  const float *param, *grad, *m, *v;
  float *new_param, *new_m, *new_v;
  float b1, b2, one_minus_b1, one_minus_b2, decay, size, c2, eps;
};

FUSEBOX_LANES_CLONES void adamw_range(const AdamWArgs& a, int64_t first, int64_t last) {
  int64_t i = first;
  for (; i + kLanes <= last; i += kLanes) {
    Lanes p, g, m, v, root;
    load_lanes(a.param + i, p);
    load_lanes(a.grad + i, g);
    load_lanes(a.m + i, m);
    load_lanes(a.v + i, v);
    m = a.b1 * m + a.one_minus_b1 * g;
    v = a.b2 * v + a.one_minus_b2 * g * g;
    for (int64_t l = 0; l < kLanes; ++l) root[l] = std::sqrt(v[l]);  // one vector sqrt
    p = p * a.decay - a.size * m / (root / a.c2 + a.eps);
    store_lanes(a.new_param + i, p);
    store_lanes(a.new_m + i, m);
    store_lanes(a.new_v + i, v);
  }
  for (; i < last; ++i) {
    const float g = a.grad[i];
    const float m = a.b1 * a.m[i] + a.one_minus_b1 * g;
    const float v = a.b2 * a.v[i] + a.one_minus_b2 * g * g;
    a.new_param[i] = a.param[i] * a.decay - a.size * m / (std::sqrt(v) / a.c2 + a.eps);
    a.new_m[i] = m;
    a.new_v[i] = v;
  }
}

// Runs range(first, last) over `total` elements in chunks of whole vector steps (only the last
// chunk has a remainder), split over the threads.
template <class Range>
void over_threads(int64_t total, Range range) {
  const int64_t steps = (total + kLanes - 1) / kLanes;
  split_over_threads(steps, 4096, [&](int64_t s0, int64_t s1) {
    range(s0 * kLanes, std::min(total, s1 * kLanes));
  });
}

float scalar(const Tensor& t, const char* role) {
  FUSEBOX_CHECK(t.numel() == 1, "optimizer update", role, " must be a scalar but is ",
                shape_str(t.shape()));
  return float(t.get(0));
}

class SgdKernel final : public Kernel {
 public:
  explicit SgdKernel(SgdAttrs attrs) : attrs_(attrs) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const SgdArgs a{in[0]->data<float>(),
                    in[1]->data<float>(),
                    in[2]->data<float>(),
                    out[0].data<float>(),
                    out[1].data<float>(),
                    scalar(*in[3], "lr"),
                    float(attrs_.momentum),
                    float(1.0 - attrs_.dampening),
                    float(attrs_.weight_decay),
                    attrs_.momentum != 0.0,
                    attrs_.nesterov};
    over_threads(in[0]->numel(), [&](int64_t first, int64_t last) { sgd_range(a, first, last); });
  }

  std::string describe() const override { return "own sgd_update (16 lanes a step)"; }

 private:
  SgdAttrs attrs_;
};

class AdamWKernel final : public Kernel {
 public:
  explicit AdamWKernel(AdamWAttrs attrs) : attrs_(attrs) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const double lr = scalar(*in[4], "lr"), step = scalar(*in[5], "step");
    FUSEBOX_CHECK(step >= 1, "adamw_update", "step ", step, " must be >= 1 (it counts from 1)");
    const AdamWArgs a{in[0]->data<float>(),
                      in[1]->data<float>(),
                      in[2]->data<float>(),
                      in[3]->data<float>(),
                      out[0].data<float>(),
                      out[1].data<float>(),
                      out[2].data<float>(),
                      float(attrs_.beta1),
                      float(attrs_.beta2),
                      float(1.0 - attrs_.beta1),
                      float(1.0 - attrs_.beta2),
                      float(1.0 - lr * attrs_.weight_decay),
                      float(lr / (1.0 - std::pow(attrs_.beta1, step))),
                      float(std::sqrt(1.0 - std::pow(attrs_.beta2, step))),
                      float(attrs_.epsilon)};
    over_threads(in[0]->numel(), [&](int64_t first, int64_t last) { adamw_range(a, first, last); });
  }

  std::string describe() const override { return "own adamw_update (16 lanes a step)"; }

 private:
  AdamWAttrs attrs_;
};

}  // namespace

Planned plan_optimizer_update(const Graph& g, const Node& n) {
  auto refuse = [](std::string why) { return Planned{nullptr, std::move(why)}; };
  const bool sgd = n.op == OpKind::sgd_update;
  const size_t states = sgd ? 3 : 4, scalars = sgd ? 1 : 2;  // (param, grad, ...), lr, step
  for (size_t i = states + scalars; i < n.inputs.size(); ++i)
    if (n.inputs[i] != kNoValue)
      return refuse("a loss scale, skip or low copy (the plain form only)");
  for (size_t i = 0; i < states; ++i)
    if (g.value(n.inputs[i]).type.dtype != DType::f32) return refuse("not f32 state");
  if (sgd) return {std::make_unique<SgdKernel>(std::get<SgdAttrs>(n.attrs)), ""};
  return {std::make_unique<AdamWKernel>(std::get<AdamWAttrs>(n.attrs)), ""};
}

}  // namespace fusebox::cpu_fast
