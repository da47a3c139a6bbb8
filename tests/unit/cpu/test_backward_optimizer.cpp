// sgd_update and adamw_update against a direct re-implementation of PyTorch's update
// loops (torch.optim.SGD / AdamW, single-tensor path) over 5 steps, with lr changing
// per step and step counting 1..5, in f32 and f64. The re-implementation computes in
// the parameter's type with the hyper-parameters cast to it, as PyTorch's kernels do.
#include <cmath>
#include <cstring>

#include "gradient_check.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cpu::test {
namespace {

using namespace fusebox::testing;

constexpr int kSteps = 5;
const Shape kShape = {3, 5};

// lr for step t (1-based): a schedule, rounded to f32 as the lr input is.
double lr_at(int t) {
  return double(float(0.05 / t + 0.01));
}

// f64 results agree to rounding; f32 ones to a few ulps (the two may order or fuse
// the same operations differently).
Tolerance optimizer_tolerance(DType t) {
  return t == DType::f64 ? Tolerance{1e-12, 1e-14} : Tolerance{2e-6, 1e-7};
}

template <class R>
std::vector<R> values(const Tensor& t) {
  std::vector<R> out;
  for (double v : t.to_doubles()) out.push_back(R(v));
  return out;
}

template <class R>
Tensor tensor(DType t, const std::vector<R>& v) {
  return Tensor::from_doubles(t, kShape, std::vector<double>(v.begin(), v.end()));
}

// torch.optim.SGD's _single_tensor_sgd for one parameter and one step.
template <class R>
void torch_sgd_step(std::vector<R>& param, const std::vector<R>& grad, std::vector<R>& buf,
                    bool& has_buf, double lr, const SgdAttrs& a) {
  for (size_t i = 0; i < param.size(); ++i) {
    R d = grad[i];
    if (a.weight_decay != 0) d = d + R(a.weight_decay) * param[i];
    if (a.momentum != 0) {
      if (!has_buf)
        buf[i] = d;  // torch.clone(d_p)
      else
        buf[i] = buf[i] * R(a.momentum) + R(1 - a.dampening) * d;
      d = a.nesterov ? d + R(a.momentum) * buf[i] : buf[i];
    }
    param[i] = param[i] + R(-lr) * d;
  }
  has_buf = true;
}

template <class R>
void check_sgd(DType t, const SgdAttrs& attrs, uint64_t seed) {
  std::vector<R> param = values<R>(random_tensor(t, kShape, seed));
  std::vector<R> buf(param.size(), R(0)), ref_param = param, ref_buf = buf;
  bool has_buf = false;
  for (int step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(cat("step ", step));
    const std::vector<R> grad = values<R>(random_tensor(t, kShape, seed + 10 * step));
    const double lr = lr_at(step);
    torch_sgd_step(ref_param, grad, ref_buf, has_buf, lr, attrs);
    // The caller's first step: buf starts at 0 and dampening is 0 (ops.h).
    SgdAttrs a = attrs;
    if (step == 1) a.dampening = 0;
    const std::vector<Tensor> out =
        run_op(OpKind::sgd_update, a,
               {tensor(t, param), tensor(t, grad), tensor(t, buf), Tensor::scalar(DType::f32, lr)});
    ASSERT_EQ(out.size(), 2u);
    const Tolerance tol = optimizer_tolerance(t);
    ASSERT_TRUE(all_close(out[0], tensor(t, ref_param), tol.rtol, tol.atol)) << "param";
    if (attrs.momentum != 0) {
      ASSERT_TRUE(all_close(out[1], tensor(t, ref_buf), tol.rtol, tol.atol)) << "momentum_buf";
    }
    param = values<R>(out[0]);
    buf = values<R>(out[1]);
  }
}

const std::vector<SgdAttrs> kSgdCases = {
    {.momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
    {.momentum = 0.9, .weight_decay = 0.05, .nesterov = true},
    {.weight_decay = 0.1},  // plain SGD with weight decay
    {.momentum = 0.5, .dampening = 0.5},
    {},
};

TEST(SgdUpdate, MatchesPyTorchOverFiveStepsF64) {
  uint64_t seed = 10;
  for (const SgdAttrs& a : kSgdCases) {
    SCOPED_TRACE(cat("momentum ", a.momentum, " dampening ", a.dampening, " weight_decay ",
                     a.weight_decay, " nesterov ", a.nesterov));
    check_sgd<double>(DType::f64, a, seed += 100);
  }
}

TEST(SgdUpdate, MatchesPyTorchOverFiveStepsF32) {
  uint64_t seed = 20;
  for (const SgdAttrs& a : kSgdCases) {
    SCOPED_TRACE(cat("momentum ", a.momentum, " dampening ", a.dampening, " weight_decay ",
                     a.weight_decay, " nesterov ", a.nesterov));
    check_sgd<float>(DType::f32, a, seed += 100);
  }
}

// Plain SGD by hand: param - lr * (grad + wd * param).
TEST(SgdUpdate, OneStepByHand) {
  const std::vector<Tensor> out =
      run_op(OpKind::sgd_update, SgdAttrs{.weight_decay = 0.5},
             {Tensor::from_vector<double>({2}, {1, -2}), Tensor::from_vector<double>({2}, {4, 8}),
              Tensor::zeros(DType::f64, {2}), Tensor::scalar(DType::f32, 0.25)});
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{1 - 0.25 * 4.5, -2 - 0.25 * 7}));
}

// torch.optim.AdamW's _single_tensor_adamw (not capturable, not amsgrad) for one step.
template <class R>
void torch_adamw_step(std::vector<R>& param, const std::vector<R>& grad, std::vector<R>& m,
                      std::vector<R>& v, double lr, int step, const AdamWAttrs& a) {
  const double bias_correction1 = 1 - std::pow(a.beta1, step);
  const double bias_correction2 = 1 - std::pow(a.beta2, step);
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < param.size(); ++i) {
    param[i] = param[i] * R(1 - lr * a.weight_decay);
    m[i] = m[i] + R(1 - a.beta1) * (grad[i] - m[i]);  // lerp_(grad, 1 - beta1)
    v[i] = v[i] * R(a.beta2) + R(1 - a.beta2) * grad[i] * grad[i];
    const R denom = std::sqrt(v[i]) / R(bias_correction2_sqrt) + R(a.epsilon);
    param[i] = param[i] + R(-step_size) * (m[i] / denom);
  }
}

template <class R>
void check_adamw(DType t, const AdamWAttrs& attrs, uint64_t seed) {
  std::vector<R> param = values<R>(random_tensor(t, kShape, seed));
  std::vector<R> m(param.size(), R(0)), v = m;
  std::vector<R> ref_param = param, ref_m = m, ref_v = v;
  for (int step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(cat("step ", step));
    const std::vector<R> grad = values<R>(random_tensor(t, kShape, seed + 10 * step, -2, 2));
    const double lr = lr_at(step);
    torch_adamw_step(ref_param, grad, ref_m, ref_v, lr, step, attrs);
    const std::vector<Tensor> out =
        run_op(OpKind::adamw_update, attrs,
               {tensor(t, param), tensor(t, grad), tensor(t, m), tensor(t, v),
                Tensor::scalar(DType::f32, lr), Tensor::scalar(DType::i64, step)});
    ASSERT_EQ(out.size(), 3u);
    const Tolerance tol = optimizer_tolerance(t);
    ASSERT_TRUE(all_close(out[0], tensor(t, ref_param), tol.rtol, tol.atol)) << "param";
    ASSERT_TRUE(all_close(out[1], tensor(t, ref_m), tol.rtol, tol.atol)) << "m";
    ASSERT_TRUE(all_close(out[2], tensor(t, ref_v), tol.rtol, tol.atol)) << "v";
    param = values<R>(out[0]);
    m = values<R>(out[1]);
    v = values<R>(out[2]);
  }
}

const std::vector<AdamWAttrs> kAdamWCases = {
    {},
    {.beta1 = 0.8, .beta2 = 0.99, .epsilon = 1e-6, .weight_decay = 0.1},
    {.weight_decay = 0},
};

TEST(AdamWUpdate, MatchesPyTorchOverFiveSteps) {
  uint64_t seed = 30;
  for (const AdamWAttrs& a : kAdamWCases) {
    SCOPED_TRACE(cat("beta1 ", a.beta1, " beta2 ", a.beta2, " eps ", a.epsilon, " weight_decay ",
                     a.weight_decay));
    {
      SCOPED_TRACE("f64");
      check_adamw<double>(DType::f64, a, seed += 100);
    }
    {
      SCOPED_TRACE("f32");
      check_adamw<float>(DType::f32, a, seed += 100);
    }
  }
}

// The first step moves every parameter by about lr * sign(grad) (m/sqrt(v) = sign(grad)
// after bias correction), after the decoupled weight decay.
TEST(AdamWUpdate, FirstStepIsSignedLr) {
  const std::vector<Tensor> out =
      run_op(OpKind::adamw_update, AdamWAttrs{.epsilon = 0, .weight_decay = 0.5},
             {Tensor::from_vector<double>({3}, {1, 2, 3}),
              Tensor::from_vector<double>({3}, {0.1, -7, 300}), Tensor::zeros(DType::f64, {3}),
              Tensor::zeros(DType::f64, {3}), Tensor::scalar(DType::f32, 0.125),
              Tensor::scalar(DType::i32, 1)});
  const double decay = 1 - 0.125 * 0.5;
  EXPECT_TRUE(
      close_to(out[0], DType::f64, {3}, {1 * decay - 0.125, 2 * decay + 0.125, 3 * decay - 0.125}));
}

TEST(AdamWUpdate, StepMustBePositive) {
  const Tensor p = Tensor::zeros(DType::f32, {2});
  try {
    run_op(OpKind::adamw_update, AdamWAttrs{},
           {p, p, p, p, Tensor::scalar(DType::f32, 0.1), Tensor::scalar(DType::i64, 0)});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 0 must be >= 1"), std::string::npos) << e.what();
  }
}

// f16 / bf16 parameters update in f32 and round once: the f32 kernel on the same values.
TEST(OptimizerUpdate, HalfPrecisionFollowsF32) {
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<Tensor> in;
    for (uint64_t k = 0; k < 4; ++k) in.push_back(random_tensor(t, kShape, 40 + k, 0, 1));
    const Tensor lr = Tensor::scalar(DType::f32, 0.01), step = Tensor::scalar(DType::i64, 3);
    auto f32 = [](const std::vector<Tensor>& v) {
      std::vector<Tensor> out;
      for (const Tensor& x : v)
        out.push_back(x.dtype() == DType::f32 || x.dtype() == DType::i64 ? x : x.cast(DType::f32));
      return out;
    };
    std::vector<Tensor> adam_in = {in[0], in[1], in[2], in[3], lr, step};
    std::vector<Tensor> got = run_op(OpKind::adamw_update, AdamWAttrs{}, adam_in);
    std::vector<Tensor> want = run_op(OpKind::adamw_update, AdamWAttrs{}, f32(adam_in));
    for (size_t k = 0; k < 3; ++k)
      EXPECT_TRUE(close_to(got[k], t, kShape, want[k].to_doubles())) << k;
    std::vector<Tensor> sgd_in = {in[0], in[1], in[2], lr};
    const SgdAttrs sgd{.momentum = 0.9, .weight_decay = 0.1};
    got = run_op(OpKind::sgd_update, sgd, sgd_in);
    want = run_op(OpKind::sgd_update, sgd, f32(sgd_in));
    for (size_t k = 0; k < 2; ++k)
      EXPECT_TRUE(close_to(got[k], t, kShape, want[k].to_doubles())) << k;
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Mixed precision's form (ops.h low_param): an f32 param with a bf16 / f16 gradient updates as
// with the gradient widened (exact), and the low copy is the new param rounded as cast rounds;
// a skipped update's copy is the param's. A low gradient or copy beside a low param, or an f32
// copy, is refused, naming the input.
TEST(OptimizerUpdate, LowGradientAndCopyFollowTheCasts) {
  const Tensor lr = Tensor::scalar(DType::f32, 0.01), step = Tensor::scalar(DType::i64, 3);
  const Tensor none;
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    const Tensor p = random_tensor(DType::f32, kShape, 50, -1, 1);
    const Tensor g = random_tensor(low, kShape, 51, -1, 1);
    const Tensor m = random_tensor(DType::f32, kShape, 52, -1, 1);
    const Tensor v = random_tensor(DType::f32, kShape, 53, 0, 1);
    const Tensor copy = Tensor::zeros(low, kShape);
    const Tensor wide = g.cast(DType::f32);
    std::vector<Tensor> got =
        run_op(OpKind::adamw_update, AdamWAttrs{}, {p, g, m, v, lr, step, none, none, copy});
    std::vector<Tensor> want =
        run_op(OpKind::adamw_update, AdamWAttrs{}, {p, wide, m, v, lr, step});
    ASSERT_EQ(got.size(), 4u);
    for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(same_bits(got[k], want[k])) << k;
    EXPECT_TRUE(same_bits(got[3], want[0].cast(low)));
    const SgdAttrs sgd{.momentum = 0.9, .weight_decay = 0.1};
    got = run_op(OpKind::sgd_update, sgd, {p, g, m, lr, none, none, copy});
    want = run_op(OpKind::sgd_update, sgd, {p, wide, m, lr});
    ASSERT_EQ(got.size(), 3u);
    for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(same_bits(got[k], want[k])) << k;
    EXPECT_TRUE(same_bits(got[2], want[0].cast(low)));
    // Skipped (f16 loss scaling found an infinity): the copy is the param's, rounded.
    got = run_op(OpKind::sgd_update, sgd,
                 {p, g, m, lr, Tensor::scalar(DType::f32, 1), Tensor::scalar(DType::f32, 1), copy});
    EXPECT_TRUE(same_bits(got[0], p));
    EXPECT_TRUE(same_bits(got[2], p.cast(low)));
  }
  const Tensor p16 = random_tensor(DType::bf16, kShape, 54, -1, 1);
  auto refused = [&](std::vector<Tensor> in, const std::string& needle) {
    try {
      run_op(OpKind::sgd_update, SgdAttrs{}, in);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const Tensor p32 = random_tensor(DType::f32, kShape, 55, -1, 1);
  refused({p16, p16.cast(DType::f16), p16, lr}, "grad");
  refused({p32, p32, p32, lr, none, none, p32}, "low_param");
  refused({p16, p16, p16, lr, none, none, p16}, "low_param");
}

}  // namespace
}  // namespace fusebox::cpu::test
