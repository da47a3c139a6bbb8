// Checks every op gets: a valid sample infers (and survives Graph::verify), input
// counts are enforced, the attribute alternative must match, and std::monostate is
// accepted exactly for ops whose attribute struct is entirely defaultable.
#include <set>

#include "fusebox/ir/op_info.h"
#include "infer_testing.h"

// Designated initialisers (ConvAttrs{.strides = ...}) leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

struct Sample {
  Attrs attrs;
  std::vector<In> inputs;
  size_t outputs = 1;
};

// One valid node per op; nullopt for an op nobody wrote a sample for.
std::optional<Sample> sample(OpKind op) {
  const TensorType x23 = f32({2, 3});
  switch (op) {
    case OpKind::conv:
      return Sample{ConvAttrs{}, {f32({1, 2, 5, 5}), f32({4, 2, 3, 3}), f32({4})}};
    case OpKind::conv_backward_data:
      return Sample{ConvBackwardDataAttrs{{}, {5, 5}},
                    {f32({1, 4, 3, 3}), f32({4, 2, 3, 3}), f32({2})}};
    case OpKind::conv_backward_filter:
      return Sample{ConvBackwardFilterAttrs{{}, {3, 3}}, {f32({1, 2, 5, 5}), f32({1, 4, 3, 3})}};
    case OpKind::batch_norm:
      return Sample{BatchNormAttrs{.training = true},
                    {f32({2, 3, 4}), f32({3}), f32({3}), f32({3}), f32({3})},
                    5};
    case OpKind::batch_norm_apply:
      return Sample{BatchNormAttrs{}, {f32({2, 3, 4}), f32({3}), f32({3}), f32({3}), f32({3})}};
    case OpKind::layer_norm:
      return Sample{NormAttrs{}, {x23, f32({3}), f32({3})}, 3};
    case OpKind::rms_norm:
      return Sample{NormAttrs{}, {x23, f32({3})}, 2};
    case OpKind::relu:
    case OpKind::silu:
    case OpKind::sigmoid:
    case OpKind::tanh:
    case OpKind::exp:
    case OpKind::log:
    case OpKind::sqrt:
    case OpKind::rsqrt:
    case OpKind::reciprocal:
    case OpKind::neg:
    case OpKind::abs:
    case OpKind::erf:
    case OpKind::sin:
    case OpKind::cos:
    case OpKind::floor:
    case OpKind::ceil:
    case OpKind::round:
    case OpKind::identity:
      return Sample{{}, {x23}};
    case OpKind::leaky_relu:
      return Sample{LeakyReluAttrs{}, {x23}};
    case OpKind::gelu:
      return Sample{GeluAttrs{}, {x23}};
    case OpKind::clip:
      return Sample{ClipAttrs{0, 6}, {x23}};
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
    case OpKind::max:
    case OpKind::min:
    case OpKind::pow:
      return Sample{{}, {x23, f32({3})}};
    case OpKind::equal:
    case OpKind::less:
    case OpKind::greater:
    case OpKind::less_equal:
    case OpKind::greater_equal:
      return Sample{{}, {x23, f32({3})}};
    case OpKind::logical_not:
      return Sample{{}, {typed(DType::boolean, {2, 3})}};
    case OpKind::logical_and:
    case OpKind::logical_or:
    case OpKind::logical_xor:
      return Sample{{}, {typed(DType::boolean, {2, 3}), typed(DType::boolean, {1})}};
    case OpKind::where:
      return Sample{{}, {typed(DType::boolean, {2, 1}), x23, f32({3})}};
    case OpKind::matmul:
      return Sample{{}, {x23, f32({3, 4})}};
    case OpKind::gemm:
      return Sample{GemmAttrs{}, {x23, f32({3, 4}), f32({4})}};
    case OpKind::reduce_sum:
    case OpKind::reduce_mean:
    case OpKind::reduce_max:
      return Sample{ReduceAttrs{{1}, true}, {x23}};
    case OpKind::arg_max:
    case OpKind::arg_min:
      return Sample{ArgReduceAttrs{.axis = -1, .keepdims = false}, {x23}};
    case OpKind::softmax:
    case OpKind::log_softmax:
      return Sample{SoftmaxAttrs{}, {x23}};
    case OpKind::attention:
      return Sample{AttentionAttrs{0.5, true},
                    {f32({2, 3, 4, 8}), f32({2, 3, 6, 8}), f32({2, 3, 6, 5}), f32({2, 1, 1, 6})}};
    case OpKind::attention_backward:  // dy, q, k, v, y, lse, bias -> dq, dk, dv, dbias
      return Sample{AttentionAttrs{0.5, true, true, true},
                    {f32({2, 4, 5}), f32({2, 4, 8}), f32({2, 6, 8}), f32({2, 6, 5}), f32({2, 4, 5}),
                     f32({2, 4}), f32({4, 6})},
                    4};
    case OpKind::max_pool:
      return Sample{PoolAttrs{.kernel = {2, 2}, .return_indices = true}, {f32({1, 1, 4, 4})}, 2};
    case OpKind::avg_pool:
      return Sample{PoolAttrs{.kernel = {2, 2}}, {f32({1, 1, 4, 4})}};
    case OpKind::global_avg_pool:
      return Sample{{}, {f32({1, 2, 3, 3})}};
    case OpKind::reshape:
      return Sample{ReshapeAttrs{{-1}}, {x23}};
    case OpKind::flatten:
      return Sample{FlattenAttrs{}, {f32({2, 3, 4})}};
    case OpKind::transpose:
      return Sample{TransposeAttrs{}, {x23}};
    case OpKind::concat:
      return Sample{ConcatAttrs{0}, {x23, f32({1, 3})}};
    case OpKind::slice:
      return Sample{SliceAttrs{{0}, {1}, {}, {}}, {x23}};
    case OpKind::pad:
      return Sample{PadAttrs{{1, 1, 1, 1}}, {x23}};
    case OpKind::squeeze:
      return Sample{AxesAttrs{}, {f32({1, 3})}};
    case OpKind::unsqueeze:
      return Sample{AxesAttrs{{0}}, {f32({3})}};
    case OpKind::cast:
      return Sample{CastAttrs{DType::f16}, {f32({3})}};
    case OpKind::constant:
      return Sample{ConstantAttrs{Tensor::zeros(DType::f32, {2})}, {}};
    case OpKind::cross_entropy:
      return Sample{CrossEntropyAttrs{}, {f32({4, 10}), typed(DType::i64, {4}), f32({10})}, 2};
    case OpKind::expand:
      return Sample{ExpandAttrs{{2, 3}}, {f32({3})}};
    case OpKind::gather:
      return Sample{GatherAttrs{.axis = 1}, {x23, typed(DType::i64, {4, 5})}};
    case OpKind::gather_elements:
      return Sample{GatherAttrs{.axis = 1}, {x23, typed(DType::i32, {1, 3})}};
    case OpKind::cumsum:
      return Sample{CumSumAttrs{.axis = -1, .reverse = true}, {x23}};
    case OpKind::top_k:
      return Sample{TopKAttrs{.k = 2, .axis = -1, .largest = false}, {x23}, 2};
    case OpKind::resize:
      return Sample{ResizeAttrs{.sizes = {4, 2}, .mode = ResizeMode::linear}, {x23}};
    case OpKind::unary_backward:
      return Sample{UnaryBackwardAttrs{}, {x23, x23}};
    case OpKind::binary_backward:
      return Sample{BinaryBackwardAttrs{OpKind::div}, {x23, x23, f32({3})}, 2};
    case OpKind::batch_norm_backward:
      return Sample{BatchNormAttrs{.training = true},
                    {f32({2, 3, 4}), f32({2, 3, 4}), f32({3}), f32({3}), f32({3})},
                    3};
    case OpKind::layer_norm_backward:
      return Sample{NormAttrs{}, {x23, x23, f32({3}), f32({2, 1}), f32({2, 1})}, 3};
    case OpKind::rms_norm_backward:
      return Sample{NormAttrs{}, {x23, x23, f32({3}), f32({2, 1})}, 2};
    case OpKind::softmax_backward:
    case OpKind::log_softmax_backward:
      return Sample{SoftmaxAttrs{}, {x23, x23}};
    case OpKind::cross_entropy_backward:
      return Sample{CrossEntropyAttrs{},
                    {f32({}), f32({4, 10}), typed(DType::i64, {4}), f32({10})}};
    case OpKind::reduce_max_backward:
      return Sample{ReduceAttrs{{1}, true}, {f32({2, 1}), x23, f32({2, 1})}};
    case OpKind::max_pool_backward:
      return Sample{PoolBackwardAttrs{.pool = {.kernel = {2, 2}}, .input_shape = {1, 1, 4, 4}},
                    {f32({1, 1, 3, 3}), f32({1, 1, 4, 4})}};
    case OpKind::avg_pool_backward:
      return Sample{PoolBackwardAttrs{.pool = {.kernel = {2, 2}}, .input_shape = {1, 1, 4, 4}},
                    {f32({1, 1, 3, 3})}};
    case OpKind::slice_backward:
      return Sample{SliceBackwardAttrs{SliceAttrs{{0}, {1}, {}, {}}, {2, 3}}, {f32({1, 3})}};
    case OpKind::pad_backward:
      return Sample{PadBackwardAttrs{PadAttrs{{1, 1, 1, 1}}, {2, 3}}, {f32({4, 5})}};
    case OpKind::resize_backward:
      return Sample{ResizeBackwardAttrs{ResizeAttrs{.sizes = {4, 2}}, {2, 3}}, {f32({4, 2})}};
    case OpKind::gather_elements_backward:
      return Sample{GatherBackwardAttrs{GatherAttrs{1}, {2, 3}},
                    {f32({1, 7}), typed(DType::i64, {1, 7})}};
    case OpKind::gather_backward:
      return Sample{GatherBackwardAttrs{GatherAttrs{1}, {2, 3}},
                    {f32({2, 4, 5}), typed(DType::i32, {4, 5})}};
    case OpKind::sgd_update:
      return Sample{SgdAttrs{}, {x23, x23, x23, f32({})}, 2};
    case OpKind::adamw_update:
      return Sample{AdamWAttrs{}, {x23, x23, x23, x23, f32({}), typed(DType::i64, {})}, 3};
    case OpKind::nonfinite_any:
      return Sample{{}, {x23, f32({4})}};
    case OpKind::loss_scale_update:
      return Sample{LossScaleAttrs{}, {f32({}), typed(DType::i64, {}), f32({})}, 2};
    case OpKind::fused_pointwise:
      return Sample{PointwiseProgram{2, {{OpKind::mul, {0, 1}}, {OpKind::relu, {2}}}},
                    {x23, f32({3})}};
    case OpKind::all_reduce:
      return Sample{AllReduceAttrs{}, {x23, f32({4})}, 2};
  }
  return std::nullopt;
}

const std::vector<OpKind> kAllOps = {
#define FUSEBOX_LIST(name) OpKind::name,
    FUSEBOX_OP_KINDS(FUSEBOX_LIST)
#undef FUSEBOX_LIST
};

// Ops whose attribute struct is entirely defaultable: std::monostate is accepted.
const std::set<OpKind> kDefaultable = {OpKind::conv,
                                       OpKind::batch_norm,
                                       OpKind::batch_norm_apply,
                                       OpKind::layer_norm,
                                       OpKind::rms_norm,
                                       OpKind::leaky_relu,
                                       OpKind::gelu,
                                       OpKind::clip,
                                       OpKind::gemm,
                                       OpKind::reduce_sum,
                                       OpKind::arg_max,
                                       OpKind::arg_min,
                                       OpKind::reduce_mean,
                                       OpKind::reduce_max,
                                       OpKind::softmax,
                                       OpKind::log_softmax,
                                       OpKind::flatten,
                                       OpKind::transpose,
                                       OpKind::squeeze,
                                       OpKind::gather,
                                       OpKind::gather_elements,
                                       OpKind::cumsum,
                                       OpKind::top_k,
                                       OpKind::cross_entropy,
                                       OpKind::batch_norm_backward,
                                       OpKind::layer_norm_backward,
                                       OpKind::rms_norm_backward,
                                       OpKind::softmax_backward,
                                       OpKind::log_softmax_backward,
                                       OpKind::cross_entropy_backward,
                                       OpKind::sgd_update,
                                       OpKind::adamw_update,
                                       OpKind::loss_scale_update,
                                       OpKind::all_reduce};

TEST(InferGeneric, EveryOpHasAValidSample) {
  for (OpKind op : kAllOps) {
    SCOPED_TRACE(op_name(op));
    std::optional<Sample> s = sample(op);
    ASSERT_TRUE(s.has_value()) << "no sample for " << op_name(op);
    Inferred r = infer(op, s->attrs, s->inputs);
    EXPECT_EQ(r.types.size(), s->outputs);
    const OpInfo& info = op_info(op);
    EXPECT_LE(info.min_inputs, int(s->inputs.size()));
    EXPECT_GE(info.max_inputs, int(s->inputs.size()));
  }
}

TEST(InferGeneric, InputCountsInTheOpTable) {
  EXPECT_EQ(op_info(OpKind::conv).min_inputs, 2);
  EXPECT_EQ(op_info(OpKind::conv).max_inputs, 4);  // + a fused residual
  EXPECT_EQ(op_info(OpKind::batch_norm).min_inputs, 5);
  EXPECT_EQ(op_info(OpKind::batch_norm).max_inputs, 7);  // + a fused residual, batch_stats
  EXPECT_EQ(op_info(OpKind::layer_norm).max_inputs, 3);
  EXPECT_EQ(op_info(OpKind::cross_entropy).min_inputs, 2);
  EXPECT_EQ(op_info(OpKind::constant).max_inputs, 0);
  EXPECT_EQ(op_info(OpKind::concat).min_inputs, 1);
  EXPECT_GE(op_info(OpKind::concat).max_inputs, 1 << 20);
}

TEST(InferGeneric, InputCountIsEnforced) {
  for (OpKind op : kAllOps) {
    SCOPED_TRACE(op_name(op));
    Sample s = *sample(op);
    const OpInfo& info = op_info(op);
    if (info.min_inputs > 0) {
      std::vector<In> fewer(s.inputs.begin(), s.inputs.begin() + (info.min_inputs - 1));
      EXPECT_TRUE(fails_with(op, s.attrs, fewer, {"input", cat("but got ", fewer.size())}));
    }
    if (info.max_inputs < (1 << 20)) {
      std::vector<In> more = s.inputs;
      while (int(more.size()) <= info.max_inputs) more.push_back(f32({3}));
      EXPECT_TRUE(fails_with(op, s.attrs, more, {"input", cat("but got ", more.size())}));
    }
  }
}

TEST(InferGeneric, AttributeAlternativeMustMatch) {
  for (OpKind op : kAllOps) {
    SCOPED_TRACE(op_name(op));
    Sample s = *sample(op);
    Attrs wrong = op == OpKind::gemm ? Attrs{ConvAttrs{}} : Attrs{GemmAttrs{}};
    EXPECT_TRUE(fails_with(op, wrong, s.inputs, {"but the node holds"}));
  }
  EXPECT_TRUE(fails_with(OpKind::relu, GemmAttrs{}, {f32({2})},
                         {"takes no attributes but the node holds GemmAttrs"}));
  EXPECT_TRUE(fails_with(OpKind::slice, PadAttrs{}, {f32({2})},
                         {"needs SliceAttrs but the node holds PadAttrs"}));
}

TEST(InferGeneric, MonostateOnlyForDefaultableAttrs) {
  for (OpKind op : kAllOps) {
    SCOPED_TRACE(op_name(op));
    Sample s = *sample(op);
    if (s.attrs.index() == 0) continue;  // takes no attributes
    if (kDefaultable.count(op)) {
      Inferred r = infer(op, std::monostate{}, s.inputs);
      EXPECT_EQ(r.node.attrs.index(), s.attrs.index()) << "monostate not replaced by defaults";
    } else {
      EXPECT_TRUE(fails_with(op, std::monostate{}, s.inputs,
                             {"needs ", "but the node holds no attributes"}));
    }
  }
}

TEST(InferGeneric, NegativeExtentsAreRejected) {
  EXPECT_TRUE(fails_with(OpKind::relu, {}, {f32({2, -1})},
                         {"input 0 (x) has a negative extent in [2, -1]"}));
  EXPECT_TRUE(fails_with(OpKind::concat, ConcatAttrs{0}, {f32({2}), f32({-3})},
                         {"input 1 has a negative extent in [-3]"}));
}

TEST(InferGeneric, EverySampleBuildsAVerifiedGraph) {
  for (OpKind op : kAllOps) {
    SCOPED_TRACE(op_name(op));
    Sample s = *sample(op);
    Graph g("one_op");
    std::vector<ValueId> ids;
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      ids.push_back(s.inputs[i] ? g.add_input(cat("in", i), s.inputs[i]->dtype, s.inputs[i]->shape)
                                : kNoValue);
    }
    std::vector<ValueId> outs = g.add_node(op, s.attrs, ids, "node");
    EXPECT_EQ(outs.size(), s.outputs);
    for (ValueId v : outs) g.mark_output(v);
    EXPECT_NO_THROW(g.verify());
    EXPECT_NE(g.dump().find(cat("= ", op_name(op), "(")), std::string::npos) << g.dump();
  }
}

}  // namespace
}  // namespace fusebox::ir_test
