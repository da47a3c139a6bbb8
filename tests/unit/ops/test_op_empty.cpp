// Every OpKind with a zero-sized dimension: each op's tiny example (op_examples.h) with one
// input's dim set to 0, one variant per (input, dim), plus a "batch" variant that empties
// dim 0 of every input sharing the first input's leading extent. Inference either refuses
// (a fusebox::Error naming the node) or accepts; then the CPU gives outputs of exactly the
// inferred shapes, and an output that still has elements holds the ONNX/PyTorch answer
// (empty_input_answer below: reductions' identities, beta * c of a gemm over K = 0, zeros for
// gradients of an empty batch, ...). Where a GPU is present, CUDA gives the CPU's results,
// NaNs included. OpEmptyShared adds the extents two inputs share (K, a head dim), which
// emptying one input at a time cannot reach.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/ir/op_info.h"
#include "op_examples.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr int kBatchVariant = -1;

struct ZeroDim {
  OpKind op;
  int input;  // kBatchVariant: dim 0 of every batch-like input
  int dim;
};

// The inputs a variant empties: (input, dim) pairs. For an op without inputs (constant) the
// attribute's value stands in as input 0.
std::vector<std::pair<size_t, size_t>> emptied(const ZeroDim& v, const OpExample& example) {
  if (v.input != kBatchVariant) return {{size_t(v.input), size_t(v.dim)}};
  // Batch-like: dim 0 of each input whose leading extent is that of the first input of rank
  // >= 1 (conv's x but not w; cross_entropy's logits and labels but not the class weights).
  std::vector<std::pair<size_t, size_t>> out;
  std::optional<int64_t> batch;
  for (size_t i = 0; i < example.inputs.size(); ++i) {
    const Tensor& t = example.inputs[i];
    if (!t.defined() || t.rank() == 0) continue;
    if (!batch) batch = t.dim(0);
    if (t.dim(0) == *batch) out.push_back({i, 0});
  }
  return out;
}

Tensor with_zero_dim(const Tensor& t, size_t dim) {
  Shape shape = t.shape();
  shape[dim] = 0;
  return Tensor::zeros(t.dtype(), shape);
}

OpExample zeroed(const ZeroDim& v, OpExample example) {
  if (example.inputs.empty()) {  // constant
    auto& value = std::get<ConstantAttrs>(example.attrs).value;
    value = with_zero_dim(value, size_t(v.dim));
    return example;
  }
  for (const auto& [input, dim] : emptied(v, example))
    example.inputs[input] = with_zero_dim(example.inputs[input], dim);
  return example;
}

std::vector<ZeroDim> every_zero_dim() {
  std::vector<ZeroDim> variants;
  for (OpKind op : every_op()) {
    const std::optional<OpExample> example = tiny_example(op);
    if (!example) continue;  // test_op_coverage.cpp fails on it
    if (example->inputs.empty()) {
      const Tensor& value = std::get<ConstantAttrs>(example->attrs).value;
      for (int d = 0; d < int(value.rank()); ++d) variants.push_back({op, 0, d});
      continue;
    }
    for (size_t i = 0; i < example->inputs.size(); ++i) {
      const Tensor& t = example->inputs[i];
      if (!t.defined()) continue;
      for (int d = 0; d < int(t.rank()); ++d) variants.push_back({op, int(i), d});
    }
    // Emptying a single input repeats an (input, 0) variant.
    if (emptied({op, kBatchVariant, 0}, *example).size() > 1)
      variants.push_back({op, kBatchVariant, 0});
  }
  return variants;
}

// The inputs that still have elements.
std::vector<Tensor> non_empty(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs)
    if (t.defined() && t.numel() > 0) out.push_back(t);
  return out;
}

// Output `o` of `op` run with every zero extent of the empty inputs widened to 1, zeros: the
// answer of a product over an empty inner dim (gemm, attention's head dims), computed
// through the kernels' non-empty path. std::nullopt when the widening changes the output's
// shape (it widened more than the inner dim).
std::optional<Tensor> widened_answer(OpKind op, const OpExample& example, size_t o,
                                     const TensorType& type) {
  std::vector<Tensor> inputs = example.inputs;
  for (Tensor& t : inputs) {
    if (!t.defined() || t.numel() > 0) continue;
    Shape shape = t.shape();
    std::replace(shape.begin(), shape.end(), int64_t(0), int64_t(1));
    t = Tensor::zeros(t.dtype(), shape);
  }
  const Tensor got = run_op(op, example.attrs, inputs)[o];
  if (got.shape() != type.shape) return std::nullopt;
  return got;
}

// The ONNX/PyTorch answer for output `o` of `op` (of `type`, which has elements) on
// `example`, some input of which is empty; std::nullopt where none is written down.
//   reduce_sum 0, reduce_max -inf (ONNX ReduceMax of an empty set; ReduceMin, imported as
//   -max(-x), gives +inf), reduce_mean NaN (0 / 0, as onnxruntime and torch.mean);
//   ReduceL2 = sqrt(sum x^2) gives 0 and ReduceLogSumExp -inf through them. A product over
//   an empty inner dim sums nothing: matmul zeros, gemm beta * c (and its activation),
//   attention over head dim 0 the bias's softmax. Gradients over an empty batch are zeros.
//   cross_entropy's mean over no samples is NaN (torch.nn.functional.cross_entropy).
std::optional<Tensor> empty_input_answer(OpKind op, const OpExample& example, size_t o,
                                         const TensorType& type) {
  const auto filled = [&](double value) { return Tensor::full(type.dtype, type.shape, value); };
  // Gradients summed over no elements: dscale and dbias of an empty batch, the scatter target
  // of an empty gather, a filter's gradient over a batch of 0.
  if (op_info(op).family == OpFamily::backward || op == OpKind::conv_backward_filter)
    return filled(0.0);
  switch (op) {
    case OpKind::reduce_sum:
      return filled(0.0);
    case OpKind::reduce_max:
      return filled(-INFINITY);
    case OpKind::reduce_mean:
    case OpKind::global_avg_pool:
      return filled(NAN);
    case OpKind::matmul:
      return filled(0.0);
    case OpKind::gemm:  // beta * c, then the activation
      return widened_answer(op, example, o, type);
    case OpKind::cross_entropy:
      if (o == 0 && std::get<CrossEntropyAttrs>(example.attrs).reduction == Reduction::mean)
        return filled(NAN);
      if (o == 0 && std::get<CrossEntropyAttrs>(example.attrs).reduction == Reduction::sum)
        return filled(0.0);
      return std::nullopt;
    case OpKind::nonfinite_any: {  // over the elements there are
      const std::vector<Tensor> rest = non_empty(example.inputs);
      return rest.empty() ? filled(0.0) : run_op(op, example.attrs, rest)[0];
    }
    case OpKind::concat:  // the inputs that have elements, concatenated
      return run_op(op, example.attrs, non_empty(example.inputs))[0];
    case OpKind::all_reduce:  // a world of one: each output its own input
      return example.inputs[o];
    case OpKind::pad:  // a constant pad of an empty x: the pad value throughout
      return filled(std::get<PadAttrs>(example.attrs).value);
    case OpKind::attention:  // an empty head dim: scores of the bias alone; lse when dv = 0
      return widened_answer(op, example, o, type);
    default:
      return std::nullopt;
  }
}

::testing::AssertionResult names_the_node(const Error& e) {
  if (e.where().find("'node'") != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the error does not name node 'node': " << e.what();
}

// The node of `op` on `example` (some input empty): refused at inference with an Error naming
// it, or run on the CPU to outputs of the inferred shapes holding the ONNX/PyTorch answer, and
// on CUDA (where present) to the CPU's results, NaNs included.
void check_empty_node(OpKind op, const OpExample& example) {
  std::optional<OneNodeGraph> g;
  try {
    g.emplace(build(op, example));
  } catch (const Error& e) {
    ::testing::Test::RecordProperty("outcome", cat("refuses: ", e.what()));
    EXPECT_TRUE(names_the_node(e));
    return;
  }
  ::testing::Test::RecordProperty("outcome", "computes");
  EXPECT_NO_THROW(g->graph.verify());
  const NamedTensors got = run_graph(g->graph, g->feeds);  // an Error here fails the test
  for (size_t o = 0; o < g->outputs.size(); ++o) {
    const Value& value = g->graph.value(g->outputs[o]);
    SCOPED_TRACE(value.name);
    const Tensor& t = got.at(value.name);
    EXPECT_EQ(t.dtype(), value.type.dtype);
    ASSERT_EQ(t.shape(), value.type.shape);
    if (t.numel() == 0) continue;
    const std::optional<Tensor> want = empty_input_answer(op, example, o, value.type);
    if (!want) {
      ADD_FAILURE() << "output " << o << " " << shape_str(t.shape())
                    << " has elements although an input is empty; write the ONNX/PyTorch answer "
                       "into empty_input_answer() or refuse the node at inference";
      continue;
    }
    EXPECT_TRUE(all_close(t, *want, 1e-6, 1e-6));
  }
  if (!cuda_available()) return;  // the GPU machine runs the rest
  const NamedTensors on_gpu = run_graph(g->graph, g->feeds, {.device = Device::cuda});
  for (ValueId id : g->outputs) {
    const std::string& name = g->graph.value(id).name;
    EXPECT_TRUE(all_close(on_gpu.at(name), got.at(name), 1e-4, 1e-5)) << name << " on CUDA";
  }
}

class OpEmpty : public ::testing::TestWithParam<ZeroDim> {};

TEST_P(OpEmpty, RefusesAtInferenceOrComputesTheOnnxAnswer) {
  const ZeroDim v = GetParam();
  check_empty_node(v.op, zeroed(v, *tiny_example(v.op)));
}

INSTANTIATE_TEST_SUITE_P(EveryOp, OpEmpty, ::testing::ValuesIn(every_zero_dim()),
                         [](const ::testing::TestParamInfo<ZeroDim>& p) {
                           const ZeroDim& v = p.param;
                           return v.input == kBatchVariant
                                      ? cat(op_name(v.op), "_batch")
                                      : cat(op_name(v.op), "_in", v.input, "_dim", v.dim);
                         });

// Empty extents that two inputs share, which emptying one input at a time cannot reach.
struct SharedEmpty {
  const char* name;
  OpKind op;
  OpExample example;
  bool computes;  // else inference refuses
};

std::vector<SharedEmpty> shared_empty_cases() {
  const auto uniform = [](Shape shape, uint64_t seed) {
    return random_tensor(DType::f32, shape, seed);
  };
  const auto zeros = [](Shape shape) { return Tensor::zeros(DType::f32, shape); };
  return {
      // K = 0: zeros, gemm's beta * c (then its activation), as numpy and torch.addmm.
      {"matmul_k0", OpKind::matmul, {{}, {zeros({2, 0}), zeros({0, 4})}}, true},
      {"matmul_batched_k0", OpKind::matmul, {{}, {zeros({3, 2, 0}), zeros({0, 4})}}, true},
      {"gemm_k0",
       OpKind::gemm,
       {GemmAttrs{.trans_b = true, .beta = 0.5}, {zeros({2, 0}), zeros({4, 0}), uniform({4}, 1)}},
       true},
      {"gemm_k0_relu",
       OpKind::gemm,
       {GemmAttrs{.activation = {Activation::relu}},
        {zeros({2, 0}), zeros({0, 4}), uniform({4}, 2)}},
       true},
      // q and k with head dim 0: the scores are the bias alone.
      {"attention_d0",
       OpKind::attention,
       {AttentionAttrs{0.5, false, true},
        {zeros({1, 2, 3, 0}), zeros({1, 2, 5, 0}), uniform({1, 2, 5, 4}, 3),
         uniform({2, 1, 5}, 4)}},
       true},
      // No keys for existing queries: a softmax over nothing.
      {"attention_tk0",
       OpKind::attention,
       {AttentionAttrs{0.5, false, true},
        {uniform({1, 2, 3, 4}, 5), zeros({1, 2, 0, 4}), zeros({1, 2, 0, 4})}},
       false},
      // A constant pad of an empty dim: the pad value.
      {"pad_constant",
       OpKind::pad,
       {PadAttrs{{1, 0, 1, 0}, PadMode::constant, 2.5}, {zeros({0, 3})}},
       true},
      // Every axis of an empty x to a scalar.
      {"reduce_sum_all", OpKind::reduce_sum, {ReduceAttrs{{}, false}, {zeros({0, 3})}}, true},
      {"reduce_max_all", OpKind::reduce_max, {ReduceAttrs{{}, false}, {zeros({2, 0})}}, true},
      // Inference batch norm of a batch of 0 (training refuses: no batch statistics).
      {"batch_norm_inference",
       OpKind::batch_norm,
       {BatchNormAttrs{},
        {zeros({0, 3, 4}), uniform({3}, 6), uniform({3}, 7), uniform({3}, 8),
         random_tensor(DType::f32, {3}, 9, 0.5, 1.5)}},
       true},
      // nonfinite_any over empty tensors only: nothing is non-finite.
      {"nonfinite_any_all_empty", OpKind::nonfinite_any, {{}, {zeros({0, 3}), zeros({0})}}, true},
      // A transposed convolution of a batch of 0.
      {"conv_backward_data_batch0",
       OpKind::conv_backward_data,
       {ConvBackwardDataAttrs{{.strides = {2, 2}}, {7, 7}},
        {zeros({0, 4, 3, 3}), uniform({4, 2, 3, 3}, 10)}},
       true},
  };
}

class OpEmptyShared : public ::testing::TestWithParam<SharedEmpty> {};

TEST_P(OpEmptyShared, RefusesAtInferenceOrComputesTheOnnxAnswer) {
  const SharedEmpty& c = GetParam();
  if (c.computes)
    EXPECT_NO_THROW(build(c.op, c.example)) << c.name << " should compute";
  else
    EXPECT_THROW(build(c.op, c.example), Error) << c.name << " should be refused at inference";
  check_empty_node(c.op, c.example);
}

INSTANTIATE_TEST_SUITE_P(Cases, OpEmptyShared, ::testing::ValuesIn(shared_empty_cases()),
                         [](const ::testing::TestParamInfo<SharedEmpty>& p) {
                           return std::string(p.param.name);
                         });

}  // namespace
}  // namespace fusebox::testing
