// End to end on the GPU: autodiff (passes/autodiff.h) of a small CNN (conv, batch_norm in
// training form, relu, max_pool, global_avg_pool, flatten, gemm, cross_entropy), run by the
// CUDA executor and by the CPU executor on the same batch; then one SGD step (with momentum
// and weight decay) of a TrainingSession on each device, comparing the parameters after
// the step. Every backward op the graph holds runs through cuda::run_node.
// Convolutions run in full f32 (FUSEBOX_ALLOW_TF32=0: TF32's 10-bit mantissa would swamp
// what this compares). Tolerance: the two backends sum in different orders (f32 on the GPU where
// the CPU sums in f64), and batch_norm's backward subtracts nearly equal terms: each gradient must
// be within 1e-3 relative plus 1e-3 of its largest magnitude of the CPU's; the parameters after a
// step (lr 0.1) within 1e-4 of their own scale.
#include <cmath>

#include "conv_test_util.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/train/session.h"
#include "fusebox/zoo.h"

namespace fusebox::cuda::testing {
namespace {

class BackwardTrainTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

constexpr int64_t kBatch = 4, kImage = 12, kClasses = 10;

Graph small_cnn() {
  return build_zoo_model("small_cnn", {.batch = kBatch,
                                       .image_size = kImage,
                                       .num_classes = kClasses,
                                       .seed = 7,
                                       .training = true});
}

NamedTensors batch(const Graph& model, uint64_t seed) {
  const Value& input = model.value(model.inputs().at(0));
  return {{input.name, random_tensor(input.type.dtype, input.type.shape, seed, -2, 2)},
          {"labels", random_tensor(DType::i64, {kBatch}, seed + 1, 0, kClasses)}};
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_doubles()) m = std::max(m, std::abs(v));
  return m;
}

::testing::AssertionResult close_to_scale(const Tensor& got, const Tensor& want, double rtol,
                                          double scale_tol) {
  return all_close(got, want, rtol, scale_tol * std::max(max_abs(want), 1e-30));
}

TEST_F(BackwardTrainTest, SmallCnnGradientsMatchCpu) {
  const ScopedEnv full_f32("FUSEBOX_ALLOW_TF32", "0");
  Graph g = small_cnn();
  Builder b(g);
  const ValueId logits = g.outputs().at(0);
  const ValueId labels = g.add_input("labels", DType::i64, {kBatch});
  const std::vector<ValueId> loss = b.name("loss").cross_entropy(logits, labels);
  g.mark_output(loss[0]);
  // Every trained parameter: the float constants but the running statistics.
  std::vector<ValueId> params;
  for (const auto& [v, t] : g.constants()) {
    const std::string& name = g.value(v).name;
    if (!is_floating(t.dtype()) || name.find("running_") != std::string::npos) continue;
    params.push_back(v);
  }
  ASSERT_GE(params.size(), 8u);
  grad(g, loss[0], params, GradOptions{.mark_outputs = true});
  // The backward ops this test is about are in the graph.
  for (OpKind op :
       {OpKind::batch_norm_backward, OpKind::max_pool_backward, OpKind::cross_entropy_backward,
        OpKind::unary_backward, OpKind::conv_backward_filter}) {
    bool found = false;
    for (const Node& n : g.nodes()) found = found || n.op == op;
    EXPECT_TRUE(found) << op_name(op);
  }

  const NamedTensors feeds = batch(g, 11);
  const NamedTensors cpu = run_graph(g, feeds, RunOptions{.device = fusebox::Device::cpu});
  const NamedTensors gpu = run_graph(g, feeds, RunOptions{.device = fusebox::Device::cuda});
  ASSERT_EQ(cpu.size(), gpu.size());
  for (const auto& [name, want] : cpu) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(gpu.count(name));
    EXPECT_TRUE(close_to_scale(gpu.at(name), want, 1e-3, 1e-3));
  }
}

TEST_F(BackwardTrainTest, SgdStepOnCudaMatchesCpu) {
  const ScopedEnv full_f32("FUSEBOX_ALLOW_TF32", "0");
  const Graph model = small_cnn();
  const SgdOptions sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4};
  TrainingSession cpu(model, LossSpec{}, sgd, SessionOptions{.device = fusebox::Device::cpu});
  TrainingSession gpu(model, LossSpec{}, sgd, SessionOptions{.device = fusebox::Device::cuda});
  for (uint64_t step = 0; step < 2; ++step) {
    SCOPED_TRACE(cat("step ", step));
    const NamedTensors feeds = batch(model, 100 + step);
    const float cpu_loss = cpu.step(feeds);
    const float gpu_loss = gpu.step(feeds);
    EXPECT_NEAR(gpu_loss, cpu_loss, 1e-4 * std::max(1.0f, std::abs(cpu_loss)));
    for (const auto& [name, want] : cpu.parameters()) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(gpu.parameters().count(name));
      EXPECT_TRUE(close_to_scale(gpu.parameters().at(name), want, 1e-4, 1e-4));
    }
    for (const auto& [name, want] : cpu.buffers()) {
      SCOPED_TRACE(name);
      EXPECT_TRUE(close_to_scale(gpu.buffers().at(name), want, 1e-4, 1e-4));
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
