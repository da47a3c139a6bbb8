// Gradient checks for the normalisations (batch_norm training and inference,
// layer_norm over several axes with broadcast scale / bias, rms_norm), softmax,
// log_softmax and cross_entropy.
#include "fusebox/passes/autodiff.h"
#include "gradcheck.h"

namespace fusebox::testing::gradcheck {
namespace {

Shape random_shape(std::mt19937_64& rng, int64_t rank, int64_t lo, int64_t hi) {
  Shape s;
  for (int64_t d = 0; d < rank; ++d) s.push_back(pick(rng, lo, hi));
  return s;
}

// A shape that broadcasts to `target`: some leading dims dropped, some dims set to 1.
Shape broadcastable_to(std::mt19937_64& rng, const Shape& target) {
  Shape s(target.begin() + pick(rng, 0, int64_t(target.size()) - 1), target.end());
  for (int64_t& d : s)
    if (coin(rng)) d = 1;
  return s;
}

// batch_norm, training: the loss reads y; the running statistics (inputs 3, 4) only
// feed the running-statistics outputs, so their gradients must come out zero (and the
// finite differences agree).
TEST(GradCheckNorm, BatchNormTraining) {
  std::mt19937_64 rng(201);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t rank = pick(rng, 2, 4);
    Shape x = random_shape(rng, rank, 1, 4);
    x[0] = pick(rng, 2, 3);  // at least two elements per channel
    const int64_t C = x[1];
    BatchNormAttrs a{std::uniform_real_distribution<double>(1e-5, 1e-2)(rng),
                     std::uniform_real_distribution<double>(0.5, 0.99)(rng), true};
    const uint64_t seed = 6000 + uint64_t(trial);
    std::vector<Leaf> leaves = {input("x", x, seed, -2, 2), param("scale", {C}, seed + 1),
                                param("bias", {C}, seed + 2), param("mean", {C}, seed + 3),
                                param("var", {C}, seed + 4, 0.5, 2.0)};
    const std::string config = cat("x ", shape_str(x), " eps ", a.epsilon);
    SCOPED_TRACE(config);
    Forward f = [a](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.batch_norm_training(v[0], v[1], v[2], v[3], v[4], a).at(0)};
    };
    EXPECT_TRUE(check_gradients(leaves, f, {"batch_norm (training)", config, {}, 48, seed}));
  }
}

// batch_norm, inference: every input, the running mean and variance included.
TEST(GradCheckNorm, BatchNormInference) {
  std::mt19937_64 rng(202);
  for (int trial = 0; trial < 5; ++trial) {
    const Shape x = random_shape(rng, pick(rng, 2, 4), 1, 4);
    const int64_t C = x[1];
    BatchNormAttrs a{std::uniform_real_distribution<double>(1e-5, 1e-1)(rng), 0.9, false};
    const uint64_t seed = 6100 + uint64_t(trial);
    std::vector<Leaf> leaves = {input("x", x, seed, -2, 2), param("scale", {C}, seed + 1),
                                param("bias", {C}, seed + 2), param("mean", {C}, seed + 3),
                                param("var", {C}, seed + 4, 0.5, 2.0)};
    const std::string config = cat("x ", shape_str(x), " eps ", a.epsilon);
    SCOPED_TRACE(config);
    Forward f = [a](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.batch_norm(v[0], v[1], v[2], v[3], v[4], a)};
    };
    EXPECT_TRUE(check_gradients(leaves, f, {"batch_norm (inference)", config, {}, 48, seed}));
  }
}

// Mixed precision (bf16 x, f32 parameters and statistics), training and inference forms:
// autodiff's gradients against those of the same graph in f64 on the same values (which
// BatchNormTraining / BatchNormInference check against finite differences; differences
// through bf16 would be noise). The loss weights are bf16 values, so dy is exact in both.
// dx is bf16: 2 bf16 ulps (rtol 1.6e-2); the f32 parameter gradients are sums computed in
// f64 (CPU) from the same values and rounded once: rtol 1e-4 covers the f32 saved statistics.
TEST(GradCheckNorm, BatchNormMixedPrecisionMatchesF64) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "inference");
    const Shape x_shape = {3, 4, 5};
    const uint64_t seed = training ? 6200 : 6210;
    const Tensor x = random_tensor(DType::bf16, x_shape, seed, -2, 2);
    const Tensor w = random_tensor(DType::bf16, x_shape, seed + 1);
    const std::vector<Tensor> params = {random_tensor(DType::f32, {4}, seed + 2, 0.5, 1.5),
                                        random_tensor(DType::f32, {4}, seed + 3),
                                        random_tensor(DType::f32, {4}, seed + 4),
                                        random_tensor(DType::f32, {4}, seed + 5, 0.5, 2)};
    // x and the parameters as inputs of `low` / f32 (or all f64); loss = sum(f64-or-f32(y) * w).
    auto run = [&](DType low, DType param) {
      Graph g("bn_mixed");
      Builder b(g);
      NamedTensors feeds = {{"x", x.cast(low)}};
      std::vector<ValueId> in = {g.add_input("x", low, x_shape)};
      const char* names[] = {"scale", "bias", "mean", "var"};
      for (size_t i = 0; i < 4; ++i) {
        in.push_back(g.add_input(names[i], param, {4}));
        feeds[names[i]] = params[i].cast(param);
      }
      const BatchNormAttrs a{.epsilon = 1e-3, .training = training};
      const ValueId y = training ? b.batch_norm_training(in[0], in[1], in[2], in[3], in[4], a)[0]
                                 : b.batch_norm(in[0], in[1], in[2], in[3], in[4], a);
      const ValueId loss =
          b.reduce_sum(b.mul(b.cast(y, param), b.constant(w.cast(param))), {}, false);
      std::vector<ValueId> wrt = {in[0], in[1], in[2]};
      if (!training) wrt.insert(wrt.end(), {in[3], in[4]});
      const GradResult r = grad(g, loss, wrt, {.mark_outputs = true});
      for (ValueId v : wrt) EXPECT_EQ(g.value(r.of(v)).type, g.value(v).type);
      const NamedTensors out = run_graph(g, feeds);
      std::vector<Tensor> grads;
      for (ValueId v : wrt) grads.push_back(out.at(g.value(r.of(v)).name));
      return grads;
    };
    const std::vector<Tensor> got = run(DType::bf16, DType::f32);
    const std::vector<Tensor> want = run(DType::f64, DType::f64);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(got[0].dtype(), DType::bf16);
    EXPECT_TRUE(all_close(got[0].cast(DType::f64), want[0], 1.6e-2, 1e-3)) << "dx";
    for (size_t k = 1; k < got.size(); ++k) {
      EXPECT_EQ(got[k].dtype(), DType::f32) << k;
      EXPECT_TRUE(all_close(got[k].cast(DType::f64), want[k], 1e-4, 1e-5)) << "parameter " << k;
    }
  }
}

// layer_norm / rms_norm over a random axis (several normalised dims), with scale and
// bias absent, full, or broadcasting to the normalised dims.
void check_norm(OpKind op, uint64_t rng_seed, uint64_t seed_base) {
  std::mt19937_64 rng(rng_seed);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t rank = pick(rng, 1, 4);
    const Shape x = random_shape(rng, rank, 1, 4);
    const int64_t axis = pick(rng, -rank, rank - 1);
    const Shape normalised(x.begin() + (axis < 0 ? axis + rank : axis), x.end());
    NormAttrs a{axis, std::uniform_real_distribution<double>(1e-5, 1e-2)(rng)};
    const uint64_t seed = seed_base + uint64_t(trial);
    std::vector<Leaf> leaves = {input("x", x, seed, -2, 2)};
    // scale / bias: 0 absent, 1 full, 2 broadcasting.
    const int scale_kind = int(pick(rng, 0, 2));
    const int bias_kind = op == OpKind::layer_norm ? int(pick(rng, 0, 2)) : 0;
    const auto shaped = [&](int kind) {
      return kind == 1 ? normalised : broadcastable_to(rng, normalised);
    };
    Shape scale_shape, bias_shape;
    if (scale_kind) {
      scale_shape = shaped(scale_kind);
      leaves.push_back(param("scale", scale_shape, seed + 1));
    }
    if (bias_kind) {
      bias_shape = shaped(bias_kind);
      leaves.push_back(param("bias", bias_shape, seed + 2));
    }
    const std::string config =
        cat(op_name(op), " x ", shape_str(x), " axis ", axis,
            scale_kind ? cat(" scale ", shape_str(scale_shape)) : std::string(" no scale"),
            bias_kind ? cat(" bias ", shape_str(bias_shape)) : std::string());
    SCOPED_TRACE(config);
    Forward f = [a, op, scale_kind, bias_kind](Builder& b, const std::vector<ValueId>& v) {
      const ValueId scale = scale_kind ? v[1] : kNoValue;
      const ValueId bias = bias_kind ? v[scale_kind ? 2 : 1] : kNoValue;
      return std::vector<ValueId>{op == OpKind::layer_norm ? b.layer_norm(v[0], scale, bias, a)
                                                           : b.rms_norm(v[0], scale, a)};
    };
    EXPECT_TRUE(check_gradients(leaves, f, {op_name(op), config, {}, 48, seed}));
  }
}

TEST(GradCheckNorm, LayerNorm) {
  check_norm(OpKind::layer_norm, 203, 6200);
}
TEST(GradCheckNorm, RmsNorm) {
  check_norm(OpKind::rms_norm, 204, 6300);
}

TEST(GradCheckSoftmax, SoftmaxAndLogSoftmax) {
  std::mt19937_64 rng(205);
  for (int trial = 0; trial < 10; ++trial) {
    const OpKind op = trial % 2 ? OpKind::log_softmax : OpKind::softmax;
    const int64_t rank = pick(rng, 1, 4);
    const Shape x = random_shape(rng, rank, 1, 5);
    const int64_t axis = pick(rng, -rank, rank - 1);
    const uint64_t seed = 6400 + uint64_t(trial);
    const std::string config = cat(op_name(op), " x ", shape_str(x), " axis ", axis);
    SCOPED_TRACE(config);
    Forward f = [op, axis](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{op == OpKind::softmax ? b.softmax(v[0], axis)
                                                        : b.log_softmax(v[0], axis)};
    };
    EXPECT_TRUE(
        check_gradients({input("x", x, seed, -3, 3)}, f, {op_name(op), config, {}, 48, seed}));
  }
}

// attention (formed by fuse_attention, with and without lse): its gradient rule's
// attention_backward against finite differences of the f64 forward, causal and not, Tq != Tk,
// dv != d, rank 3 and 4.
TEST(GradCheckAttention, Attention) {
  std::mt19937_64 rng(207);
  for (int trial = 0; trial < 8; ++trial) {
    const bool causal = trial % 2 == 1, with_lse = trial % 4 >= 2;
    const int64_t tq = pick(rng, 1, 4), tk = causal ? tq + pick(rng, 0, 2) : pick(rng, 1, 5);
    const int64_t d = pick(rng, 1, 4), dv = pick(rng, 1, 4);
    Shape lead = {pick(rng, 1, 2)};
    if (trial % 3 != 0) lead.push_back(pick(rng, 1, 2));
    auto shaped = [&](int64_t t, int64_t c) {
      Shape s = lead;
      s.push_back(t);
      s.push_back(c);
      return s;
    };
    const AttentionAttrs attrs{0.7, causal, with_lse};
    const uint64_t seed = 6500 + 10 * uint64_t(trial);
    const std::string config = cat("q ", shape_str(shaped(tq, d)), " k ", shape_str(shaped(tk, d)),
                                   " dv ", dv, causal ? " causal" : "", with_lse ? " lse" : "");
    SCOPED_TRACE(config);
    Forward f = [attrs](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.op(OpKind::attention, attrs, {v[0], v[1], v[2]}).at(0)};
    };
    EXPECT_TRUE(check_gradients(
        {input("q", shaped(tq, d), seed, -2, 2), input("k", shaped(tk, d), seed + 1, -2, 2),
         input("v", shaped(tk, dv), seed + 2)},
        f, {"attention", config, {}, 48, seed}));
  }
}

// attention with an additive bias: its gradient (dbias, summed over the dims it broadcasts)
// and the others' through it, for biases of the scores' whole shape, a padding mask's
// [B, 1, 1, Tk], [Tq, 1] and a head-shared [H, Tq, Tk]; one trial leaves the bias without
// a gradient (attention_backward without dbias).
TEST(GradCheckAttention, AttentionWithBias) {
  std::mt19937_64 rng(208);
  for (int trial = 0; trial < 8; ++trial) {
    const bool causal = trial % 2 == 1;
    const int64_t tq = pick(rng, 1, 4), tk = causal ? tq + pick(rng, 0, 2) : pick(rng, 1, 5);
    const int64_t d = pick(rng, 1, 3), dv = pick(rng, 1, 3);
    const Shape lead = {pick(rng, 1, 2), 2};
    auto shaped = [&](int64_t t, int64_t c) { return Shape{lead[0], lead[1], t, c}; };
    const Shape bias_shapes[] = {
        {lead[0], lead[1], tq, tk}, {lead[0], 1, 1, tk}, {tq, 1}, {lead[1], tq, tk}};
    const Shape bias_shape = bias_shapes[trial % 4];
    const bool bias_grad = trial != 5;
    const AttentionAttrs attrs{0.6, causal, trial % 3 == 0};
    const uint64_t seed = 6600 + 10 * uint64_t(trial);
    const std::string config =
        cat("q ", shape_str(shaped(tq, d)), " k ", shape_str(shaped(tk, d)), " bias ",
            shape_str(bias_shape), causal ? " causal" : "", bias_grad ? "" : " (no dbias)");
    SCOPED_TRACE(config);
    Forward f = [attrs](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.op(OpKind::attention, attrs, {v[0], v[1], v[2], v[3]}).at(0)};
    };
    Leaf bias = input("bias", bias_shape, seed + 3, -2, 2);
    bias.differentiate = bias_grad;
    EXPECT_TRUE(check_gradients(
        {input("q", shaped(tq, d), seed, -2, 2), input("k", shaped(tk, d), seed + 1, -2, 2),
         input("v", shaped(tk, dv), seed + 2), bias},
        f, {"attention", config, {}, 48, seed}));
  }
}

// cross_entropy: every reduction, class weights, ignore_index (a class or -100), extra
// spatial dims, and the log_prob output read by the loss too.
TEST(GradCheckLoss, CrossEntropy) {
  std::mt19937_64 rng(206);
  for (int trial = 0; trial < 12; ++trial) {
    Shape logits = {pick(rng, 1, 4), pick(rng, 1, 5)};
    for (int64_t d = pick(rng, 0, 2); d > 0; --d) logits.push_back(pick(rng, 1, 3));
    Shape label_shape = logits;
    label_shape.erase(label_shape.begin() + 1);
    const int64_t C = logits[1];
    CrossEntropyAttrs a;
    a.reduction = Reduction(trial % 3);
    int ignore_kind = int(pick(rng, 0, 2));  // none, -100, a class (needs C >= 2)
    if (ignore_kind == 2 && C == 1) ignore_kind = 1;
    if (ignore_kind == 1) a.ignore_index = -100;
    if (ignore_kind == 2) a.ignore_index = pick(rng, 0, C - 1);
    Tensor labels = random_tensor(DType::i64, label_shape, 6500 + uint64_t(trial), 0, double(C));
    if (a.ignore_index && labels.numel() > 1) {
      labels.set(0, double(*a.ignore_index));  // one ignored label
      // and at least one counted, which keeps the mean's denominator positive
      if (labels.get(1) == double(*a.ignore_index))
        labels.set(1, double((*a.ignore_index + 1) % C));
    }
    const bool weighted = coin(rng), read_log_prob = coin(rng);
    const uint64_t seed = 6600 + uint64_t(trial);
    std::vector<Leaf> leaves = {input("logits", logits, seed, -3, 3),
                                {"labels", labels, false, false}};
    if (weighted)
      leaves.push_back({"weight", random_tensor(DType::f64, {C}, seed + 1, 0.2, 2.0), true, false});
    const char* reductions[] = {"none", "sum", "mean"};
    const std::string config =
        cat("logits ", shape_str(logits), " reduction ", reductions[trial % 3],
            a.ignore_index ? cat(" ignore_index ", *a.ignore_index) : std::string(),
            weighted ? " weighted" : "", read_log_prob ? " +log_prob" : "");
    SCOPED_TRACE(config);
    Forward f = [a, weighted, read_log_prob](Builder& b, const std::vector<ValueId>& v) {
      std::vector<ValueId> out = b.cross_entropy(v[0], v[1], weighted ? v[2] : kNoValue, a);
      if (!read_log_prob) out.pop_back();
      return out;
    };
    EXPECT_TRUE(check_gradients(leaves, f, {"cross_entropy", config, {}, 48, seed}));
  }
}

}  // namespace
}  // namespace fusebox::testing::gradcheck
