// Gradient checks for the backward kernels: central finite differences of the
// FORWARD op (run on the CPU backend in f64) against the backward op's output.
//
// For a forward op f and a fixed random weight w shaped like f's output, the scalar
// L(inputs) = sum(f(inputs)[output] * w) has dL/d(input k) = backward(dy = w, ...). Each
// element is perturbed by +-h:
//   dL/dx[i] ~ (L(x + h e_i) - L(x - h e_i)) / (2h),
// whose error is O(h^2 f''') + O(eps |L| / h): with h = 1e-6 and |L| ~ 10, about 1e-9.
// Hence the tolerance rtol 1e-6, atol 1e-7. Inputs must keep every element at least
// h away from a kink of f (relu at 0, clip at its bounds, a tie of max / max_pool).
#pragma once

#include <functional>
#include <vector>

#include "ops_test_util.h"

namespace fusebox::testing {

constexpr double kFdStep = 1e-6;
constexpr double kFdRtol = 1e-6;
constexpr double kFdAtol = 1e-7;

// sum(a * b) over equal-shaped tensors, in f64.
inline double dot(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double s = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.get(i) * b.get(i);
  return s;
}

// dL/d(inputs[wrt]) for L = sum(forward(inputs)[output] * weight), by central differences.
inline Tensor numeric_gradient(OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs,
                               size_t wrt, const Tensor& weight, size_t output = 0,
                               double h = kFdStep) {
  Tensor grad = Tensor::zeros(DType::f64, inputs[wrt].shape());
  auto loss = [&](const Tensor& perturbed) {
    std::vector<Tensor> in = inputs;
    in[wrt] = perturbed;
    return dot(run_op(op, attrs, in).at(output), weight);
  };
  for (int64_t i = 0; i < grad.numel(); ++i) {
    Tensor plus = inputs[wrt].clone(), minus = inputs[wrt].clone();
    plus.set(i, inputs[wrt].get(i) + h);
    minus.set(i, inputs[wrt].get(i) - h);
    grad.set(i, (loss(plus) - loss(minus)) / (2 * h));
  }
  return grad;
}

// The gradient check itself: `analytic` against the numeric gradient.
inline ::testing::AssertionResult matches_numeric(const Tensor& analytic, OpKind op,
                                                  const Attrs& attrs,
                                                  const std::vector<Tensor>& inputs, size_t wrt,
                                                  const Tensor& weight, size_t output = 0) {
  return all_close(analytic, numeric_gradient(op, attrs, inputs, wrt, weight, output), kFdRtol,
                   kFdAtol);
}

// `t` (at a broadcast shape) summed down to `to`, which broadcasts to t's shape.
inline Tensor sum_to(const Tensor& t, const Shape& to) {
  Tensor out = Tensor::zeros(t.dtype(), to);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t j = broadcast_index(unravel(i, t.shape()), to);
    out.set(j, out.get(j) + t.get(i));
  }
  return out;
}

// Uniform values in [lo, hi) whose magnitude is at least `gap` (no element near 0).
inline Tensor away_from_zero(const Shape& shape, uint64_t seed, double lo, double hi, double gap) {
  Tensor t = random_tensor(DType::f64, shape, seed, lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.get(i);
    if (std::fabs(v) < gap) t.set(i, v < 0 ? v - gap : v + gap);
  }
  return t;
}

// Distinct values: a shuffled ramp lo, lo + step, ... plus a little noise below step / 4,
// so that no two elements are within step / 2 of each other (no ties for max / max_pool).
inline Tensor distinct_values(const Shape& shape, uint64_t seed, double lo = -1.0,
                              double step = 0.01) {
  Tensor t = Tensor::empty(DType::f64, shape);
  std::vector<int64_t> order(size_t(t.numel()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_real_distribution<double> noise(0.0, step / 4);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.set(i, lo + step * double(order[size_t(i)]) + noise(rng));
  return t;
}

}  // namespace fusebox::testing
