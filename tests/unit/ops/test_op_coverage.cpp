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
#include "testing.h"

namespace fusebox::testing {
namespace {

// One node's attributes and inputs (an undefined tensor is an absent optional input).
struct Example {
  Attrs attrs;
  std::vector<Tensor> inputs;
};

// A valid node of `op` on tiny inputs; inputs that must match a forward op's outputs
// (a backward op's y, saved statistics, ...) are computed by that forward op on the CPU.
std::optional<Example> tiny_example(OpKind op) {
  uint64_t seed = 1000 + 100 * uint64_t(op);
  auto uniform = [&](Shape shape, double lo = -1.0, double hi = 1.0) {
    return random_tensor(DType::f32, shape, seed++, lo, hi);
  };
  const Tensor labels = Tensor::from_vector<int64_t>({4}, {3, 0, 4, 1});
  auto mask = [&](Shape shape) {  // a bool tensor: uniform > 0
    return run_op(OpKind::greater, {}, {uniform(shape), Tensor::zeros(DType::f32, {})})[0];
  };
  const PoolAttrs pool{.kernel = {2, 2}};
  const SliceAttrs first_row{{0}, {1}, {}, {}};
  const PadAttrs reflect{{1, 1, 1, 1}, PadMode::reflect};
  switch (op) {
    case OpKind::conv:
      return Example{ConvAttrs{}, {uniform({1, 2, 5, 5}), uniform({4, 2, 3, 3}), uniform({4})}};
    case OpKind::conv_backward_data:
      return Example{ConvBackwardDataAttrs{{}, {5, 5}},
                     {uniform({1, 4, 3, 3}), uniform({4, 2, 3, 3}), uniform({2})}};
    case OpKind::conv_backward_filter:
      return Example{ConvBackwardFilterAttrs{{}, {3, 3}},
                     {uniform({1, 2, 5, 5}), uniform({1, 4, 3, 3})}};
    case OpKind::batch_norm:
      return Example{
          BatchNormAttrs{.training = true},
          {uniform({2, 3, 4}), uniform({3}), uniform({3}), uniform({3}), uniform({3}, 0.5, 1.5)}};
    case OpKind::layer_norm:
      return Example{NormAttrs{}, {uniform({2, 3}), uniform({3}), uniform({3})}};
    case OpKind::rms_norm:
      return Example{NormAttrs{}, {uniform({2, 3}), uniform({3})}};
    case OpKind::relu:
    case OpKind::silu:
    case OpKind::sigmoid:
    case OpKind::tanh:
    case OpKind::exp:
    case OpKind::neg:
    case OpKind::abs:
    case OpKind::erf:
    case OpKind::sin:
    case OpKind::cos:
    case OpKind::identity:
      return Example{{}, {uniform({2, 3})}};
    case OpKind::floor:
    case OpKind::ceil:
    case OpKind::round:
      return Example{{}, {uniform({2, 3}, -3.0, 3.0)}};
    case OpKind::log:
    case OpKind::sqrt:
    case OpKind::rsqrt:
    case OpKind::reciprocal:
      return Example{{}, {uniform({2, 3}, 0.5, 2.0)}};
    case OpKind::leaky_relu:
      return Example{LeakyReluAttrs{}, {uniform({2, 3})}};
    case OpKind::gelu:
      return Example{GeluAttrs{}, {uniform({2, 3})}};
    case OpKind::clip:
      return Example{ClipAttrs{-0.5, 0.5}, {uniform({2, 3})}};
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::max:
    case OpKind::min:
      return Example{{}, {uniform({2, 3}), uniform({3})}};
    case OpKind::div:
      return Example{{}, {uniform({2, 3}), uniform({3}, 0.5, 1.5)}};
    case OpKind::pow:
      return Example{{}, {uniform({2, 3}, 0.5, 2.0), uniform({3})}};
    // Ties, a NaN (compares false) and a broadcast operand.
    case OpKind::equal:
    case OpKind::less:
    case OpKind::greater:
    case OpKind::less_equal:
    case OpKind::greater_equal:
      return Example{{},
                     {Tensor::from_vector<float>({2, 3}, {0.5f, -1.0f, 2.0f, 0.25f, 0.5f, NAN}),
                      Tensor::from_vector<float>({3}, {0.5f, -1.0f, 1.0f})}};
    case OpKind::logical_not:
      return Example{{}, {mask({2, 3})}};
    case OpKind::logical_and:
    case OpKind::logical_or:
    case OpKind::logical_xor:
      return Example{{}, {mask({2, 3}), mask({3})}};
    case OpKind::where:
      return Example{{}, {mask({2, 3}), uniform({2, 3}), uniform({3})}};
    case OpKind::matmul:
      return Example{{}, {uniform({2, 3}), uniform({3, 4})}};
    case OpKind::gemm:
      return Example{GemmAttrs{}, {uniform({2, 3}), uniform({3, 4}), uniform({4})}};
    case OpKind::reduce_sum:
    case OpKind::reduce_mean:
    case OpKind::reduce_max:
      return Example{ReduceAttrs{{1}, true}, {uniform({2, 3})}};
    case OpKind::arg_max:
    case OpKind::arg_min:
      return Example{ArgReduceAttrs{.axis = 1, .select_last_index = op == OpKind::arg_min},
                     {uniform({2, 3, 4})}};
    case OpKind::softmax:
    case OpKind::log_softmax:
      return Example{SoftmaxAttrs{}, {uniform({2, 3})}};
    case OpKind::max_pool:
      return Example{PoolAttrs{.kernel = {2, 2}, .return_indices = true}, {uniform({1, 2, 4, 4})}};
    case OpKind::avg_pool:
      return Example{pool, {uniform({1, 2, 4, 4})}};
    case OpKind::global_avg_pool:
      return Example{{}, {uniform({1, 2, 3, 3})}};
    case OpKind::reshape:
      return Example{ReshapeAttrs{{3, 2}}, {uniform({2, 3})}};
    case OpKind::flatten:
      return Example{FlattenAttrs{}, {uniform({2, 3, 4})}};
    case OpKind::transpose:
      return Example{TransposeAttrs{}, {uniform({2, 3})}};
    case OpKind::concat:
      return Example{ConcatAttrs{0}, {uniform({2, 3}), uniform({1, 3})}};
    case OpKind::slice:
      return Example{first_row, {uniform({2, 3})}};
    case OpKind::pad:
      return Example{reflect, {uniform({2, 3})}};
    case OpKind::squeeze:
      return Example{AxesAttrs{}, {uniform({1, 3})}};
    case OpKind::unsqueeze:
      return Example{AxesAttrs{{0}}, {uniform({3})}};
    case OpKind::cast:
      return Example{CastAttrs{DType::f16}, {uniform({2, 3})}};
    case OpKind::constant:
      return Example{ConstantAttrs{uniform({2})}, {}};
    case OpKind::expand:
      return Example{ExpandAttrs{{2, 3}}, {uniform({3})}};
    case OpKind::gather_elements:
      return Example{
          GatherAttrs{1},
          {uniform({2, 3}), Tensor::from_vector<int64_t>({2, 4}, {2, 0, -1, 1, 1, 1, 0, 2})}};
    case OpKind::cumsum:
      return Example{CumSumAttrs{.axis = 1, .exclusive = true, .reverse = true},
                     {uniform({2, 3, 4})}};
    case OpKind::top_k:  // ties among the values (small integers) keep the lower index first
      return Example{TopKAttrs{.k = 3, .axis = 1},
                     {Tensor::from_vector<float>(
                         {2, 5, 2}, {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4})}};
    case OpKind::resize:  // bilinear, align_corners: up along one dim, down along the other
      return Example{ResizeAttrs{.sizes = {1, 2, 5, 2},
                                 .mode = ResizeMode::linear,
                                 .coordinates = ResizeCoordinates::align_corners},
                     {uniform({1, 2, 3, 4})}};
    case OpKind::gather:  // an embedding lookup with a repeated and a negative index
      return Example{GatherAttrs{0},
                     {uniform({5, 3}), Tensor::from_vector<int64_t>({2, 2}, {4, 0, -1, 2})}};
    case OpKind::cross_entropy:
      return Example{CrossEntropyAttrs{}, {uniform({4, 5}), labels, uniform({5}, 0.5, 1.5)}};
    case OpKind::unary_backward:
      return Example{UnaryBackwardAttrs{.op = OpKind::gelu}, {uniform({2, 3}), uniform({2, 3})}};
    case OpKind::binary_backward:
      return Example{BinaryBackwardAttrs{OpKind::div},
                     {uniform({2, 3}), uniform({2, 3}), uniform({3}, 0.5, 1.5)}};
    case OpKind::batch_norm_backward: {
      const BatchNormAttrs a{.training = true};
      const Tensor x = uniform({2, 3, 4}), scale = uniform({3}, 0.5, 1.5);
      const std::vector<Tensor> fwd = run_op(
          OpKind::batch_norm, a, {x, scale, uniform({3}), uniform({3}), uniform({3}, 0.5, 1.5)});
      return Example{a, {uniform({2, 3, 4}), x, scale, fwd[3], fwd[4]}};
    }
    case OpKind::layer_norm_backward: {
      const Tensor x = uniform({2, 3}), scale = uniform({3});
      const std::vector<Tensor> fwd =
          run_op(OpKind::layer_norm, NormAttrs{}, {x, scale, uniform({3})});
      return Example{NormAttrs{}, {uniform({2, 3}), x, scale, fwd[1], fwd[2]}};
    }
    case OpKind::rms_norm_backward: {
      const Tensor x = uniform({2, 3}), scale = uniform({3});
      const std::vector<Tensor> fwd = run_op(OpKind::rms_norm, NormAttrs{}, {x, scale});
      return Example{NormAttrs{}, {uniform({2, 3}), x, scale, fwd[1]}};
    }
    case OpKind::softmax_backward:
    case OpKind::log_softmax_backward: {
      const OpKind forward = op == OpKind::softmax_backward ? OpKind::softmax : OpKind::log_softmax;
      const Tensor y = run_op(forward, SoftmaxAttrs{}, {uniform({2, 3})})[0];
      return Example{SoftmaxAttrs{}, {uniform({2, 3}), y}};
    }
    case OpKind::cross_entropy_backward: {
      const Tensor logits = uniform({4, 5}), weight = uniform({5}, 0.5, 1.5);
      const Tensor log_prob =
          run_op(OpKind::cross_entropy, CrossEntropyAttrs{}, {logits, labels, weight})[1];
      return Example{CrossEntropyAttrs{}, {uniform({}), log_prob, labels, weight}};
    }
    case OpKind::reduce_max_backward: {
      const ReduceAttrs a{{1}, true};
      const Tensor x = uniform({2, 3});
      return Example{a, {uniform({2, 1}), x, run_op(OpKind::reduce_max, a, {x})[0]}};
    }
    case OpKind::max_pool_backward:
      return Example{PoolBackwardAttrs{pool, {1, 2, 4, 4}},
                     {uniform({1, 2, 3, 3}), uniform({1, 2, 4, 4})}};
    case OpKind::avg_pool_backward:
      return Example{PoolBackwardAttrs{pool, {1, 2, 4, 4}}, {uniform({1, 2, 3, 3})}};
    case OpKind::slice_backward:
      return Example{SliceBackwardAttrs{first_row, {2, 3}}, {uniform({1, 3})}};
    case OpKind::pad_backward:
      return Example{PadBackwardAttrs{reflect, {2, 3}}, {uniform({4, 5})}};
    case OpKind::resize_backward:  // cubic, half_pixel: 4 taps per dim overlap
      return Example{
          ResizeBackwardAttrs{ResizeAttrs{.sizes = {2, 7}, .mode = ResizeMode::cubic}, {2, 3}},
          {uniform({2, 7})}};
    case OpKind::gather_elements_backward:  // two indices read element [0, 2]
      return Example{
          GatherBackwardAttrs{GatherAttrs{1}, {2, 3}},
          {uniform({2, 4}), Tensor::from_vector<int64_t>({2, 4}, {2, 0, -1, 1, 1, 1, 0, 2})}};
    case OpKind::gather_backward:  // indices 4 and -1 both add into row 4
      return Example{GatherBackwardAttrs{GatherAttrs{0}, {5, 3}},
                     {uniform({2, 2, 3}), Tensor::from_vector<int64_t>({2, 2}, {4, 0, -1, 2})}};
    case OpKind::sgd_update:
      return Example{
          SgdAttrs{.momentum = 0.9},
          {uniform({2, 3}), uniform({2, 3}), uniform({2, 3}), Tensor::scalar(DType::f32, 0.1)}};
    case OpKind::adamw_update:  // with f16 loss scaling's grad_scale and skip
      return Example{AdamWAttrs{},
                     {uniform({2, 3}), uniform({2, 3}), uniform({2, 3}), uniform({2, 3}, 0.0, 1.0),
                      Tensor::scalar(DType::f32, 0.1), Tensor::scalar(DType::i64, 1),
                      Tensor::scalar(DType::f32, 0.5), Tensor::scalar(DType::f32, 0)}};
    case OpKind::nonfinite_any:
      return Example{{}, {uniform({2, 3}), uniform({4})}};
    case OpKind::all_reduce:  // a bucket of two, in a world of one
      return Example{AllReduceAttrs{}, {uniform({2, 3}), uniform({4})}};
    case OpKind::loss_scale_update:
      return Example{LossScaleAttrs{},
                     {Tensor::scalar(DType::f32, 1024), Tensor::scalar(DType::i64, 5),
                      Tensor::scalar(DType::f32, 0), Tensor::scalar(DType::i64, 2)}};
    case OpKind::fused_pointwise:  // t0=mul(in0,in1); t1=gelu(t0); t2=add(t1,in2)
      return Example{
          PointwiseProgram{3, {{OpKind::mul, {0, 1}}, {OpKind::gelu, {3}}, {OpKind::add, {4, 2}}}},
          {uniform({2, 3}), uniform({3}), uniform({})}};
    case OpKind::attention:  // q [1, 2, 3, 4], k and v [1, 2, 5, 4], a bias per head and key
      return Example{AttentionAttrs{0.5, false, true},
                     {uniform({1, 2, 3, 4}), uniform({1, 2, 5, 4}), uniform({1, 2, 5, 4}),
                      uniform({2, 1, 5})}};
    case OpKind::attention_backward: {  // y and lse from the forward, causal, with dbias
      const AttentionAttrs attrs{0.5, true, true};
      const Tensor q = uniform({2, 3, 4}), k = uniform({2, 5, 4}), v = uniform({2, 5, 3}),
                   bias = uniform({3, 5});
      const std::vector<Tensor> fwd = run_op(OpKind::attention, attrs, {q, k, v, bias});
      return Example{AttentionAttrs{0.5, true, true, true},
                     {uniform({2, 3, 3}), q, k, v, fwd[0], fwd[1], bias}};
    }
  }
  return std::nullopt;
}

// The example as a one-node graph (inputs "in<i>", every output marked) and its feeds.
struct OneNodeGraph {
  Graph graph{"op_coverage"};
  std::vector<ValueId> inputs;  // kNoValue for an absent optional input
  std::vector<ValueId> outputs;
  NamedTensors feeds;
};

OneNodeGraph build(OpKind op, const Example& example) {
  OneNodeGraph g;
  for (size_t i = 0; i < example.inputs.size(); ++i) {
    const Tensor& t = example.inputs[i];
    if (!t.defined()) {
      g.inputs.push_back(kNoValue);
      continue;
    }
    const std::string name = cat("in", i);
    g.inputs.push_back(g.graph.add_input(name, t.dtype(), t.shape()));
    g.feeds[name] = t;
  }
  g.outputs = g.graph.add_node(op, example.attrs, g.inputs, "node");
  for (ValueId v : g.outputs) g.graph.mark_output(v);
  return g;
}

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
    const std::optional<Example> example = tiny_example(GetParam());
    if (!example) {
      ADD_FAILURE() << "no tiny example for " << op_name(GetParam())
                    << ": add one to tiny_example() in " << __FILE__;
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

std::vector<OpKind> every_op() {
  std::vector<OpKind> ops;
  for (const OpInfo& info : kOpTable) ops.push_back(info.op);
  return ops;
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
    Example example{
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
