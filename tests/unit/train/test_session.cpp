// TrainingSession on zoo models: what the graphs hold, that training learns, eval mode,
// imported ONNX models and bad input.
#include <chrono>
#include <cmath>
#include <set>

#include "fusebox/backends/cpu_fast.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/runtime/executor.h"
#include "fusebox/train/evaluate.h"
#include "train_test_util.h"

namespace fusebox::testing {
namespace {

TEST(TrainSession, StepGraphHoldsOneUpdatePerParameterAndTheRunningStatistics) {
  Graph model = small_cnn(2, 8);
  TrainingSession session(model, LossSpec{}, AdamWOptions{});
  // conv1, bn1 (weight, bias), conv2, bn2 (weight, bias), fc (weight, bias).
  const std::vector<std::string> params = {"conv1.weight", "bn1.weight", "bn1.bias",
                                           "conv2.weight", "bn2.weight", "bn2.bias",
                                           "fc.weight",    "fc.bias"};
  std::vector<std::string> got = session.parameter_names();
  std::sort(got.begin(), got.end());
  std::vector<std::string> want = params;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(session.buffers().size(), 4u);  // bn1/bn2 running_mean/var
  EXPECT_TRUE(session.buffers().count("bn2.running_var"));
  EXPECT_EQ(session.optimizer_state().size(), 2 * params.size());
  EXPECT_TRUE(session.optimizer_state().count("conv1.weight/exp_avg_sq"));

  const Graph& step = session.step_graph();
  EXPECT_EQ(count_ops(step, OpKind::adamw_update), int(params.size()));
  EXPECT_EQ(count_ops(step, OpKind::cross_entropy), 1);
  EXPECT_GE(count_ops(step, OpKind::conv_backward_filter), 2);
  EXPECT_TRUE(step.constants().empty() || [&] {
    for (const auto& [v, t] : step.constants())  // parameters and statistics are inputs
      for (const std::string& p : params)
        if (step.value(v).name == p) return false;
    return true;
  }());
  // Every state tensor (8 params, 16 moments, 4 statistics) has its next value.
  EXPECT_EQ(session.state_updates().size(), params.size() * 3 + 4);
  for (const Node& n : step.nodes()) {
    if (n.op == OpKind::batch_norm) {
      EXPECT_TRUE(std::get<BatchNormAttrs>(n.attrs).training) << n.name;
    }
  }
  for (const Node& n : session.eval_graph().nodes()) {
    EXPECT_NE(n.op, OpKind::cross_entropy);
    if (n.op == OpKind::batch_norm) {
      EXPECT_FALSE(std::get<BatchNormAttrs>(n.attrs).training) << n.name;
    }
  }
  EXPECT_EQ(session.batch_inputs(), (std::vector<std::string>{"input", "labels"}));
}

TEST(TrainSession, SgdWithoutMomentumKeepsNoOptimizerState) {
  TrainingSession session(small_cnn(2, 8), LossSpec{}, SgdOptions{.lr = 0.1});
  EXPECT_TRUE(session.optimizer_state().empty());
  EXPECT_EQ(count_ops(session.step_graph(), OpKind::sgd_update), 8);
}

// The synthetic set is learnable: small_cnn's loss falls tenfold in a test-sized budget.
TEST(TrainSession, SmallCnnLossFallsTenfoldOnTheSyntheticSet) {
  const int64_t batch = 16;
  Dataset data = synthetic_dataset(64, 3, 8, 10, 1);
  BatchSampler sampler(data, batch, true, 1);
  TrainingSession session(small_cnn(batch, 8), LossSpec{},
                          AdamWOptions{.lr = 0.02, .weight_decay = 0});
  const auto start = std::chrono::steady_clock::now();
  const float first = session.step(zoo_batch(sampler, 0));
  float last_epoch = 0;  // mean loss of the last 4 steps: one pass over the set
  const int steps = 80;
  for (int i = 1; i < steps; ++i) {
    float loss = session.step(zoo_batch(sampler, i));
    ASSERT_TRUE(std::isfinite(loss)) << "step " << i;
    if (i >= steps - 4) last_epoch += loss / 4;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(first, 1.5f);  // ~log(10) at the start
  EXPECT_LT(last_epoch, first / 10) << "first " << first << " last epoch " << last_epoch;
  EXPECT_LT(seconds, 60.0);

  // Eval mode (running statistics) also classifies the training set well.
  int correct = 0;
  for (int i = 0; i < 4; ++i) {
    auto [x, y] = BatchSampler(data, batch, false, 0).batch(i);
    Tensor logits = session.predict({{"input", x}}).at("logits");
    for (int64_t n = 0; n < batch; ++n) {
      int64_t best = 0;
      for (int64_t c = 1; c < 10; ++c)
        if (logits.get(n * 10 + c) > logits.get(n * 10 + best)) best = c;
      correct += best == int64_t(y.get(n));
    }
  }
  EXPECT_GE(correct, 56) << "of 64";
}

// `fusebox train --device cpu`'s session: the fast CPU kernels (oneDNN's forward and backward
// convolutions, the products, pooling) take the step's nodes they have, and a step's update of
// every parameter (lr x its gradient) follows the reference session's within their tolerance.
TEST(TrainSession, FastCpuKernelsFollowTheReference) {
  if (!cpu_fast::built_with_onednn())
    GTEST_SKIP() << "this build has no oneDNN (scripts/setup.sh puts it in .deps-cpu/)";
  Graph model = build_zoo_model(
      "resnet18", {.batch = 4, .image_size = 32, .num_classes = 10, .seed = 1, .training = true});
  const SgdOptions sgd{.lr = 0.01};
  TrainingSession reference(model, LossSpec{}, sgd);
  TrainingSession fast(model, LossSpec{}, sgd, {.cpu_kernels = CpuKernels::fast});
  const std::string& summary = fast.step_executable().stats().fast_summary;
  for (const char* op : {"conv_backward_data: ", "conv_backward_filter: ", "conv: "})
    EXPECT_NE(summary.find(op), std::string::npos) << op << "\n" << summary;
  EXPECT_EQ(summary.find("conv_backward_filter: 0 fast"), std::string::npos) << summary;
  EXPECT_GE(fast.step_executable().stats().fast_nodes, 40u) << summary;
  BatchSampler sampler(synthetic_dataset(4, 3, 32, 10, 0), 4, false, 0);
  const float want = reference.step(zoo_batch(sampler, 0)), got = fast.step(zoo_batch(sampler, 0));
  EXPECT_NEAR(got, want, 1e-4 * std::abs(want));
  const NamedTensors& after_ref = reference.parameters();
  const NamedTensors& after_fast = fast.parameters();
  for (const std::string& p : reference.parameter_names()) {
    const Tensor& before = *model.constant(*model.find_value(p));
    Tensor step_ref = Tensor::empty(DType::f32, before.shape()),
           step_fast = Tensor::empty(DType::f32, before.shape());
    for (int64_t i = 0; i < before.numel(); ++i) {
      step_ref.data<float>()[i] = float(after_ref.at(p).get(i) - before.get(i));
      step_fast.data<float>()[i] = float(after_fast.at(p).get(i) - before.get(i));
    }
    double largest = 0;
    for (int64_t i = 0; i < before.numel(); ++i)
      largest = std::max(largest, std::abs(double(step_ref.data<float>()[i])));
    EXPECT_TRUE(all_close(step_fast, step_ref, 1e-2, 1e-3 * largest + 1e-9)) << p;
  }
}

// Batch norm's running statistics move with each training step; predict reads them.
TEST(TrainSession, RunningStatisticsUpdateAndFeedPredict) {
  Graph model = small_cnn(4, 8);
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.0});
  BatchSampler sampler(synthetic_dataset(8, 3, 8, 10, 2), 4, false, 0);
  const Tensor mean0 = session.buffers().at("bn1.running_mean");
  NamedTensors in = {{"input", sampler.batch(0).first}};
  const Tensor before = session.predict(in).at("logits");
  session.step(zoo_batch(sampler, 0));
  // lr 0: the parameters stay, the statistics move (momentum 0.9 towards the batch's).
  EXPECT_TRUE(same_bits(session.parameters().at("conv1.weight"),
                        *model.constant(*model.find_value("conv1.weight"))));
  EXPECT_FALSE(same_bits(session.buffers().at("bn1.running_mean"), mean0));
  EXPECT_TRUE(same_bits(mean0, *model.constant(*model.find_value("bn1.running_mean"))))
      << "the model's constant must not be written";
  const Tensor after = session.predict(in).at("logits");
  EXPECT_FALSE(same_bits(before, after));
  // predict is a pure function of the state.
  EXPECT_TRUE(same_bits(after, session.predict(in).at("logits")));
}

TEST(TrainSession, Resnet18TrainsEndToEndAtTinyResolution) {
  Graph model = build_zoo_model(
      "resnet18", {.batch = 2, .image_size = 32, .num_classes = 10, .seed = 1, .training = true});
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.01, .momentum = 0.9});
  EXPECT_EQ(session.parameter_names().size(), 62u);  // 20 convs, 20 bns x 2, fc x 2
  EXPECT_EQ(session.buffers().size(), 40u);
  BatchSampler sampler(synthetic_dataset(4, 3, 32, 10, 0), 2, false, 0);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(std::isfinite(session.step(zoo_batch(sampler, i))));
  EXPECT_EQ(session.step_count(), 2);
  EXPECT_FALSE(same_bits(session.parameters().at("layer4.1.conv2.weight"),
                         *model.constant(*model.find_value("layer4.1.conv2.weight"))));
  EXPECT_EQ(session.predict({{"input", sampler.batch(0).first}}).at("logits").shape(),
            (Shape{2, 10}));
}

// The small ViT and ConvNeXt train: gradients flow through attention, LayerNorm, GELU, the
// gemms, depthwise convolutions and layer scales.
TEST(TrainSession, TransformerEraZooModelsLossFallsOnTheSyntheticSet) {
  for (const char* name : {"vit_test", "convnext_test"}) {
    SCOPED_TRACE(name);
    Graph model =
        build_zoo_model(name, {.batch = 4, .image_size = 16, .num_classes = 4, .seed = 2});
    TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.05, .momentum = 0.9});
    const std::string deep = std::string(name) == "vit_test"
                                 ? "encoder.layers.encoder_layer_1.self_attention.in_proj_weight"
                                 : "features.3.0.block.0.weight";
    ASSERT_TRUE(session.parameters().count(deep)) << deep;
    BatchSampler sampler(synthetic_dataset(8, 3, 16, 4, 6), 4, false, 0);
    float first = 0, last = 0;
    for (int i = 0; i < 40; ++i) {
      last = session.step(zoo_batch(sampler, i % 2));
      ASSERT_TRUE(std::isfinite(last)) << "step " << i;
      if (i == 0) first = last;
    }
    EXPECT_LT(last, first / 2);
    EXPECT_FALSE(
        same_bits(session.parameters().at(deep), *model.constant(*model.find_value(deep))));
  }
}

// The GPT-2-style decoder learns the synthetic token rule (next = 5 t + 3 mod vocab): its
// cross-entropy over logits [B, vocab, T] against labels [B, T] falls; gradients reach the
// tied embedding through the gather and the head.
TEST(TrainSession, DecoderLearnsTheSyntheticTokenRule) {
  Graph model = build_zoo_model("gpt2_test", {.batch = 4, .seed = 2, .sequence_length = 16});
  TrainingSession session(model, LossSpec{}, AdamWOptions{.lr = 3e-3, .weight_decay = 0});
  BatchSampler sampler(synthetic_token_dataset(16, 16, 128, 3), 4, false, 0);
  const auto [x, y] = sampler.batch(0);
  ASSERT_EQ(x.dtype(), DType::i64);
  ASSERT_EQ(y.shape(), (Shape{4, 16}));
  EXPECT_EQ(y.get(0), double((5 * int64_t(x.get(0)) + 3) % 128));
  EXPECT_EQ(y.get(0), x.get(1));
  float first = 0, last = 0;
  for (int i = 0; i < 60; ++i) {
    const auto [xb, yb] = sampler.batch(i % 4);
    last = session.step({{"input", xb}, {"labels", yb}});
    ASSERT_TRUE(std::isfinite(last)) << "step " << i;
    if (i == 0) first = last;
  }
  EXPECT_GT(first, 4.0f);  // about log(128) = 4.85 at the start
  EXPECT_LT(last, first / 2);
  const std::string wte = "transformer.wte.weight";
  EXPECT_FALSE(same_bits(session.parameters().at(wte), *model.constant(*model.find_value(wte))));
}

// The decoder's causal attention fuses in the bf16 training step (one attention node per
// layer, whose gradient rule reads its lse), both as the zoo builds it and as an ONNX import
// (where the scale and the mask's fill are initializers, which mixed precision in training
// casts by nodes instead of folding: the exported GPT-2's step ran every attention as a
// spelled-out chain, ~60 ms of its 191 on an H200).
TEST(TrainSession, DecoderAttentionFusesInTheTrainingStep) {
  const Graph zoo = build_zoo_model("gpt2_test", {.batch = 2, .seed = 2, .sequence_length = 16});
  const Graph imported = import_onnx_bytes(export_onnx_bytes(zoo), "gpt2_test.onnx");
  for (const Graph* model : {&zoo, &imported}) {
    SCOPED_TRACE(model == &zoo ? "zoo" : "imported");
    TrainingSession session(*model, LossSpec{}, AdamWOptions{.lr = 1e-3},
                            {.precision = Precision::bf16});
    EXPECT_EQ(count_ops(session.step_graph(), OpKind::attention), 2);
    EXPECT_EQ(count_ops(session.step_graph(), OpKind::attention_backward), 2);
    EXPECT_EQ(count_ops(session.step_graph(), OpKind::softmax), 0);
    EXPECT_EQ(count_ops(session.step_graph(), OpKind::where), 0);
  }
}

// Layer norms writing the low dtype (their narrowing casts folded) in `g`.
int norms_writing_low(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes())
    n += node.op == OpKind::layer_norm && std::get<NormAttrs>(node.attrs).y_dtype &&
         is_low_float(*std::get<NormAttrs>(node.attrs).y_dtype);
  return n;
}

// The step's fusions after autodiff (passes/pipeline.h training_step: the norms' casts, the
// pointwise chains of the forward and the backward) change no bit: the GPT-2 decoder in bf16
// (its layer norms writing bf16, the casts of its products into the f32 residual adds,
// gelu's chain), MobileNetV3-Small in bf16 (its HardSwish and squeeze-and-excitation gates
// computed again in the backward) and small_cnn in f32 train step for step as with every op
// its own node.
TEST(TrainSession, StepFusionsTrainBitForBitAsUnfused) {
  struct Case {
    const char* name;
    Graph model;
    OptimizerSpec optimizer;
    Precision precision;
    bool tokens;              // gpt2_test's batches, else images
    bool recomputes = false;  // gates the backward computes again (passes/rematerialize.h)
  };
  const Case cases[] = {
      {"gpt2_test bf16",
       build_zoo_model("gpt2_test", {.batch = 2, .seed = 3, .sequence_length = 16}),
       AdamWOptions{.lr = 1e-3}, Precision::bf16, true},
      {"vit_test bf16",
       build_zoo_model("vit_test", {.batch = 4, .image_size = 16, .num_classes = 4, .seed = 2}),
       AdamWOptions{.lr = 1e-3}, Precision::bf16, false},
      {"small_cnn f32", small_cnn(4, 8), SgdOptions{.lr = 0.05, .momentum = 0.9}, Precision::f32,
       false},
      {"mobilenet_v3_small bf16",
       build_zoo_model("mobilenet_v3_small",
                       {.batch = 4, .image_size = 16, .num_classes = 4, .seed = 4}),
       SgdOptions{.lr = 0.05, .momentum = 0.9}, Precision::bf16, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TrainingSession fused(c.model, LossSpec{}, c.optimizer, {.precision = c.precision});
    TrainingSession unfused(c.model, LossSpec{}, c.optimizer,
                            {.precision = c.precision, .step_fusion = false});
    EXPECT_GT(count_ops(fused.step_graph(), OpKind::fused_pointwise), 0);
    EXPECT_EQ(count_ops(unfused.step_graph(), OpKind::fused_pointwise), 0);
    EXPECT_LE(fused.step_graph().nodes().size(), unfused.step_graph().nodes().size());
    // Clips, including those inside generated kernels: the gates' copies add some.
    const auto clips = [](const Graph& g) {
      int64_t count = 0;
      for (const Node& n : g.nodes()) {
        count += n.op == OpKind::clip;
        if (const auto* p = std::get_if<PointwiseProgram>(&n.attrs))
          for (const PointwiseInstr& i : p->instrs) count += i.op == OpKind::clip;
      }
      return count;
    };
    EXPECT_EQ(clips(fused.step_graph()) > clips(unfused.step_graph()), c.recomputes);
    if (c.precision == Precision::bf16 && count_ops(unfused.step_graph(), OpKind::layer_norm) > 0) {
      EXPECT_LT(fused.step_graph().nodes().size(), unfused.step_graph().nodes().size());
      EXPECT_LT(count_ops(fused.step_graph(), OpKind::cast),
                count_ops(unfused.step_graph(), OpKind::cast));
      EXPECT_GT(norms_writing_low(fused.step_graph()), 0);
      EXPECT_EQ(norms_writing_low(unfused.step_graph()), 0);
    }
    const BatchSampler sampler =
        c.tokens ? BatchSampler(synthetic_token_dataset(8, 16, 128, 3), 2, false, 0)
        : c.precision == Precision::bf16
            ? BatchSampler(synthetic_dataset(8, 3, 16, 4, 6), 4, false, 0)
            : BatchSampler(synthetic_dataset(12, 3, 8, 10, 5), 4, false, 0);
    for (int i = 0; i < 3; ++i) {
      const NamedTensors batch = zoo_batch(sampler, i);
      const float a = fused.step(batch), b = unfused.step(batch);
      EXPECT_TRUE(same_bits(a, b)) << "step " << i << ": " << a << " vs " << b;
    }
    EXPECT_TRUE(same_tensors(fused.parameters(), unfused.parameters()));
    EXPECT_TRUE(same_tensors(fused.optimizer_state(), unfused.optimizer_state()));
  }
}

// An ONNX import for training (keep_parameter_transforms) keeps each weight the initializer it
// is: the zoo decoder's head tied to its embedding (logits = h wte^T, exported as a Transpose of
// the embedding) trains as one parameter under its own name, step for step as the zoo graph
// trains; folded at import (inference's default) the transposed copy would be a second,
// untied parameter.
TEST(TrainSession, ImportForTrainingKeepsTiedWeightsOne) {
  const Graph zoo = build_zoo_model("gpt2_test", {.batch = 2, .seed = 2, .sequence_length = 16});
  const std::string bytes = export_onnx_bytes(zoo);
  OnnxImportOptions keep;
  keep.keep_parameter_transforms = true;
  const Graph kept = import_onnx_bytes(bytes, "gpt2_test.onnx", keep);
  const Graph folded = import_onnx_bytes(bytes, "gpt2_test.onnx");
  const AdamWOptions adamw{.lr = 3e-3, .weight_decay = 0};
  TrainingSession from_zoo(zoo, LossSpec{}, adamw), from_kept(kept, LossSpec{}, adamw),
      from_folded(folded, LossSpec{}, adamw);
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(from_kept.parameter_names()), sorted(from_zoo.parameter_names()));
  EXPECT_EQ(from_folded.parameter_names().size(), from_zoo.parameter_names().size() + 1);
  BatchSampler sampler(synthetic_token_dataset(8, 16, 128, 3), 2, false, 0);
  for (int64_t i = 0; i < 4; ++i) {
    const NamedTensors batch = zoo_batch(sampler, i);
    EXPECT_NEAR(from_kept.step(batch), from_zoo.step(batch), 1e-5) << "step " << i;
  }
  const std::string wte = "transformer.wte.weight";
  // (AdamW divides by the gradients' own size: rounding-level differences in the two graphs'
  // sums show at that level in a few elements.)
  EXPECT_TRUE(all_close(from_kept.parameters().at(wte), from_zoo.parameters().at(wte), 1e-3, 1e-5));
}

// trained_model: the model with the session's weights and running statistics, batch norms in
// inference form; imported back from its ONNX export it predicts what the session predicts.
TEST(TrainSession, TrainedModelPredictsAsTheSession) {
  const Graph model = small_cnn(4, 8);
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.05, .momentum = 0.9});
  const Tensor x = random_tensor(DType::f32, {4, 3, 8, 8}, 11);
  const Tensor y = Tensor::from_vector<int64_t>({4}, {0, 1, 2, 1});
  for (int i = 0; i < 3; ++i) session.step({{"input", x}, {"labels", y}});
  const Graph trained = session.trained_model(model);
  for (const Node& n : trained.nodes()) {
    if (n.op == OpKind::batch_norm) {
      EXPECT_FALSE(std::get<BatchNormAttrs>(n.attrs).training) << n.name;
    }
  }
  for (const auto& [name, t] : session.parameters())
    EXPECT_TRUE(same_bits(*trained.constant(*trained.find_value(name)), t)) << name;
  const Graph imported = import_onnx_bytes(export_onnx_bytes(trained), "trained.onnx");
  const Tensor want = session.predict({{"input", x}}).begin()->second;
  const Tensor got = run_graph(imported, {{"input", x}}).begin()->second;
  EXPECT_TRUE(all_close(got, want, 1e-5, 1e-6));
  // Another model's graph is refused, naming the parameter.
  const Graph other = build_zoo_model(
      "small_cnn", {.batch = 4, .image_size = 8, .num_classes = 7, .training = true});
  const std::string m = error_message([&] { session.trained_model(other); });
  EXPECT_NE(m.find("its new value"), std::string::npos) << m;
}

// evaluate: every sample of a set that is not a multiple of the batch counted once (the last
// batch completed with the first samples, not counted), against argmax and log-softmax
// computed here from predict's logits.
TEST(TrainSession, EvaluateCountsEverySampleOnce) {
  const Graph model = small_cnn(4, 8);
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.05, .momentum = 0.9});
  const Dataset data = synthetic_dataset(10, 3, 8, 10, 21);
  for (int64_t i = 0; i < 3; ++i) {
    const BatchSampler train(data, 4, false, 0);
    auto [x, y] = train.batch(i);
    session.step({{"input", x}, {"labels", y}});
  }
  const EvalResult e = evaluate(session, data, "input", "logits", 4, "test");
  EXPECT_EQ(e.samples, 10);
  EXPECT_EQ(e.positions, 10);
  double loss = 0;
  int64_t top1 = 0;
  for (int64_t first = 0; first < 10; first += 4) {
    Tensor x = Tensor::empty(DType::f32, {4, 3, 8, 8});
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t j = 0; j < 192; ++j)
        x.set(r * 192 + j, data.x.get(((first + r) % 10) * 192 + j));
    const Tensor logits = session.predict({{"input", x}}).at("logits");
    for (int64_t r = 0; r < 4 && first + r < 10; ++r) {
      const int64_t label = int64_t(data.y.get(first + r));
      double m = -INFINITY, sum = 0;
      int64_t best = 0;
      for (int64_t c = 0; c < 10; ++c) {
        m = std::max(m, logits.get(r * 10 + c));
        if (logits.get(r * 10 + c) > logits.get(r * 10 + best)) best = c;
      }
      for (int64_t c = 0; c < 10; ++c) sum += std::exp(logits.get(r * 10 + c) - m);
      loss += -(logits.get(r * 10 + label) - m - std::log(sum));
      top1 += best == label;
    }
  }
  EXPECT_NEAR(e.loss, loss / 10, 1e-9);
  EXPECT_DOUBLE_EQ(e.top1, double(top1) / 10);
  EXPECT_GE(e.top5, e.top1);
  EXPECT_LE(e.top5, 1.0);
  const std::string m = error_message([&] { evaluate(session, data, "input", "nope", 4, "t"); });
  EXPECT_NE(m.find("the model has no output 'nope'"), std::string::npos) << m;
}

// The small U-Net learns a per-pixel rule (class 1 where input channel 0 is positive): the
// cross-entropy over logits [B, 2, H, W] against labels [B, H, W] falls; gradients pass the
// bilinear resizes (resize_backward), the concatenations and the batch norms.
TEST(TrainSession, UNetLearnsAPerPixelRule) {
  Graph model =
      build_zoo_model("unet_test", {.batch = 2, .image_size = 16, .num_classes = 2, .seed = 3});
  TrainingSession session(model, LossSpec{}, AdamWOptions{.lr = 3e-3, .weight_decay = 0});
  std::vector<NamedTensors> batches;
  for (uint64_t s = 0; s < 2; ++s) {
    const Tensor x = random_tensor(DType::f32, {2, 3, 16, 16}, 40 + s);
    Tensor y = Tensor::empty(DType::i64, {2, 16, 16});
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t p = 0; p < 256; ++p)
        y.data<int64_t>()[b * 256 + p] = x.get(b * 3 * 256 + p) > 0 ? 1 : 0;
    batches.push_back({{"input", x}, {"labels", y}});
  }
  float first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    last = session.step(batches[size_t(i % 2)]);
    ASSERT_TRUE(std::isfinite(last)) << "step " << i;
    if (i == 0) first = last;
  }
  EXPECT_LT(last, first / 2);
}

// An imported ONNX model (batch_norm in inference form) is switched to training form,
// and its parameters keep their initializer names.
TEST(TrainSession, TrainsAnImportedOnnxModel) {
  Graph exported = build_zoo_model("small_cnn", {.batch = 4, .image_size = 8, .num_classes = 10});
  Graph model = import_onnx_bytes(export_onnx_bytes(exported), "small_cnn.onnx");
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.05, .momentum = 0.9});
  EXPECT_TRUE(session.parameters().count("conv1.weight"));
  EXPECT_TRUE(session.buffers().count("bn1.running_var"));
  int training_bns = 0;
  for (const Node& n : session.step_graph().nodes())
    training_bns += n.op == OpKind::batch_norm && std::get<BatchNormAttrs>(n.attrs).training;
  EXPECT_EQ(training_bns, 2);
  BatchSampler sampler(synthetic_dataset(16, 3, 8, 10, 4), 4, false, 0);
  float first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    last = session.step(zoo_batch(sampler, i % 4));
    if (i == 0) first = last;
  }
  EXPECT_LT(last, first / 2);
  // Eval mode matches the model run as imported, after zero steps: a fresh session.
  TrainingSession fresh(model, LossSpec{}, SgdOptions{});
  NamedTensors in = {{"input", sampler.batch(0).first}};
  EXPECT_TRUE(
      all_close(fresh.predict(in).at("logits"), run_graph(model, in).at("logits"), 1e-6, 1e-6));
}

TEST(TrainSession, FrozenConstantsStayConstants) {
  SessionOptions opts;
  opts.frozen = {"conv1.weight", "bn1.weight"};
  TrainingSession session(small_cnn(2, 8), LossSpec{}, SgdOptions{}, opts);
  EXPECT_EQ(session.parameter_names().size(), 6u);
  EXPECT_FALSE(session.parameters().count("conv1.weight"));
  opts.frozen = {"no.such.weight"};
  EXPECT_THROW(TrainingSession(small_cnn(2, 8), LossSpec{}, SgdOptions{}, opts), Error);
}

// One-element constants an export leaves as literals with dims (PyTorch's SDPA export scales
// q and k^T by a [1]) are not trained when only scalings read them; one an add reads (a
// Linear(d, 1)'s bias) or another op reads (a shared PReLU slope [1], through an expand) is.
TEST(TrainSession, OneElementLiteralsAreNotTrained) {
  Graph g("literals");
  const ValueId x = g.add_input("input", DType::f32, {2, 4});
  const ValueId w = g.add_constant("fc.weight", random_tensor(DType::f32, {4, 3}, 1));
  const ValueId c = g.add_constant("onnx::Mul_7", Tensor::from_vector<float>({1}, {0.5f}));
  const ValueId shift = g.add_constant("shift", Tensor::from_vector<float>({1}, {0.25f}));
  ValueId y = g.add_node(OpKind::matmul, {}, {x, w}, "fc")[0];
  y = g.add_node(OpKind::mul, {}, {y, c}, "scale")[0];
  const ValueId gain = g.add_constant("gain", Tensor::from_vector<float>({1}, {2.0f}));
  const ValueId s = g.add_node(OpKind::expand, ExpandAttrs{{1}}, {gain}, "gain_view")[0];
  y = g.add_node(OpKind::add, {}, {y, shift}, "shifted")[0];
  y = g.add_node(OpKind::mul, {}, {y, s}, "gained")[0];
  g.rename_value(y, "logits");
  g.mark_output(y);
  TrainingSession session(g, LossSpec{}, SgdOptions{});
  EXPECT_TRUE(session.parameters().count("fc.weight"));
  EXPECT_TRUE(session.parameters().count("shift"));  // a bias: read by an add
  EXPECT_TRUE(session.parameters().count("gain"));   // read by an expand
  EXPECT_FALSE(session.parameters().count("onnx::Mul_7"));
}

// The model with a multiplication by one between each batch norm and its relu (exact, sign and
// all, forward and backward; an identity op would be removed by remove_identity_ops): the
// fusion (passes/fusion.h) leaves such pairs alone, so this is the unfused computation.
Graph with_identity_before_relus(const Graph& model) {
  Graph g(model.name());
  std::vector<ValueId> map(model.values().size(), kNoValue);
  for (ValueId v : model.inputs())
    map[size_t(v)] =
        g.add_input(model.value(v).name, model.value(v).type.dtype, model.value(v).type.shape);
  for (const auto& [v, t] : model.constants())
    map[size_t(v)] = g.add_constant(model.value(v).name, t);
  for (const Node& n : model.nodes()) {
    std::vector<ValueId> inputs;
    for (ValueId v : n.inputs) inputs.push_back(v == kNoValue ? kNoValue : map[size_t(v)]);
    const NodeId producer = model.value(n.inputs.at(0)).producer;
    if (n.op == OpKind::relu && producer >= 0 && model.node(producer).op == OpKind::batch_norm)
      inputs[0] = g.add_node(
          OpKind::mul, {},
          {inputs[0], g.add_constant(n.name + "/one", Tensor::full(DType::f32, {}, 1.0))},
          n.name + "/unfused")[0];
    std::vector<std::string> names;
    for (ValueId v : n.outputs) names.push_back(model.value(v).name);
    const std::vector<ValueId> outs = g.add_node(n.op, n.attrs, inputs, n.name, names);
    for (size_t i = 0; i < outs.size(); ++i) map[size_t(n.outputs[i])] = outs[i];
  }
  for (ValueId v : model.outputs()) g.mark_output(map[size_t(v)]);
  return g;
}

// Relus as nodes or as instructions of fused_pointwise programs (the step's pointwise chains).
int relus(const Graph& g) {
  int n = count_ops(g, OpKind::relu);
  for (const Node& node : g.nodes())
    if (node.op == OpKind::fused_pointwise)
      for (const PointwiseInstr& instr : std::get<PointwiseProgram>(node.attrs).instrs)
        n += instr.op == OpKind::relu;
  return n;
}

int fused_batch_norms(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes())
    n += node.op == OpKind::batch_norm && std::get<BatchNormAttrs>(node.attrs).relu;
  return n;
}

// The session fuses small_cnn's two batch_norm -> relu pairs in its step and eval graphs,
// and that changes no bit: losses, parameters, optimizer state, running statistics and
// predictions equal the unfused model's after a few steps, in f32 and bf16.
TEST(TrainSession, FusedBatchNormReluTrainsBitForBitAsUnfused) {
  for (Precision precision : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    const Graph model = small_cnn(4, 8);
    const SgdOptions sgd{.lr = 0.05, .momentum = 0.9};
    TrainingSession fused(model, LossSpec{}, sgd, {.precision = precision});
    TrainingSession unfused(with_identity_before_relus(model), LossSpec{}, sgd,
                            {.precision = precision});
    EXPECT_EQ(fused_batch_norms(fused.step_graph()), 2);
    EXPECT_EQ(relus(fused.step_graph()), 0);
    EXPECT_EQ(count_ops(fused.step_graph(), OpKind::unary_backward), 0);
    EXPECT_EQ(fused_batch_norms(fused.eval_graph()), 2);
    EXPECT_EQ(fused_batch_norms(unfused.step_graph()), 0);
    EXPECT_EQ(relus(unfused.step_graph()), 2);
    BatchSampler sampler(synthetic_dataset(12, 3, 8, 10, 5), 4, false, 0);
    for (int i = 0; i < 3; ++i) {
      const float a = fused.step(zoo_batch(sampler, i)), b = unfused.step(zoo_batch(sampler, i));
      EXPECT_TRUE(same_bits(a, b)) << "step " << i << ": " << a << " vs " << b;
    }
    EXPECT_TRUE(same_tensors(fused.parameters(), unfused.parameters()));
    EXPECT_TRUE(same_tensors(fused.optimizer_state(), unfused.optimizer_state()));
    EXPECT_TRUE(same_tensors(fused.buffers(), unfused.buffers()));
    EXPECT_FALSE(same_bits(fused.parameters().at("conv1.weight"),
                           *model.constant(*model.find_value("conv1.weight"))));
    const NamedTensors in = {{"input", sampler.batch(0).first}};
    EXPECT_TRUE(same_tensors(fused.predict(in), unfused.predict(in)));
  }
}

// Generated programs in `g` holding relu's gradient (unary_backward of relu).
int programs_with_relu_gradients(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes()) {
    if (node.op != OpKind::fused_pointwise) continue;
    bool found = false;
    for (const PointwiseInstr& instr : std::get<PointwiseProgram>(node.attrs).instrs)
      found = found || (instr.op == OpKind::unary_backward && instr.of == OpKind::relu);
    n += found;
  }
  return n;
}

// batch_norm_backward nodes of `g` that write the dy they used (dy_output) and that read dy in
// two terms (dy_addend).
struct NormBackwardForms {
  int writes_dy = 0, two_terms = 0;
  explicit NormBackwardForms(const Graph& g) {
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::batch_norm_backward) continue;
      writes_dy += std::get<BatchNormAttrs>(n.attrs).dy_output;
      two_terms += n.inputs.size() == 8 && n.inputs[7] != kNoValue;
    }
  }
};

// ResNet-18's residual junctions: each of the 8 block ends' backward masks by its y itself
// and writes the residual's gradient (dy_output), no relu gradient of its own; with the step's
// fusions the 7 block outputs a next block reads (its first convolution and its skip or
// downsample) have their gradient's two terms read by that norm's backward (dy_addend,
// fold_gradient_sums) instead of summed by an add; and the step's numbers are the unfused
// step's bit for bit.
TEST(TrainSession, ResidualGradientSumsAndReluMasksFuseAndChangeNoBit) {
  const Graph model = build_zoo_model(
      "resnet18", {.batch = 2, .image_size = 32, .num_classes = 10, .seed = 1, .training = true});
  const SgdOptions sgd{.lr = 0.05, .momentum = 0.9};
  TrainingSession fused(model, LossSpec{}, sgd, {.step_fusion = true});
  TrainingSession unfused(model, LossSpec{}, sgd, {.step_fusion = false});
  const NormBackwardForms with(fused.step_graph()), without(unfused.step_graph());
  EXPECT_EQ(with.writes_dy, 8);
  EXPECT_EQ(with.two_terms, 7);
  EXPECT_EQ(programs_with_relu_gradients(fused.step_graph()), 0);
  EXPECT_EQ(without.writes_dy, 8);
  EXPECT_EQ(without.two_terms, 0);
  EXPECT_EQ(count_ops(unfused.step_graph(), OpKind::fused_pointwise), 0);
  EXPECT_EQ(count_ops(unfused.step_graph(), OpKind::unary_backward), 0);
  EXPECT_GE(count_ops(unfused.step_graph(), OpKind::add), 7);
  BatchSampler sampler(synthetic_dataset(4, 3, 32, 10, 3), 2, false, 0);
  for (int i = 0; i < 2; ++i) {
    const float a = fused.step(zoo_batch(sampler, i)), b = unfused.step(zoo_batch(sampler, i));
    EXPECT_TRUE(same_bits(a, b)) << "step " << i << ": " << a << " vs " << b;
  }
  EXPECT_TRUE(same_tensors(fused.parameters(), unfused.parameters()));
  EXPECT_TRUE(same_tensors(fused.optimizer_state(), unfused.optimizer_state()));
}

// Casts in `g` that read one of `names` (the parameters): what low copies remove.
int casts_of_parameters(const Graph& g, const std::vector<std::string>& names) {
  const std::set<std::string> params(names.begin(), names.end());
  int n = 0;
  for (const Node& node : g.nodes())
    n += node.op == OpKind::cast && params.count(g.value(node.inputs[0]).name);
  return n;
}

// bf16 / f16 training keeps low copies of the weights (SessionOptions::low_parameter_copies):
// no cast reads a parameter in the step (nor widens its gradient: the update reads it as it
// is), and the numbers are the casts' bit for bit: losses, parameters and optimizer state
// equal a session's without the copies, with SGD (momentum) and AdamW; a restored checkpoint
// refills the copies (the step after it computes what it computed the first time).
TEST(TrainSession, LowParameterCopiesTrainBitForBitAsTheCasts) {
  const OptimizerSpec optimizers[] = {SgdOptions{.lr = 0.05, .momentum = 0.9},
                                      AdamWOptions{.lr = 0.01}};
  for (Precision precision : {Precision::bf16, Precision::f16}) {
    for (const OptimizerSpec& optimizer : optimizers) {
      SCOPED_TRACE(cat(precision_name(precision), " ", optimizer_name(optimizer)));
      const Graph model = small_cnn(4, 8);
      TrainingSession with(model, LossSpec{}, optimizer, {.precision = precision});
      TrainingSession without(model, LossSpec{}, optimizer,
                              {.precision = precision, .low_parameter_copies = false});
      const std::vector<std::string>& params = with.parameter_names();
      EXPECT_EQ(casts_of_parameters(with.step_graph(), params), 0);
      EXPECT_GT(casts_of_parameters(without.step_graph(), params), 0);
      int copies = 0, low_grads = 0;
      for (const Node& n : with.step_graph().nodes()) {
        if (n.op != OpKind::sgd_update && n.op != OpKind::adamw_update) continue;
        copies += n.outputs.size() == (n.op == OpKind::sgd_update ? 3u : 4u);
        low_grads += is_low_float(with.step_graph().value(n.inputs[1]).type.dtype);
      }
      EXPECT_EQ(copies, casts_of_parameters(without.step_graph(), params));
      EXPECT_EQ(low_grads, copies);
      BatchSampler sampler(synthetic_dataset(12, 3, 8, 10, 5), 4, false, 0);
      for (int i = 0; i < 3; ++i) {
        const float a = with.step(zoo_batch(sampler, i)), b = without.step(zoo_batch(sampler, i));
        EXPECT_TRUE(same_bits(a, b)) << "step " << i << ": " << a << " vs " << b;
      }
      EXPECT_TRUE(same_tensors(with.parameters(), without.parameters()));
      EXPECT_TRUE(same_tensors(with.optimizer_state(), without.optimizer_state()));
      const Checkpoint at3 = with.checkpoint();
      const float fourth = with.step(zoo_batch(sampler, 3));
      const NamedTensors after = with.parameters();
      with.restore(at3, "test");
      EXPECT_TRUE(same_bits(with.step(zoo_batch(sampler, 3)), fourth));
      EXPECT_TRUE(same_tensors(with.parameters(), after));
    }
  }
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TrainSession, BadBatchesAndSpecsAreClearErrors) {
  TrainingSession session(small_cnn(2, 8), LossSpec{}, SgdOptions{});
  BatchSampler sampler(synthetic_dataset(2, 3, 8, 10, 0), 2, false, 0);
  NamedTensors batch = zoo_batch(sampler, 0);
  NamedTensors no_labels = {{"input", batch.at("input")}};
  expect_error([&] { session.step(no_labels); }, "no 'labels'");
  NamedTensors extra = batch;
  extra["bogus"] = batch.at("labels");
  expect_error([&] { session.step(extra); }, "'bogus'");
  NamedTensors wrong_shape = batch;
  wrong_shape["labels"] = Tensor::zeros(DType::i64, {3});
  expect_error([&] { session.step(wrong_shape); }, "labels");
  NamedTensors bad_label = batch;
  bad_label["labels"] = Tensor::full(DType::i64, {2}, 10);
  EXPECT_THROW(session.step(bad_label), Error);
  EXPECT_EQ(session.step_count(), 0) << "failed steps leave the state alone";
  expect_error([&] { session.predict(batch); }, "'labels'");

  expect_error([&] { TrainingSession(small_cnn(2, 8), LossSpec{}, SgdOptions{.lr = -1}); }, "lr");
  expect_error([&] { TrainingSession(small_cnn(2, 8), LossSpec{.logits = "nope"}, SgdOptions{}); },
               "nope");
  expect_error([&] { TrainingSession(small_cnn(2, 8), LossSpec{}, AdamWOptions{.beta1 = 1}); },
               "beta1");
  Graph no_params("empty");
  ValueId x = no_params.add_input("x", DType::f32, {2, 3});
  no_params.mark_output(Builder(no_params).relu(x));
  expect_error([&] { TrainingSession(no_params, LossSpec{}, SgdOptions{}); }, "no floating-point");
}

TEST(TrainSession, CudaDeviceIsTheExecutorsError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: the CUDA backend's own tests apply";
  // The step is compiled when the session is made: that is where the missing GPU shows.
  expect_error(
      [&] { TrainingSession(small_cnn(2, 8), LossSpec{}, SgdOptions{}, {.device = Device::cuda}); },
      "CUDA");
}

}  // namespace
}  // namespace fusebox::testing
