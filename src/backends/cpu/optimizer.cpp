// Optimizer updates, one parameter tensor per node, PyTorch's update loops (ops.h).
//
// Per element, in compute_t of the parameter (f32 for f16/bf16, f64 for f64), with
// the scalars (1 - lr * weight_decay, 1 - beta, 1 - dampening, the bias corrections)
// computed in f64 first, as PyTorch computes them in Python floats:
//   sgd_update:   g = grad + weight_decay * param
//                 buf = momentum * buf + (1 - dampening) * g
//                 g = nesterov ? g + momentum * buf : buf      (when momentum != 0)
//                 param = param - lr * g
//   adamw_update: param = param * (1 - lr * weight_decay)
//                 m = beta1 * m + (1 - beta1) * grad
//                 v = beta2 * v + (1 - beta2) * grad^2
//                 param = param - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) +
//                 eps)
// With grad_scale, grad above is grad * grad_scale (rounded to the compute type); with a
// nonzero skip, every output is a copy of its state input. A bf16/f16 grad beside an f32 param
// is widened first (exact); with low_param, the new param rounded to its dtype is a last output.
//
// f16 loss scaling: nonfinite_any scans its inputs for infinities and NaNs;
// loss_scale_update applies GradScaler's rule (backends/common/loss_scale.h).
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>

#include "backends/common/loss_scale.h"
#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

namespace {

// A rank-0 input's value (lr, step).
double scalar_input(const Node& n, const Tensor& t, const char* role) {
  FUSEBOX_CHECK(t.numel() == 1, node_label(n), role, " must be a scalar but is ",
                shape_str(t.shape()));
  return t.get(0);
}

// The first `count` inputs and the first count - 1 outputs share param's type, but for grad's
// dtype (a low gradient beside an f32 param) and the low copy's (`low`: its input slot, whose
// output comes last; 0: none).
void check_states(const Node& n, Inputs in, size_t count, size_t low, Outputs out) {
  const Tensor& param = *in[0];
  for (size_t i = 0; i < count; ++i) {
    FUSEBOX_CHECK((i == 1 || in[i]->dtype() == param.dtype()) && in[i]->shape() == param.shape(),
                  node_label(n), "input ", i, " ", shape_str(in[i]->shape()),
                  " does not match param ", shape_str(param.shape()));
  }
  const bool has_low = low > 0 && in.size() > low && in[low] != nullptr;
  FUSEBOX_CHECK(out.size() == count - 1 + (has_low ? 1 : 0), node_label(n), "expects ",
                count - 1 + (has_low ? 1 : 0), " outputs, got ", out.size());
  for (size_t o = 0; o < out.size(); ++o) {
    const Tensor& t = out[o];
    const DType want = o + 1 < count ? param.dtype() : in[low]->dtype();
    FUSEBOX_CHECK(t.dtype() == want && t.shape() == param.shape(), node_label(n), "output ",
                  shape_str(t.shape()), " does not match param ", shape_str(param.shape()));
  }
}

// grad in param's dtype: a bf16/f16 gradient beside an f32 param widened (exact: the cast the
// low gradient replaces), in `widened`.
const Tensor& grad_as_param(Inputs in, Tensor& widened) {
  if (in[1]->dtype() == in[0]->dtype()) return *in[1];
  widened = in[1]->cast(in[0]->dtype());
  return widened;
}

// The low copy (ops.h low_param), when the update has one: new_param rounded to its dtype.
void write_low_copy(Outputs out, size_t states) {
  if (out.size() <= states - 1) return;
  const Tensor low = out[0].cast(out.back().dtype());
  std::memcpy(out.back().raw(), low.raw(), low.nbytes());
}

// The optional trailing inputs of an update, from input `first` on: grad_scale (nullopt
// when absent) and skip.
struct UpdateOptions {
  std::optional<double> grad_scale;
  bool skip = false;
};

UpdateOptions update_options(const Node& n, Inputs in, size_t first) {
  UpdateOptions o;
  if (in.size() > first && in[first] != nullptr)
    o.grad_scale = scalar_input(n, *in[first], "grad_scale");
  if (in.size() > first + 1 && in[first + 1] != nullptr)
    o.skip = scalar_input(n, *in[first + 1], "skip") != 0;  // NaN skips too
  return o;
}

// A skipped update: output i is a copy of input state_inputs[i].
void keep_states(Inputs in, Outputs out, std::initializer_list<size_t> state_inputs) {
  size_t o = 0;
  for (size_t i : state_inputs) {
    Tensor& t = out[o++];
    if (t.raw() != in[i]->raw()) std::memcpy(t.raw(), in[i]->raw(), t.nbytes());
  }
}

// grad as the update reads it: times grad_scale when there is one (rounded to C).
template <class C>
struct Unscale {
  std::optional<double> grad_scale;
  C factor = C(grad_scale.value_or(1.0));
  template <class T>
  C operator()(T grad) const {
    const C g = to_compute(grad);
    return grad_scale ? C(g * factor) : g;
  }
};

}  // namespace

// (param, grad, momentum_buf, lr, grad_scale?, skip?, low_param?) -> (new_param,
// new_momentum_buf, new_low_param?)
void sgd_update(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<SgdAttrs>(n.attrs);
  check_states(n, in, 3, 6, out);
  const double lr = scalar_input(n, *in[3], "lr");
  const UpdateOptions options = update_options(n, in, 4);
  if (options.skip) {
    keep_states(in, out, {0, 2});
    return write_low_copy(out, 3);
  }
  Tensor widened;
  const Tensor& grad_tensor = grad_as_param(in, widened);
  visit_float(n, in[0]->dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T *param = in[0]->data<T>(), *grad = grad_tensor.data<T>(), *buf = in[2]->data<T>();
    T *new_param = out[0].data<T>(), *new_buf = out[1].data<T>();
    const C rate = C(lr), momentum = C(a.momentum), keep = C(1.0 - a.dampening);
    const C decay = C(a.weight_decay);
    const bool use_momentum = a.momentum != 0.0;
    const Unscale<C> unscale{options.grad_scale};
    parallel_for(in[0]->numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const C p = to_compute(param[i]);
        C g = unscale(grad[i]) + decay * p;
        const C b = momentum * to_compute(buf[i]) + keep * g;
        if (use_momentum) g = a.nesterov ? g + momentum * b : b;
        new_param[i] = convert<T>(p - rate * g);
        new_buf[i] = convert<T>(b);
      }
    });
  });
  write_low_copy(out, 3);
}

// (param, grad, m, v, lr, step, grad_scale?, skip?, low_param?) -> (new_param, new_m, new_v,
// new_low_param?)
void adamw_update(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<AdamWAttrs>(n.attrs);
  check_states(n, in, 4, 8, out);
  const double lr = scalar_input(n, *in[4], "lr");
  const double step = scalar_input(n, *in[5], "step");
  FUSEBOX_CHECK(step >= 1, node_label(n), "step ", step, " must be >= 1 (it counts from 1)");
  const UpdateOptions options = update_options(n, in, 6);
  if (options.skip) {
    keep_states(in, out, {0, 2, 3});
    return write_low_copy(out, 4);
  }
  Tensor widened;
  const Tensor& grad_tensor = grad_as_param(in, widened);
  const double decay_factor = 1.0 - lr * a.weight_decay;
  const double step_size = lr / (1.0 - std::pow(a.beta1, step));
  const double correction2_sqrt = std::sqrt(1.0 - std::pow(a.beta2, step));
  visit_float(n, in[0]->dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T *param = in[0]->data<T>(), *grad = grad_tensor.data<T>();
    const T *m_in = in[2]->data<T>(), *v_in = in[3]->data<T>();
    T *new_param = out[0].data<T>(), *m_out = out[1].data<T>(), *v_out = out[2].data<T>();
    // 1 - beta in f64 first: 1 - 0.999f is 4.7e-5 off 0.001 in relative terms.
    const C b1 = C(a.beta1), b2 = C(a.beta2), eps = C(a.epsilon), decay = C(decay_factor);
    const C one_minus_b1 = C(1.0 - a.beta1), one_minus_b2 = C(1.0 - a.beta2);
    const C size = C(step_size), c2 = C(correction2_sqrt);
    const Unscale<C> unscale{options.grad_scale};
    parallel_for(in[0]->numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const C g = unscale(grad[i]);
        const C m = b1 * to_compute(m_in[i]) + one_minus_b1 * g;
        const C v = b2 * to_compute(v_in[i]) + one_minus_b2 * g * g;
        const C p = to_compute(param[i]) * decay;
        new_param[i] = convert<T>(p - size * m / (std::sqrt(v) / c2 + eps));
        m_out[i] = convert<T>(m);
        v_out[i] = convert<T>(v);
      }
    });
  });
  write_low_copy(out, 4);
}

// (x1, ..., xn) -> f32 []: 1 when some element is an infinity or a NaN, else 0.
void nonfinite_any(const Node& n, Inputs in, Outputs out) {
  std::atomic<bool> found{false};
  for (const Tensor* t : in) {
    visit_float(n, t->dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* x = t->data<T>();
      parallel_for(t->numel(), kGrain, [&](int64_t begin, int64_t end) {
        if (found.load(std::memory_order_relaxed)) return;
        bool any = false;
        for (int64_t i = begin; i < end; ++i) any = any || !std::isfinite(to_compute(x[i]));
        if (any) found.store(true, std::memory_order_relaxed);
      });
    });
    if (found.load()) break;
  }
  out[0].set(0, found.load() ? 1.0 : 0.0);
}

// (scale, growth_tracker, found_inf, skipped?) -> (new_scale, new_growth_tracker,
// new_skipped?)
void loss_scale_update(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<LossScaleAttrs>(n.attrs);
  const double scale = scalar_input(n, *in[0], "scale");
  const bool found = scalar_input(n, *in[2], "found_inf") != 0;
  const bool counts = in.size() > 3 && in[3] != nullptr;
  const LossScaleStep next =
      loss_scale_step(found, int64_t(scalar_input(n, *in[1], "growth_tracker")),
                      counts ? int64_t(scalar_input(n, *in[3], "skipped")) : 0, a.growth_factor,
                      a.backoff_factor, a.growth_interval);
  out[0].set(0, scale * next.factor);  // rounded to scale's dtype
  if (!std::isfinite(out[0].get(0))) out[0].set(0, scale);
  out[1].set(0, double(next.growth_tracker));
  if (counts) out[2].set(0, double(next.skipped));
}

}  // namespace fusebox::cpu
