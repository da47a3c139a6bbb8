// Every OpKind, taken from the op table (ir/op_info.h), on tiny shapes: a one-node graph
// infers and verifies, runs on the CPU backend, gives the CPU's results on CUDA, and
// autodiff differentiates it exactly when the table says it is differentiable. An op with
// no tiny example fails here, so a new op is covered as soon as it has a row.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/ir/op_info.h"
#include "fusebox/passes/autodiff.h"
#include "op_examples.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// Every element finite: the executor poisons outputs with NaN, so this also catches an
// element that the kernel never wrote.
::testing::AssertionResult all_finite(const Tensor& t) {
  if (!is_floating(t.dtype())) return ::testing::AssertionSuccess();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(t.get(i)))
      return ::testing::AssertionFailure() << "element " << i << " is " << t.get(i);
  }
  return ::testing::AssertionSuccess();
}

class OpCoverage : public ::testing::TestWithParam<OpKind> {
 protected:
  // The op's example as a graph; fails the test when the op has none.
  std::optional<OneNodeGraph> graph() {
    const std::optional<OpExample> example = tiny_example(GetParam());
    if (!example) {
      ADD_FAILURE() << "no tiny example for " << op_name(GetParam())
                    << ": add one to tiny_example() in tests/op_examples.cpp";
      return std::nullopt;
    }
    return build(GetParam(), *example);
  }
};

// Inference (add_node), re-inference (verify) and the CPU kernel agree on every output.
TEST_P(OpCoverage, InfersAndRunsOnCpu) {
  std::optional<OneNodeGraph> g = graph();
  ASSERT_TRUE(g);
  ASSERT_FALSE(g->outputs.empty());
  EXPECT_NO_THROW(g->graph.verify());
  const NamedTensors got = run_graph(g->graph, g->feeds);
  for (ValueId v : g->outputs) {
    const Value& value = g->graph.value(v);
    SCOPED_TRACE(value.name);
    const Tensor& t = got.at(value.name);
    EXPECT_EQ(t.dtype(), value.type.dtype);
    EXPECT_EQ(t.shape(), value.type.shape);
    EXPECT_TRUE(all_finite(t));
  }
}

// The gradient of output 0 with respect to the first float input: built and run when the
// table says the op is differentiable, refused otherwise.
TEST_P(OpCoverage, GradientRuleAgreesWithTheTable) {
  std::optional<OneNodeGraph> g = graph();
  ASSERT_TRUE(g);
  ValueId wrt = kNoValue;
  for (ValueId v : g->inputs) {
    if (v != kNoValue && is_floating(g->graph.value(v).type.dtype)) {
      wrt = v;
      break;
    }
  }
  if (wrt == kNoValue) return;  // no input (constant): no gradient can reach the node
  const ValueId loss = g->outputs[0];
  if (!is_floating(g->graph.value(loss).type.dtype)) {
    // An index or a bool: autodiff follows float values only, so no rule is ever asked for.
    EXPECT_FALSE(op_info(GetParam()).differentiable)
        << op_name(GetParam()) << " has a non-float output 0 but is marked differentiable";
    return;
  }
  if (!op_info(GetParam()).differentiable) {
    try {
      grad(g->graph, loss, {wrt});
      ADD_FAILURE() << "autodiff differentiates " << op_name(GetParam())
                    << ", which the op table marks not differentiable";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has no gradient rule"), std::string::npos) << e.what();
    }
    return;
  }
  const GradResult r = grad(g->graph, loss, {wrt}, {.mark_outputs = true});
  const Value& dx = g->graph.value(r.of(wrt));
  const Tensor got = run_graph(g->graph, g->feeds).at(dx.name);
  EXPECT_EQ(got.dtype(), g->graph.value(wrt).type.dtype);
  EXPECT_EQ(got.shape(), g->graph.value(wrt).type.shape);
  EXPECT_TRUE(all_finite(got));
}

// f32 kernels against the CPU's (f64 where it accumulates); convolutions may run in TF32.
TEST_P(OpCoverage, CudaMatchesCpu) {
  if (!cuda_available())
    GTEST_SKIP() << "no CUDA device (or no CUDA backend in this build): only the CPU checks ran";
  std::optional<OneNodeGraph> g = graph();
  ASSERT_TRUE(g);
  const NamedTensors want = run_graph(g->graph, g->feeds);
  const NamedTensors got = run_graph(g->graph, g->feeds, {.device = Device::cuda});
  const bool tf32 = op_info(GetParam()).family == OpFamily::conv;
  for (ValueId v : g->outputs) {
    const std::string& name = g->graph.value(v).name;
    EXPECT_TRUE(all_close(got.at(name), want.at(name), tf32 ? 5e-3 : 1e-4, tf32 ? 5e-3 : 1e-5))
        << name;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOp, OpCoverage, ::testing::ValuesIn(every_op()),
                         [](const ::testing::TestParamInfo<OpKind>& p) {
                           return std::string(op_name(p.param));
                         });

// batch_norm's mixed-precision form (bf16 x, f32 parameters and statistics), which the
// every-op examples (all f32) do not reach: infers, runs on the CPU with the declared
// dtypes, differentiates (the training form through batch_norm_backward, the inference form
// through plain ops and casts), and CUDA matches the CPU.
TEST(OpCoverageMixedPrecision, BatchNormBf16WithF32Params) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "inference");
    OpExample example{
        BatchNormAttrs{.training = training},
        {random_tensor(DType::bf16, {2, 3, 4}, 51, -2, 2),
         random_tensor(DType::f32, {3}, 52, 0.5, 1.5), random_tensor(DType::f32, {3}, 53),
         random_tensor(DType::f32, {3}, 54), random_tensor(DType::f32, {3}, 55, 0.5, 1.5)}};
    OneNodeGraph g = build(OpKind::batch_norm, example);
    EXPECT_NO_THROW(g.graph.verify());
    ASSERT_EQ(g.outputs.size(), training ? 5u : 1u);
    EXPECT_EQ(g.graph.value(g.outputs[0]).type.dtype, DType::bf16);
    for (size_t o = 1; o < g.outputs.size(); ++o)
      EXPECT_EQ(g.graph.value(g.outputs[o]).type.dtype, DType::f32);
    const GradResult r = grad(g.graph, g.outputs[0], {g.inputs[0], g.inputs[1], g.inputs[2]},
                              {.mark_outputs = true});
    const NamedTensors got = run_graph(g.graph, g.feeds);
    for (ValueId v : g.graph.outputs()) {
      const Value& value = g.graph.value(v);
      SCOPED_TRACE(value.name);
      EXPECT_EQ(got.at(value.name).dtype(), value.type.dtype);
      EXPECT_TRUE(all_finite(got.at(value.name)));
    }
    EXPECT_EQ(got.at(g.graph.value(r.of(g.inputs[0])).name).dtype(), DType::bf16);
    EXPECT_EQ(got.at(g.graph.value(r.of(g.inputs[1])).name).dtype(), DType::f32);
    if (!cuda_available()) continue;
    const NamedTensors on_gpu = run_graph(g.graph, g.feeds, {.device = Device::cuda});
    for (ValueId v : g.graph.outputs()) {
      const std::string& name = g.graph.value(v).name;
      const bool low = g.graph.value(v).type.dtype == DType::bf16;
      EXPECT_TRUE(all_close(on_gpu.at(name), got.at(name), low ? 2e-2 : 1e-4, low ? 2e-2 : 1e-4))
          << name;
    }
  }
}

}  // namespace
}  // namespace fusebox::testing
