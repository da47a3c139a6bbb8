#include "op_examples.h"

#include <cmath>

#include "fusebox/ir/op_info.h"

namespace fusebox::testing {

std::optional<OpExample> tiny_example(OpKind op) {
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
      return OpExample{ConvAttrs{}, {uniform({1, 2, 5, 5}), uniform({4, 2, 3, 3}), uniform({4})}};
    case OpKind::conv_backward_data:
      return OpExample{ConvBackwardDataAttrs{{}, {5, 5}},
                       {uniform({1, 4, 3, 3}), uniform({4, 2, 3, 3}), uniform({2})}};
    case OpKind::conv_backward_filter:
      return OpExample{ConvBackwardFilterAttrs{{}, {3, 3}},
                       {uniform({1, 2, 5, 5}), uniform({1, 4, 3, 3})}};
    case OpKind::batch_norm:
      return OpExample{
          BatchNormAttrs{.training = true},
          {uniform({2, 3, 4}), uniform({3}), uniform({3}), uniform({3}), uniform({3}, 0.5, 1.5)}};
    case OpKind::batch_norm_apply:
      return OpExample{
          BatchNormAttrs{.relu = true},
          {uniform({2, 3, 4}), uniform({3}), uniform({3}), uniform({3}), uniform({3}, 0.5, 1.5)}};
    case OpKind::layer_norm:
      return OpExample{NormAttrs{}, {uniform({2, 3}), uniform({3}), uniform({3})}};
    case OpKind::rms_norm:
      return OpExample{NormAttrs{}, {uniform({2, 3}), uniform({3})}};
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
      return OpExample{{}, {uniform({2, 3})}};
    case OpKind::floor:
    case OpKind::ceil:
    case OpKind::round:
      return OpExample{{}, {uniform({2, 3}, -3.0, 3.0)}};
    case OpKind::log:
    case OpKind::sqrt:
    case OpKind::rsqrt:
    case OpKind::reciprocal:
      return OpExample{{}, {uniform({2, 3}, 0.5, 2.0)}};
    case OpKind::leaky_relu:
      return OpExample{LeakyReluAttrs{}, {uniform({2, 3})}};
    case OpKind::gelu:
      return OpExample{GeluAttrs{}, {uniform({2, 3})}};
    case OpKind::clip:
      return OpExample{ClipAttrs{-0.5, 0.5}, {uniform({2, 3})}};
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::max:
    case OpKind::min:
      return OpExample{{}, {uniform({2, 3}), uniform({3})}};
    case OpKind::div:
      return OpExample{{}, {uniform({2, 3}), uniform({3}, 0.5, 1.5)}};
    case OpKind::pow:
      return OpExample{{}, {uniform({2, 3}, 0.5, 2.0), uniform({3})}};
    // Ties, a NaN (compares false) and a broadcast operand.
    case OpKind::equal:
    case OpKind::less:
    case OpKind::greater:
    case OpKind::less_equal:
    case OpKind::greater_equal:
      return OpExample{{},
                       {Tensor::from_vector<float>({2, 3}, {0.5f, -1.0f, 2.0f, 0.25f, 0.5f, NAN}),
                        Tensor::from_vector<float>({3}, {0.5f, -1.0f, 1.0f})}};
    case OpKind::logical_not:
      return OpExample{{}, {mask({2, 3})}};
    case OpKind::logical_and:
    case OpKind::logical_or:
    case OpKind::logical_xor:
      return OpExample{{}, {mask({2, 3}), mask({3})}};
    case OpKind::where:
      return OpExample{{}, {mask({2, 3}), uniform({2, 3}), uniform({3})}};
    case OpKind::matmul:
      return OpExample{{}, {uniform({2, 3}), uniform({3, 4})}};
    case OpKind::gemm:
      return OpExample{GemmAttrs{}, {uniform({2, 3}), uniform({3, 4}), uniform({4})}};
    case OpKind::reduce_sum:
    case OpKind::reduce_mean:
    case OpKind::reduce_max:
      return OpExample{ReduceAttrs{{1}, true}, {uniform({2, 3})}};
    case OpKind::arg_max:
    case OpKind::arg_min:
      return OpExample{ArgReduceAttrs{.axis = 1, .select_last_index = op == OpKind::arg_min},
                       {uniform({2, 3, 4})}};
    case OpKind::softmax:
    case OpKind::log_softmax:
      return OpExample{SoftmaxAttrs{}, {uniform({2, 3})}};
    case OpKind::max_pool:
      return OpExample{PoolAttrs{.kernel = {2, 2}, .return_indices = true},
                       {uniform({1, 2, 4, 4})}};
    case OpKind::avg_pool:
      return OpExample{pool, {uniform({1, 2, 4, 4})}};
    case OpKind::global_avg_pool:
      return OpExample{{}, {uniform({1, 2, 3, 3})}};
    case OpKind::reshape:
      return OpExample{ReshapeAttrs{{3, 2}}, {uniform({2, 3})}};
    case OpKind::flatten:
      return OpExample{FlattenAttrs{}, {uniform({2, 3, 4})}};
    case OpKind::transpose:
      return OpExample{TransposeAttrs{}, {uniform({2, 3})}};
    case OpKind::concat:
      return OpExample{ConcatAttrs{0}, {uniform({2, 3}), uniform({1, 3})}};
    case OpKind::slice:
      return OpExample{first_row, {uniform({2, 3})}};
    case OpKind::pad:
      return OpExample{reflect, {uniform({2, 3})}};
    case OpKind::squeeze:
      return OpExample{AxesAttrs{}, {uniform({1, 3})}};
    case OpKind::unsqueeze:
      return OpExample{AxesAttrs{{0}}, {uniform({3})}};
    case OpKind::cast:
      return OpExample{CastAttrs{DType::f16}, {uniform({2, 3})}};
    case OpKind::constant:
      return OpExample{ConstantAttrs{uniform({2})}, {}};
    case OpKind::expand:
      return OpExample{ExpandAttrs{{2, 3}}, {uniform({3})}};
    case OpKind::gather_elements:
      return OpExample{
          GatherAttrs{1},
          {uniform({2, 3}), Tensor::from_vector<int64_t>({2, 4}, {2, 0, -1, 1, 1, 1, 0, 2})}};
    case OpKind::cumsum:
      return OpExample{CumSumAttrs{.axis = 1, .exclusive = true, .reverse = true},
                       {uniform({2, 3, 4})}};
    case OpKind::top_k:  // ties among the values (small integers) keep the lower index first
      return OpExample{TopKAttrs{.k = 3, .axis = 1},
                       {Tensor::from_vector<float>({2, 5, 2}, {3, 1, 4, 1, 5, 9, 2, 6, 5, 3,
                                                               5, 8, 9, 7, 9, 3, 2, 3, 8, 4})}};
    case OpKind::resize:  // bilinear, align_corners: up along one dim, down along the other
      return OpExample{ResizeAttrs{.sizes = {1, 2, 5, 2},
                                   .mode = ResizeMode::linear,
                                   .coordinates = ResizeCoordinates::align_corners},
                       {uniform({1, 2, 3, 4})}};
    case OpKind::gather:  // an embedding lookup with a repeated and a negative index
      return OpExample{GatherAttrs{0},
                       {uniform({5, 3}), Tensor::from_vector<int64_t>({2, 2}, {4, 0, -1, 2})}};
    case OpKind::cross_entropy:
      return OpExample{CrossEntropyAttrs{}, {uniform({4, 5}), labels, uniform({5}, 0.5, 1.5)}};
    case OpKind::unary_backward:
      return OpExample{UnaryBackwardAttrs{.op = OpKind::gelu}, {uniform({2, 3}), uniform({2, 3})}};
    case OpKind::binary_backward:
      return OpExample{BinaryBackwardAttrs{OpKind::div},
                       {uniform({2, 3}), uniform({2, 3}), uniform({3}, 0.5, 1.5)}};
    case OpKind::batch_norm_backward: {
      const BatchNormAttrs a{.training = true};
      const Tensor x = uniform({2, 3, 4}), scale = uniform({3}, 0.5, 1.5);
      const std::vector<Tensor> fwd = run_op(
          OpKind::batch_norm, a, {x, scale, uniform({3}), uniform({3}), uniform({3}, 0.5, 1.5)});
      return OpExample{a, {uniform({2, 3, 4}), x, scale, fwd[3], fwd[4]}};
    }
    case OpKind::layer_norm_backward: {
      const Tensor x = uniform({2, 3}), scale = uniform({3});
      const std::vector<Tensor> fwd =
          run_op(OpKind::layer_norm, NormAttrs{}, {x, scale, uniform({3})});
      return OpExample{NormAttrs{}, {uniform({2, 3}), x, scale, fwd[1], fwd[2]}};
    }
    case OpKind::rms_norm_backward: {
      const Tensor x = uniform({2, 3}), scale = uniform({3});
      const std::vector<Tensor> fwd = run_op(OpKind::rms_norm, NormAttrs{}, {x, scale});
      return OpExample{NormAttrs{}, {uniform({2, 3}), x, scale, fwd[1]}};
    }
    case OpKind::softmax_backward:
    case OpKind::log_softmax_backward: {
      const OpKind forward = op == OpKind::softmax_backward ? OpKind::softmax : OpKind::log_softmax;
      const Tensor y = run_op(forward, SoftmaxAttrs{}, {uniform({2, 3})})[0];
      return OpExample{SoftmaxAttrs{}, {uniform({2, 3}), y}};
    }
    case OpKind::cross_entropy_backward: {
      const Tensor logits = uniform({4, 5}), weight = uniform({5}, 0.5, 1.5);
      const Tensor log_prob =
          run_op(OpKind::cross_entropy, CrossEntropyAttrs{}, {logits, labels, weight})[1];
      return OpExample{CrossEntropyAttrs{}, {uniform({}), log_prob, labels, weight}};
    }
    case OpKind::reduce_max_backward: {
      const ReduceAttrs a{{1}, true};
      const Tensor x = uniform({2, 3});
      return OpExample{a, {uniform({2, 1}), x, run_op(OpKind::reduce_max, a, {x})[0]}};
    }
    case OpKind::max_pool_backward:
      return OpExample{PoolBackwardAttrs{pool, {1, 2, 4, 4}},
                       {uniform({1, 2, 3, 3}), uniform({1, 2, 4, 4})}};
    case OpKind::avg_pool_backward:
      return OpExample{PoolBackwardAttrs{pool, {1, 2, 4, 4}}, {uniform({1, 2, 3, 3})}};
    case OpKind::slice_backward:
      return OpExample{SliceBackwardAttrs{first_row, {2, 3}}, {uniform({1, 3})}};
    case OpKind::pad_backward:
      return OpExample{PadBackwardAttrs{reflect, {2, 3}}, {uniform({4, 5})}};
    case OpKind::resize_backward:  // cubic, half_pixel: 4 taps per dim overlap
      return OpExample{
          ResizeBackwardAttrs{ResizeAttrs{.sizes = {2, 7}, .mode = ResizeMode::cubic}, {2, 3}},
          {uniform({2, 7})}};
    case OpKind::gather_elements_backward:  // two indices read element [0, 2]
      return OpExample{
          GatherBackwardAttrs{GatherAttrs{1}, {2, 3}},
          {uniform({2, 4}), Tensor::from_vector<int64_t>({2, 4}, {2, 0, -1, 1, 1, 1, 0, 2})}};
    case OpKind::gather_backward:  // indices 4 and -1 both add into row 4
      return OpExample{GatherBackwardAttrs{GatherAttrs{0}, {5, 3}},
                       {uniform({2, 2, 3}), Tensor::from_vector<int64_t>({2, 2}, {4, 0, -1, 2})}};
    case OpKind::sgd_update:
      return OpExample{
          SgdAttrs{.momentum = 0.9},
          {uniform({2, 3}), uniform({2, 3}), uniform({2, 3}), Tensor::scalar(DType::f32, 0.1)}};
    case OpKind::adamw_update:  // with f16 loss scaling's grad_scale and skip
      return OpExample{
          AdamWAttrs{},
          {uniform({2, 3}), uniform({2, 3}), uniform({2, 3}), uniform({2, 3}, 0.0, 1.0),
           Tensor::scalar(DType::f32, 0.1), Tensor::scalar(DType::i64, 1),
           Tensor::scalar(DType::f32, 0.5), Tensor::scalar(DType::f32, 0)}};
    case OpKind::nonfinite_any:
      return OpExample{{}, {uniform({2, 3}), uniform({4})}};
    case OpKind::all_reduce:  // a bucket of two, in a world of one
      return OpExample{AllReduceAttrs{}, {uniform({2, 3}), uniform({4})}};
    case OpKind::loss_scale_update:
      return OpExample{LossScaleAttrs{},
                       {Tensor::scalar(DType::f32, 1024), Tensor::scalar(DType::i64, 5),
                        Tensor::scalar(DType::f32, 0), Tensor::scalar(DType::i64, 2)}};
    case OpKind::fused_pointwise:  // t0=mul(in0,in1); t1=gelu(t0); t2=add(t1,in2)
      return OpExample{
          PointwiseProgram{3, {{OpKind::mul, {0, 1}}, {OpKind::gelu, {3}}, {OpKind::add, {4, 2}}}},
          {uniform({2, 3}), uniform({3}), uniform({})}};
    case OpKind::attention:  // q [1, 2, 3, 4], k and v [1, 2, 5, 4], a bias per head and key
      return OpExample{AttentionAttrs{0.5, false, true},
                       {uniform({1, 2, 3, 4}), uniform({1, 2, 5, 4}), uniform({1, 2, 5, 4}),
                        uniform({2, 1, 5})}};
    case OpKind::attention_backward: {  // y and lse from the forward, causal, with dbias
      const AttentionAttrs attrs{0.5, true, true};
      const Tensor q = uniform({2, 3, 4}), k = uniform({2, 5, 4}), v = uniform({2, 5, 3}),
                   bias = uniform({3, 5});
      const std::vector<Tensor> fwd = run_op(OpKind::attention, attrs, {q, k, v, bias});
      return OpExample{AttentionAttrs{0.5, true, true, true},
                       {uniform({2, 3, 3}), q, k, v, fwd[0], fwd[1], bias}};
    }
  }
  return std::nullopt;
}

OneNodeGraph build(OpKind op, const OpExample& example) {
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

std::vector<OpKind> every_op() {
  std::vector<OpKind> ops;
  for (const OpInfo& info : kOpTable) ops.push_back(info.op);
  return ops;
}

}  // namespace fusebox::testing
