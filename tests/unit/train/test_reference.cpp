// Training sessions against a hand-rolled reference: a linear classifier (gemm +
// cross_entropy) trained for 3 steps with SGD (PyTorch semantics, momentum, dampening,
// nesterov, weight decay) and AdamW, computed here in double.
#include <cmath>
#include <vector>

#include "train_test_util.h"

namespace fusebox::testing {
namespace {

constexpr int64_t kBatch = 4, kFeatures = 5, kClasses = 3;

// The linear model's state in double, and one step of its gradient.
struct Linear {
  std::vector<double> w, b;  // [C, D], [C]

  explicit Linear(const Graph& g)
      : w(g.constant(*g.find_value("fc.weight"))->to_doubles()),
        b(g.constant(*g.find_value("fc.bias"))->to_doubles()) {}

  // Mean cross-entropy over the batch; fills dw, db.
  double loss_and_grad(const Tensor& x, const Tensor& y, std::vector<double>* dw,
                       std::vector<double>* db) const {
    dw->assign(w.size(), 0.0);
    db->assign(b.size(), 0.0);
    double loss = 0;
    for (int64_t n = 0; n < kBatch; ++n) {
      std::vector<double> logits(kClasses);
      double max = -1e300;
      for (int64_t c = 0; c < kClasses; ++c) {
        logits[size_t(c)] = b[size_t(c)];
        for (int64_t d = 0; d < kFeatures; ++d)
          logits[size_t(c)] += w[size_t(c * kFeatures + d)] * x.get(n * kFeatures + d);
        max = std::max(max, logits[size_t(c)]);
      }
      double sum = 0;
      for (double l : logits) sum += std::exp(l - max);
      const int64_t label = int64_t(y.get(n));
      loss -= logits[size_t(label)] - max - std::log(sum);
      for (int64_t c = 0; c < kClasses; ++c) {
        const double dlogit =
            (std::exp(logits[size_t(c)] - max) / sum - (c == label ? 1.0 : 0.0)) / kBatch;
        (*db)[size_t(c)] += dlogit;
        for (int64_t d = 0; d < kFeatures; ++d)
          (*dw)[size_t(c * kFeatures + d)] += dlogit * x.get(n * kFeatures + d);
      }
    }
    return loss / kBatch;
  }
};

// torch.optim.SGD.step for one tensor.
void sgd_reference(const SgdOptions& o, bool first, const std::vector<double>& grad,
                   std::vector<double>* p, std::vector<double>* buf) {
  for (size_t i = 0; i < p->size(); ++i) {
    double g = grad[i] + o.weight_decay * (*p)[i];
    if (o.momentum != 0) {
      (*buf)[i] = first ? g : o.momentum * (*buf)[i] + (1 - o.dampening) * g;
      g = o.nesterov ? g + o.momentum * (*buf)[i] : (*buf)[i];
    }
    (*p)[i] -= o.lr * g;
  }
}

// torch.optim.AdamW.step for one tensor; `step` counts from 1.
void adamw_reference(const AdamWOptions& o, int step, const std::vector<double>& grad,
                     std::vector<double>* p, std::vector<double>* m, std::vector<double>* v) {
  for (size_t i = 0; i < p->size(); ++i) {
    (*p)[i] *= 1 - o.lr * o.weight_decay;
    (*m)[i] = o.beta1 * (*m)[i] + (1 - o.beta1) * grad[i];
    (*v)[i] = o.beta2 * (*v)[i] + (1 - o.beta2) * grad[i] * grad[i];
    const double m_hat = (*m)[i] / (1 - std::pow(o.beta1, step));
    const double v_hat = (*v)[i] / (1 - std::pow(o.beta2, step));
    (*p)[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
  }
}

Tensor as_f32(const std::vector<double>& v, const Shape& shape) {
  return Tensor::from_doubles(DType::f32, shape, v);
}

struct Batch {
  Tensor x, y;
};
Batch batch(int step) {
  return {random_tensor(DType::f32, {kBatch, kFeatures}, 100 + uint64_t(step), -2, 2),
          random_tensor(DType::i64, {kBatch}, 200 + uint64_t(step), 0, kClasses)};
}

// Runs 3 steps of the session and of the reference (via `update`), comparing the loss
// and the parameters after each step.
template <class Update>
void check_three_steps(const OptimizerSpec& spec, Update update) {
  Graph model = linear_model(kBatch, kFeatures, kClasses, 7);
  TrainingSession session(model, LossSpec{}, spec);
  Linear ref(model);
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(cat(optimizer_name(spec), " step ", step));
    Batch data = batch(step);
    std::vector<double> dw, db;
    const double ref_loss = ref.loss_and_grad(data.x, data.y, &dw, &db);
    const float loss = session.step({{"x", data.x}, {"labels", data.y}});
    EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss) + 1e-6);
    update(step, dw, db, &ref);
    EXPECT_TRUE(all_close(session.parameters().at("fc.weight"),
                          as_f32(ref.w, {kClasses, kFeatures}), 1e-5, 1e-6));
    EXPECT_TRUE(
        all_close(session.parameters().at("fc.bias"), as_f32(ref.b, {kClasses}), 1e-5, 1e-6));
  }
  EXPECT_EQ(session.step_count(), 3);
}

TEST(TrainReference, SgdPlain) {
  const SgdOptions o{.lr = 0.3};
  check_three_steps(o, [&](int, const auto& dw, const auto& db, Linear* ref) {
    std::vector<double> none;
    sgd_reference(o, false, dw, &ref->w, &none);
    sgd_reference(o, false, db, &ref->b, &none);
  });
}

// Dampening differs from PyTorch's first step unless the session runs its undamped
// first-step graph.
TEST(TrainReference, SgdMomentumDampeningWeightDecay) {
  const SgdOptions o{.lr = 0.2, .momentum = 0.9, .dampening = 0.3, .weight_decay = 0.05};
  std::vector<double> buf_w(kClasses * kFeatures), buf_b(kClasses);
  check_three_steps(o, [&](int step, const auto& dw, const auto& db, Linear* ref) {
    sgd_reference(o, step == 1, dw, &ref->w, &buf_w);
    sgd_reference(o, step == 1, db, &ref->b, &buf_b);
  });
}

TEST(TrainReference, SgdNesterov) {
  const SgdOptions o{.lr = 0.1, .momentum = 0.8, .weight_decay = 0.01, .nesterov = true};
  std::vector<double> buf_w(kClasses * kFeatures), buf_b(kClasses);
  check_three_steps(o, [&](int step, const auto& dw, const auto& db, Linear* ref) {
    sgd_reference(o, step == 1, dw, &ref->w, &buf_w);
    sgd_reference(o, step == 1, db, &ref->b, &buf_b);
  });
}

TEST(TrainReference, AdamW) {
  const AdamWOptions o{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  std::vector<double> m_w(kClasses * kFeatures), v_w(m_w.size()), m_b(kClasses), v_b(kClasses);
  check_three_steps(o, [&](int step, const auto& dw, const auto& db, Linear* ref) {
    adamw_reference(o, step, dw, &ref->w, &m_w, &v_w);
    adamw_reference(o, step, db, &ref->b, &m_b, &v_b);
  });
}

// set_lr takes effect on the next step (lr is a graph input, not baked in).
TEST(TrainReference, SetLrChangesTheNextStep) {
  Graph model = linear_model(kBatch, kFeatures, kClasses, 7);
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.3});
  Linear ref(model);
  Batch data = batch(1);
  std::vector<double> dw, db, none;
  ref.loss_and_grad(data.x, data.y, &dw, &db);
  session.set_lr(0.0);
  EXPECT_EQ(session.lr(), 0.0);
  session.step({{"x", data.x}, {"labels", data.y}});
  EXPECT_TRUE(same_bits(session.parameters().at("fc.weight"),
                        *model.constant(*model.find_value("fc.weight"))));
  session.set_lr(0.7);
  session.step({{"x", data.x}, {"labels", data.y}});
  sgd_reference(SgdOptions{.lr = 0.7}, false, dw, &ref.w, &none);
  EXPECT_TRUE(all_close(session.parameters().at("fc.weight"), as_f32(ref.w, {kClasses, kFeatures}),
                        1e-5, 1e-6));
  EXPECT_THROW(session.set_lr(-1), Error);
  EXPECT_THROW(session.set_lr(std::nan("")), Error);
}

}  // namespace
}  // namespace fusebox::testing
