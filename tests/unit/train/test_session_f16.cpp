// f16 training with dynamic loss scaling (SessionOptions::loss_scaling, PyTorch's
// GradScaler) on the CPU: the step graph, skipped steps on overflow, the scale's growth,
// AdamW's step count, checkpoints, and the loss against f32's.
#include <cmath>
#include <functional>
#include <string>

#include "train_test_util.h"

namespace fusebox::testing {
namespace {

// The message of the Error that `f` throws; "" when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

SessionOptions f16(LossScaling scaling = {}) {
  SessionOptions opts;
  opts.precision = Precision::f16;
  opts.loss_scaling = scaling;
  return opts;
}

// An initial scale that overflows f16 (the logits' gradient alone is ~2^40 / batch), and a
// backoff that brings it into range within a few steps.
const LossScaling kOverflowing{.init_scale = 0x1p40, .backoff_factor = 0x1p-10};

BatchSampler sampler(int64_t batch = 4) {
  return BatchSampler(synthetic_dataset(16, 3, 8, 10, 5), batch, false, 0);
}

// The step graph holds the scaler: the seed is the scale (a state input), one nonfinite_any
// over the gradients, the updates with grad_scale and skip, one loss_scale_update; its
// state has next values like the rest.
TEST(TrainSessionF16, StepGraphScalesTheLossOnTheDevice) {
  TrainingSession session(small_cnn(4, 8), LossSpec{}, SgdOptions{.lr = 0.05, .momentum = 0.9},
                          f16());
  const Graph& g = session.step_graph();
  EXPECT_EQ(count_ops(g, OpKind::nonfinite_any), 1);
  EXPECT_EQ(count_ops(g, OpKind::loss_scale_update), 1);
  EXPECT_EQ(count_ops(g, OpKind::sgd_update), 8);
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::sgd_update) {  // and the parameter's low copy (a conv's weight)
      EXPECT_GE(n.inputs.size(), 6u) << n.name;
      EXPECT_LE(n.inputs.size(), 7u) << n.name;
      EXPECT_NE(n.inputs[4], kNoValue) << n.name;
      EXPECT_NE(n.inputs[5], kNoValue) << n.name;
    }
    if (n.op == OpKind::nonfinite_any) {
      EXPECT_EQ(n.inputs.size(), 8u);
    }
  }
  for (const char* name : {"amp/loss_scale", "amp/growth_tracker", "amp/skipped_steps"}) {
    bool updated = false;
    for (const auto& [input, next] : session.state_updates()) updated = updated || input == name;
    EXPECT_TRUE(updated) << name;
  }
  EXPECT_TRUE(g.find_value("__found_inf__").has_value());
  const NamedTensors& scaler = session.scaler_state();
  ASSERT_EQ(scaler.size(), 3u);
  EXPECT_EQ(scaler.at("loss_scale").dtype(), DType::f32);
  EXPECT_EQ(scaler.at("loss_scale").get(0), 65536.0);
  EXPECT_EQ(scaler.at("growth_tracker").get(0), 0.0);
  EXPECT_EQ(session.loss_scale(), 65536.0);
  EXPECT_EQ(session.skipped_steps(), 0);

  // No scaler for the other precisions.
  for (Precision p : {Precision::f32, Precision::bf16}) {
    TrainingSession other(small_cnn(4, 8), LossSpec{}, SgdOptions{}, {.precision = p});
    EXPECT_EQ(count_ops(other.step_graph(), OpKind::nonfinite_any), 0);
    EXPECT_TRUE(other.scaler_state().empty());
    EXPECT_EQ(other.loss_scale(), 1.0);
    EXPECT_EQ(other.skipped_steps(), 0);
  }
}

// A gradient that overflows f16 skips the step: parameters and momentum unchanged bit for
// bit, the scale backed off, the step counted; the running statistics still move (the
// forward pass ran, as in PyTorch). Once the scale fits, steps train again.
TEST(TrainSessionF16, OverflowSkipsTheStepAndLowersTheScale) {
  const Graph model = small_cnn(4, 8);
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.05, .momentum = 0.9},
                          f16(kOverflowing));
  BatchSampler s = sampler();
  const NamedTensors initial_params = session.parameters();
  const NamedTensors initial_buffers = session.buffers();
  const NamedTensors initial_momentum = session.optimizer_state();
  const float loss = session.step(zoo_batch(s, 0));
  EXPECT_TRUE(std::isfinite(loss)) << "the forward pass does not see the scale";
  EXPECT_EQ(session.skipped_steps(), 1);
  EXPECT_EQ(session.loss_scale(), 0x1p30);
  EXPECT_EQ(session.scaler_state().at("growth_tracker").get(0), 0.0);
  EXPECT_EQ(session.step_count(), 1);
  EXPECT_TRUE(same_tensors(session.parameters(), initial_params));
  EXPECT_TRUE(same_tensors(session.optimizer_state(), initial_momentum));
  EXPECT_FALSE(
      same_bits(session.buffers().at("bn1.running_mean"), initial_buffers.at("bn1.running_mean")));

  // Steps until one is taken (at most 4 backoffs take 2^40 to 1).
  int64_t skipped = 1;
  bool taken = false;
  for (int i = 1; i < 6 && !taken; ++i) {
    const NamedTensors before = session.parameters();
    session.step(zoo_batch(s, i));
    if (session.skipped_steps() == skipped + 1) {
      ++skipped;
      EXPECT_TRUE(same_tensors(session.parameters(), before)) << "skipped step " << i + 1;
    } else {
      taken = true;
      EXPECT_EQ(session.skipped_steps(), skipped);
      EXPECT_FALSE(same_bits(session.parameters().at("fc.weight"), before.at("fc.weight")))
          << "step " << i + 1 << " was not skipped but changed nothing";
    }
  }
  EXPECT_TRUE(taken) << skipped << " steps skipped";
  EXPECT_EQ(session.loss_scale(), std::ldexp(1.0, 40 - 10 * int(skipped)));
  EXPECT_EQ(session.scaler_state().at("growth_tracker").get(0), 1.0);
}

// growth_interval clean steps in a row double the scale.
TEST(TrainSessionF16, ScaleGrowsAfterGrowthIntervalCleanSteps) {
  TrainingSession session(small_cnn(4, 8), LossSpec{}, SgdOptions{.lr = 0.05},
                          f16({.init_scale = 1, .growth_interval = 2}));
  BatchSampler s = sampler();
  std::vector<double> scales;
  for (int i = 0; i < 5; ++i) {
    session.step(zoo_batch(s, i));
    scales.push_back(session.loss_scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{1, 2, 2, 4, 4}));
  EXPECT_EQ(session.skipped_steps(), 0);
  EXPECT_EQ(session.scaler_state().at("growth_tracker").get(0), 1.0);
}

// PyTorch does not call optimizer.step() on a skipped step, so AdamW's step count (its
// bias corrections) counts the steps taken: the first step that is not skipped is AdamW's
// step 1, which moves every parameter with a clear gradient by lr (m / sqrt(v) = sign).
TEST(TrainSessionF16, AdamWCountsOnlyTheStepsTaken) {
  const double lr = 0.01;
  TrainingSession session(small_cnn(4, 8), LossSpec{},
                          AdamWOptions{.lr = lr, .eps = 1e-12, .weight_decay = 0},
                          f16(kOverflowing));
  BatchSampler s = sampler();
  NamedTensors before = session.parameters();
  int i = 0;
  for (; i < 6 && session.skipped_steps() == i; ++i) {
    before = session.parameters();
    session.step(zoo_batch(s, i));
  }
  ASSERT_GE(session.skipped_steps(), 1);
  ASSERT_LT(session.skipped_steps(), i) << "no step was taken";
  const Tensor& after = session.parameters().at("fc.weight");
  const Tensor& was = before.at("fc.weight");
  double largest = 0;
  for (int64_t k = 0; k < after.numel(); ++k)
    largest = std::max(largest, std::abs(after.get(k) - was.get(k)));
  // At AdamW step k + 1 (k steps skipped) the largest move would be well below lr.
  EXPECT_NEAR(largest, lr, lr * 1e-3) << session.skipped_steps() << " steps skipped";
}

// The scaler's state is in the checkpoint (amp/...), restored on resume: the resumed run
// repeats the uninterrupted one bit for bit, growth and backoff included.
TEST(TrainSessionF16, CheckpointRoundTripsTheScaler) {
  const SgdOptions sgd{.lr = 0.05, .momentum = 0.9};
  const LossScaling scaling{.init_scale = 0x1p40, .backoff_factor = 0x1p-10, .growth_interval = 2};
  BatchSampler s = sampler();
  TrainingSession straight(small_cnn(4, 8), LossSpec{}, sgd, f16(scaling));
  std::vector<float> losses;
  for (int i = 0; i < 6; ++i) losses.push_back(straight.step(zoo_batch(s, i)));

  TrainingSession first(small_cnn(4, 8), LossSpec{}, sgd, f16(scaling));
  for (int i = 0; i < 3; ++i) first.step(zoo_batch(s, i));
  const Checkpoint ckpt = first.checkpoint();
  ASSERT_EQ(ckpt.scaler.size(), 3u);
  EXPECT_EQ(ckpt.scaler.at("loss_scale").get(0), first.loss_scale());
  EXPECT_EQ(ckpt.scaler.at("skipped_steps").get(0), double(first.skipped_steps()));
  TempDir dir("f16_ckpt");
  const std::string path = dir.str() + "/c.npz";
  first.save(path);

  TrainingSession resumed(small_cnn(4, 8), LossSpec{}, sgd, f16(scaling));
  resumed.load(path);
  EXPECT_TRUE(same_tensors(resumed.scaler_state(), first.scaler_state()));
  EXPECT_EQ(resumed.loss_scale(), first.loss_scale());
  for (int i = 3; i < 6; ++i) {
    const float loss = resumed.step(zoo_batch(s, i));
    EXPECT_TRUE(same_bits(loss, losses[size_t(i)])) << "step " << i + 1;
  }
  EXPECT_TRUE(same_tensors(resumed.scaler_state(), straight.scaler_state()));
  EXPECT_TRUE(same_tensors(resumed.parameters(), straight.parameters()));
  EXPECT_EQ(resumed.skipped_steps(), straight.skipped_steps());

  // A checkpoint with no scaler state into an f16 session, and the reverse: refused,
  // naming the precision; the session is unchanged.
  TrainingSession plain(small_cnn(4, 8), LossSpec{}, sgd);
  std::string error = error_of([&] { resumed.restore(plain.checkpoint(), "plain.npz"); });
  EXPECT_TRUE(contains(error, "plain.npz") && contains(error, "has no loss-scaling state") &&
              contains(error, "f16"))
      << error;
  EXPECT_TRUE(same_tensors(resumed.parameters(), straight.parameters()));
  error = error_of([&] { plain.restore(ckpt, "f16.npz"); });
  EXPECT_TRUE(contains(error, "holds loss-scaling state") && contains(error, "f32")) << error;
}

TEST(TrainSessionF16, BadScalingOptionsAreErrors) {
  const std::string init = error_of(
      [] { TrainingSession(small_cnn(4, 8), LossSpec{}, SgdOptions{}, f16({.init_scale = 0})); });
  EXPECT_TRUE(contains(init, "loss_scaling.init_scale 0 must be finite and > 0")) << init;
  const std::string growth = error_of([] {
    TrainingSession(small_cnn(4, 8), LossSpec{}, SgdOptions{}, f16({.growth_factor = 0.5}));
  });
  EXPECT_TRUE(contains(growth, "growth_factor 0.5 must be finite and > 1")) << growth;
}

// f16 with loss scaling (GradScaler's defaults) trains like f32: after 100 steps the mean
// loss of the last 10 is within 5% of f32's (or 0.02 once the losses near 0): the GPU
// test's configuration (CudaTraining.F16FollowsTheOracleAndF32), on the CPU.
TEST(TrainSessionF16, EndsWithinFivePercentOfF32) {
  const Graph model = small_cnn(16, 16);
  const SgdOptions sgd{.lr = 0.05, .momentum = 0.9};
  BatchSampler s(synthetic_dataset(64, 3, 16, 10, 1), 16, true, 0);
  TrainingSession half(model, LossSpec{}, sgd, f16());
  TrainingSession full(model, LossSpec{}, sgd);
  const int steps = 100;
  double tail_half = 0, tail_full = 0, first = 0;
  for (int i = 0; i < steps; ++i) {
    const float a = half.step(zoo_batch(s, i)), b = full.step(zoo_batch(s, i));
    ASSERT_TRUE(std::isfinite(a)) << "step " << i + 1;
    if (i == 0) first = b;
    if (i >= steps - 10) tail_half += a / 10, tail_full += b / 10;
  }
  EXPECT_LT(tail_full, first * 0.7) << "f32 did not learn: the comparison says nothing";
  EXPECT_NEAR(tail_half, tail_full, std::max(0.05 * tail_full, 0.02))
      << "f16 " << tail_half << " f32 " << tail_full << ", " << half.skipped_steps()
      << " steps skipped";
}

}  // namespace
}  // namespace fusebox::testing
