// What each op is, one row per OpKind: its family, inputs and attribute struct (which
// infer_and_normalize checks), its layout role, how the CUDA backend and the ONNX exporter
// take it, whether autodiff differentiates it, and which outputs may be computed in place of
// an input. Passes and backends read these properties here; what an op does (its inference,
// VJP and kernels) stays in switches over OpKind with no default, so that the compiler names
// every switch a new op must join.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <span>
#include <type_traits>
#include <variant>

#include "fusebox/ir/ops.h"

namespace fusebox {

enum class OpFamily : uint8_t {
  conv,        // conv and its two backward ops (transposed conv is conv_backward_data)
  norm,        // batch_norm, layer_norm, rms_norm
  unary,       // elementwise, one input (FUSEBOX_UNARY_POINTWISE_OPS)
  binary,      // elementwise, two numpy-broadcast inputs (FUSEBOX_BINARY_POINTWISE_OPS)
  matmul,      // matmul, gemm
  reduce,      // FUSEBOX_REDUCE_OPS
  softmax,     // softmax, log_softmax
  pool,        // max_pool, avg_pool, global_avg_pool
  shape,       // data movement: reshape .. expand, gather, cast and identity
  constant,    // constant
  loss,        // cross_entropy
  backward,    // emitted by autodiff (FUSEBOX_BACKWARD_OPS)
  optimizer,   // sgd_update, adamw_update; f16 loss scaling: nonfinite_any, loss_scale_update
  pointwise,   // fused_pointwise: a generated elementwise program (ir/pointwise_program.h)
  attention,   // attention: softmax(scale q k^T) v, fused (passes/fusion.h fuse_attention)
  arg_reduce,  // arg_max, arg_min: i64 indices along one axis; top_k: values and indices
  logic,       // comparisons and logic ops: bool results (FUSEBOX_LOGIC_OPS)
  select,      // where: condition ? a : b
  scan,        // cumsum: running sums along one axis
  collective,  // all_reduce: values summed across the ranks of a data-parallel world
};

// Which memory orders an op reads and writes; passes/layout.h explains the roles.
// pairwise: input i and output i share an order (all_reduce: each pair is copied flat).
// any_order: reads any strides and writes any order (transpose: a strided copy, or none where
// its output's planned order is its input's bytes permuted).
enum class LayoutRole : uint8_t {
  contiguous,
  convolution,
  elementwise,
  channelwise,
  pairwise,
  any_order
};

// Index of attribute struct A among Attrs' alternatives (0: std::monostate, no attributes).
template <class A, size_t I = 0>
constexpr size_t attrs_index() {
  if constexpr (std::is_same_v<std::variant_alternative_t<I, Attrs>, A>)
    return I;
  else
    return attrs_index<A, I + 1>();
}

// max_inputs of an op that takes any number of inputs (concat).
inline constexpr int kUnboundedInputs = std::numeric_limits<int>::max();

struct OpInfo {
  OpKind op;
  const char* name;  // as in text dumps and error messages: "conv", "batch_norm"
  OpFamily family;
  int min_inputs;
  int max_inputs;
  std::span<const char* const> roles;  // input names for messages; empty for concat
  // attrs_index of the node's attribute struct; std::monostate: no attributes.
  size_t attrs = attrs_index<std::monostate>();
  // Every field of the attribute struct has a usable default, so std::monostate stands
  // for the default-constructed struct.
  bool attrs_defaultable = false;
  // Bit i: input i may be absent although it comes before min_inputs (a middle optional
  // input such as layer_norm_backward's scale).
  uint32_t optional_inputs = 0;
  // By op kind; a max_pool that also returns indices is `contiguous` (layout_role).
  LayoutRole layout = LayoutRole::contiguous;
  // The CUDA kernel entry reads inputs of any strides (views); other ops get contiguous
  // copies of strided inputs first.
  bool cuda_strided_inputs = false;
  // The ONNX operator it exports to with the same inputs and outputs and no attributes;
  // nullptr where the exporter writes the op itself (attributes, several nodes, or none).
  const char* onnx_type = nullptr;
  // Autodiff has a VJP rule for it; backward ops, conv_backward_filter and the optimizer
  // updates have none (no second-order differentiation).
  bool differentiable = true;
  // By output: the input it may be computed in place of (written into that input's bytes),
  // -1 for none; outputs past the end have none. An op lists a pair where its kernels read
  // each element of the input before writing the output's element there and read nothing of
  // the input afterwards, so that state updated through an alias (fusebox/runtime/
  // executable.h) needs no copy: the optimizer updates (each output is its state input's next
  // value, elementwise), batch_norm's running statistics (per channel, read and written by
  // the same thread) and the loss scaler's state (one thread reads it all, then writes).
  std::span<const int8_t> in_place = {};
};

// The input that output `output` of an op may be computed in place of (OpInfo::in_place), or -1.
constexpr int in_place_input(const OpInfo& info, size_t output) {
  return output < info.in_place.size() ? info.in_place[output] : -1;
}

namespace op_roles {
inline constexpr const char* kX[] = {"x"};
inline constexpr const char* kConv[] = {"x", "w", "bias", "residual"};
inline constexpr const char* kConvBackwardData[] = {"dy", "w", "bias"};
inline constexpr const char* kConvBackwardFilter[] = {"x", "dy"};
inline constexpr const char* kBatchNorm[] = {"x",   "scale",    "bias",       "mean",
                                             "var", "residual", "batch_stats"};
inline constexpr const char* kBatchNormApply[] = {"x", "scale", "bias", "saved_mean",
                                                  "saved_inv_std"};
inline constexpr const char* kLayerNorm[] = {"x", "scale", "bias"};
inline constexpr const char* kRmsNorm[] = {"x", "scale"};
inline constexpr const char* kBinary[] = {"a", "b"};
inline constexpr const char* kPow[] = {"base", "exponent"};
inline constexpr const char* kWhere[] = {"condition", "a", "b"};
inline constexpr const char* kGemm[] = {"a", "b", "c"};
inline constexpr const char* kCrossEntropy[] = {"logits", "labels", "weight"};
inline constexpr const char* kDyX[] = {"dy", "x"};
inline constexpr const char* kDy[] = {"dy"};
inline constexpr const char* kGather[] = {"data", "indices"};
inline constexpr const char* kGatherBackward[] = {"dy", "indices"};
inline constexpr const char* kDyY[] = {"dy", "y"};
inline constexpr const char* kAttention[] = {"q", "k", "v", "bias"};
inline constexpr const char* kAttentionBackward[] = {"dy", "q", "k", "v", "y", "lse", "bias"};
inline constexpr const char* kDyXY[] = {"dy", "x", "y"};
inline constexpr const char* kBinaryBackward[] = {"dy", "a", "b"};
inline constexpr const char* kBatchNormBackward[] = {
    "dy", "x", "scale", "saved_mean", "saved_inv_std", "y", "bias", "dy_addend"};
inline constexpr const char* kLayerNormBackward[] = {"dy", "x", "scale", "mean", "inv_std_dev"};
inline constexpr const char* kRmsNormBackward[] = {"dy", "x", "scale", "inv_rms"};
inline constexpr const char* kCrossEntropyBackward[] = {"dloss", "log_prob", "labels", "weight",
                                                        "logits"};
inline constexpr const char* kSgd[] = {"param",      "grad", "momentum_buf", "lr",
                                       "grad_scale", "skip", "low_param"};
inline constexpr const char* kAdamW[] = {"param", "grad",       "m",    "v",        "lr",
                                         "step",  "grad_scale", "skip", "low_param"};
inline constexpr const char* kLossScaleUpdate[] = {"scale", "growth_tracker", "found_inf",
                                                   "skipped"};
inline constexpr const char* kFusedPointwise[] = {"in0",  "in1",  "in2",  "in3", "in4",  "in5",
                                                  "in6",  "in7",  "in8",  "in9", "in10", "in11",
                                                  "in12", "in13", "in14", "in15"};
}  // namespace op_roles

// OpInfo::in_place rows, by output.
namespace op_in_place {
inline constexpr int8_t kSgd[] = {0, 2, 6};         // param', momentum_buf', low_param'
inline constexpr int8_t kAdamW[] = {0, 2, 3, 8};    // param', m', v', low_param'
inline constexpr int8_t kBatchNorm[] = {-1, 3, 4};  // training: running mean', running var'
inline constexpr int8_t kLossScale[] = {0, 1, 3};   // scale', growth_tracker', skipped'
}  // namespace op_in_place

// The first two fields of a row, from the enumerator's own spelling.
#define FUSEBOX_OP_ROW(kind) .op = OpKind::kind, .name = #kind

// Rows in enum order (checked below).
inline constexpr OpInfo kOpTable[] = {
    // ---- convolution
    {FUSEBOX_OP_ROW(conv), .family = OpFamily::conv, .min_inputs = 2, .max_inputs = 4,
     .roles = op_roles::kConv, .attrs = attrs_index<ConvAttrs>(), .attrs_defaultable = true,
     .layout = LayoutRole::convolution, .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(conv_backward_data), .family = OpFamily::conv, .min_inputs = 2, .max_inputs = 3,
     .roles = op_roles::kConvBackwardData, .attrs = attrs_index<ConvBackwardDataAttrs>(),
     .layout = LayoutRole::convolution, .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(conv_backward_filter), .family = OpFamily::conv, .min_inputs = 2,
     .max_inputs = 2, .roles = op_roles::kConvBackwardFilter,
     .attrs = attrs_index<ConvBackwardFilterAttrs>(), .layout = LayoutRole::convolution,
     .cuda_strided_inputs = true, .differentiable = false},
    // ---- normalisation
    {FUSEBOX_OP_ROW(batch_norm), .family = OpFamily::norm, .min_inputs = 5, .max_inputs = 7,
     .roles = op_roles::kBatchNorm, .attrs = attrs_index<BatchNormAttrs>(),
     .attrs_defaultable = true, .layout = LayoutRole::channelwise,
     .in_place = op_in_place::kBatchNorm},
    {FUSEBOX_OP_ROW(batch_norm_apply), .family = OpFamily::norm, .min_inputs = 5, .max_inputs = 5,
     .roles = op_roles::kBatchNormApply, .attrs = attrs_index<BatchNormAttrs>(),
     .attrs_defaultable = true, .layout = LayoutRole::channelwise, .differentiable = false},
    {FUSEBOX_OP_ROW(layer_norm), .family = OpFamily::norm, .min_inputs = 1, .max_inputs = 3,
     .roles = op_roles::kLayerNorm, .attrs = attrs_index<NormAttrs>(), .attrs_defaultable = true},
    {FUSEBOX_OP_ROW(rms_norm), .family = OpFamily::norm, .min_inputs = 1, .max_inputs = 2,
     .roles = op_roles::kRmsNorm, .attrs = attrs_index<NormAttrs>(), .attrs_defaultable = true},
    // ---- unary pointwise
    {FUSEBOX_OP_ROW(relu), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Relu"},
    {FUSEBOX_OP_ROW(leaky_relu), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<LeakyReluAttrs>(), .attrs_defaultable = true,
     .layout = LayoutRole::elementwise, .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(gelu), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<GeluAttrs>(), .attrs_defaultable = true,
     .layout = LayoutRole::elementwise, .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(silu), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(sigmoid), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Sigmoid"},
    {FUSEBOX_OP_ROW(tanh), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Tanh"},
    {FUSEBOX_OP_ROW(exp), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Exp"},
    {FUSEBOX_OP_ROW(log), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Log"},
    {FUSEBOX_OP_ROW(sqrt), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Sqrt"},
    {FUSEBOX_OP_ROW(rsqrt), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(reciprocal), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Reciprocal"},
    {FUSEBOX_OP_ROW(neg), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Neg"},
    {FUSEBOX_OP_ROW(abs), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Abs"},
    {FUSEBOX_OP_ROW(erf), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Erf"},
    {FUSEBOX_OP_ROW(sin), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Sin"},
    {FUSEBOX_OP_ROW(cos), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Cos"},
    // floor, ceil, round (half to even, as ONNX Round and torch.round): gradient 0
    {FUSEBOX_OP_ROW(floor), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Floor"},
    {FUSEBOX_OP_ROW(ceil), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Ceil"},
    {FUSEBOX_OP_ROW(round), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Round"},
    {FUSEBOX_OP_ROW(clip), .family = OpFamily::unary, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ClipAttrs>(), .attrs_defaultable = true,
     .layout = LayoutRole::elementwise, .cuda_strided_inputs = true},
    // ---- binary pointwise
    {FUSEBOX_OP_ROW(add), .family = OpFamily::binary, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Add"},
    {FUSEBOX_OP_ROW(sub), .family = OpFamily::binary, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Sub"},
    {FUSEBOX_OP_ROW(mul), .family = OpFamily::binary, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Mul"},
    {FUSEBOX_OP_ROW(div), .family = OpFamily::binary, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Div"},
    {FUSEBOX_OP_ROW(max), .family = OpFamily::binary, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Max"},
    {FUSEBOX_OP_ROW(min), .family = OpFamily::binary, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Min"},
    {FUSEBOX_OP_ROW(pow), .family = OpFamily::binary, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kPow, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Pow"},
    // ---- comparisons, logic, where
    {FUSEBOX_OP_ROW(equal), .family = OpFamily::logic, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .cuda_strided_inputs = true, .onnx_type = "Equal",
     .differentiable = false},
    {FUSEBOX_OP_ROW(less), .family = OpFamily::logic, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .cuda_strided_inputs = true, .onnx_type = "Less",
     .differentiable = false},
    {FUSEBOX_OP_ROW(greater), .family = OpFamily::logic, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .cuda_strided_inputs = true, .onnx_type = "Greater",
     .differentiable = false},
    {FUSEBOX_OP_ROW(less_equal), .family = OpFamily::logic, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .cuda_strided_inputs = true, .onnx_type = "LessOrEqual",
     .differentiable = false},
    {FUSEBOX_OP_ROW(greater_equal), .family = OpFamily::logic, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .cuda_strided_inputs = true, .onnx_type = "GreaterOrEqual",
     .differentiable = false},
    {FUSEBOX_OP_ROW(logical_not), .family = OpFamily::logic, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .cuda_strided_inputs = true, .onnx_type = "Not",
     .differentiable = false},
    {FUSEBOX_OP_ROW(logical_and), .family = OpFamily::logic, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .cuda_strided_inputs = true, .onnx_type = "And",
     .differentiable = false},
    {FUSEBOX_OP_ROW(logical_or), .family = OpFamily::logic, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .cuda_strided_inputs = true, .onnx_type = "Or",
     .differentiable = false},
    {FUSEBOX_OP_ROW(logical_xor), .family = OpFamily::logic, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .cuda_strided_inputs = true, .onnx_type = "Xor",
     .differentiable = false},
    {FUSEBOX_OP_ROW(where), .family = OpFamily::select, .min_inputs = 3, .max_inputs = 3,
     .roles = op_roles::kWhere, .cuda_strided_inputs = true, .onnx_type = "Where"},
    // ---- matmul
    {FUSEBOX_OP_ROW(matmul), .family = OpFamily::matmul, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kBinary, .onnx_type = "MatMul"},
    {FUSEBOX_OP_ROW(gemm), .family = OpFamily::matmul, .min_inputs = 2, .max_inputs = 3,
     .roles = op_roles::kGemm, .attrs = attrs_index<GemmAttrs>(), .attrs_defaultable = true},
    // ---- reductions
    {FUSEBOX_OP_ROW(reduce_sum), .family = OpFamily::reduce, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ReduceAttrs>(), .attrs_defaultable = true},
    {FUSEBOX_OP_ROW(reduce_mean), .family = OpFamily::reduce, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ReduceAttrs>(), .attrs_defaultable = true},
    {FUSEBOX_OP_ROW(reduce_max), .family = OpFamily::reduce, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ReduceAttrs>(), .attrs_defaultable = true},
    {FUSEBOX_OP_ROW(arg_max), .family = OpFamily::arg_reduce, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ArgReduceAttrs>(), .attrs_defaultable = true,
     .differentiable = false},
    {FUSEBOX_OP_ROW(arg_min), .family = OpFamily::arg_reduce, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ArgReduceAttrs>(), .attrs_defaultable = true,
     .differentiable = false},
    {FUSEBOX_OP_ROW(top_k), .family = OpFamily::arg_reduce, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<TopKAttrs>(), .attrs_defaultable = true},
    {FUSEBOX_OP_ROW(cumsum), .family = OpFamily::scan, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<CumSumAttrs>(), .attrs_defaultable = true},
    // ---- softmax
    {FUSEBOX_OP_ROW(softmax), .family = OpFamily::softmax, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<SoftmaxAttrs>(), .attrs_defaultable = true},
    {FUSEBOX_OP_ROW(log_softmax), .family = OpFamily::softmax, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<SoftmaxAttrs>(), .attrs_defaultable = true},
    // ---- pooling
    {FUSEBOX_OP_ROW(max_pool), .family = OpFamily::pool, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<PoolAttrs>(), .layout = LayoutRole::channelwise},
    {FUSEBOX_OP_ROW(avg_pool), .family = OpFamily::pool, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<PoolAttrs>(), .layout = LayoutRole::channelwise},
    {FUSEBOX_OP_ROW(global_avg_pool), .family = OpFamily::pool, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::channelwise, .onnx_type = "GlobalAveragePool"},
    // ---- shape and data movement
    // (the reshape family reads a strided input with one copy into the output's row-major order)
    {FUSEBOX_OP_ROW(reshape), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ReshapeAttrs>(), .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(flatten), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<FlattenAttrs>(), .attrs_defaultable = true,
     .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(transpose), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<TransposeAttrs>(), .attrs_defaultable = true,
     .layout = LayoutRole::any_order},
    // channelwise: a concatenation of channels-last convolution outputs is written
    // channels-last, slab by slab, for the convolution that reads it (DenseNet).
    {FUSEBOX_OP_ROW(concat), .family = OpFamily::shape, .min_inputs = 1,
     .max_inputs = kUnboundedInputs, .roles = {}, .attrs = attrs_index<ConcatAttrs>(),
     .layout = LayoutRole::channelwise, .cuda_strided_inputs = true},
    // channelwise: a slice keeps its input's order (a concat's gradient, sliced into its
    // inputs' gradients, stays channels-last for the convolutions that read them: UNet).
    {FUSEBOX_OP_ROW(slice), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<SliceAttrs>(), .layout = LayoutRole::channelwise,
     .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(pad), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<PadAttrs>()},
    {FUSEBOX_OP_ROW(squeeze), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<AxesAttrs>(), .attrs_defaultable = true,
     .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(unsqueeze), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<AxesAttrs>(), .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(cast), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<CastAttrs>(), .layout = LayoutRole::elementwise},
    {FUSEBOX_OP_ROW(constant), .family = OpFamily::constant, .min_inputs = 0, .max_inputs = 0,
     .roles = {}, .attrs = attrs_index<ConstantAttrs>()},
    {FUSEBOX_OP_ROW(identity), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .layout = LayoutRole::elementwise, .cuda_strided_inputs = true,
     .onnx_type = "Identity"},
    {FUSEBOX_OP_ROW(expand), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ExpandAttrs>(), .layout = LayoutRole::elementwise,
     .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(gather), .family = OpFamily::shape, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kGather, .attrs = attrs_index<GatherAttrs>(), .attrs_defaultable = true},
    {FUSEBOX_OP_ROW(gather_elements), .family = OpFamily::shape, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kGather, .attrs = attrs_index<GatherAttrs>(), .attrs_defaultable = true},
    {FUSEBOX_OP_ROW(resize), .family = OpFamily::shape, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kX, .attrs = attrs_index<ResizeAttrs>()},
    // ---- losses
    {FUSEBOX_OP_ROW(cross_entropy), .family = OpFamily::loss, .min_inputs = 2, .max_inputs = 3,
     .roles = op_roles::kCrossEntropy, .attrs = attrs_index<CrossEntropyAttrs>(),
     .attrs_defaultable = true},
    // ---- backward ops
    {FUSEBOX_OP_ROW(unary_backward), .family = OpFamily::backward, .min_inputs = 2, .max_inputs = 2,
     .roles = op_roles::kDyX, .attrs = attrs_index<UnaryBackwardAttrs>(),
     .layout = LayoutRole::elementwise, .cuda_strided_inputs = true, .differentiable = false},
    {FUSEBOX_OP_ROW(binary_backward), .family = OpFamily::backward, .min_inputs = 3,
     .max_inputs = 3, .roles = op_roles::kBinaryBackward,
     .attrs = attrs_index<BinaryBackwardAttrs>(), .layout = LayoutRole::elementwise,
     .differentiable = false},
    {FUSEBOX_OP_ROW(batch_norm_backward), .family = OpFamily::backward, .min_inputs = 5,
     .max_inputs = 8, .roles = op_roles::kBatchNormBackward, .attrs = attrs_index<BatchNormAttrs>(),
     .attrs_defaultable = true, .layout = LayoutRole::channelwise, .differentiable = false},
    {FUSEBOX_OP_ROW(layer_norm_backward), .family = OpFamily::backward, .min_inputs = 5,
     .max_inputs = 5, .roles = op_roles::kLayerNormBackward, .attrs = attrs_index<NormAttrs>(),
     .attrs_defaultable = true, .optional_inputs = 1u << 2, .differentiable = false},
    {FUSEBOX_OP_ROW(rms_norm_backward), .family = OpFamily::backward, .min_inputs = 4,
     .max_inputs = 4, .roles = op_roles::kRmsNormBackward, .attrs = attrs_index<NormAttrs>(),
     .attrs_defaultable = true, .optional_inputs = 1u << 2, .differentiable = false},
    {FUSEBOX_OP_ROW(softmax_backward), .family = OpFamily::backward, .min_inputs = 2,
     .max_inputs = 2, .roles = op_roles::kDyY, .attrs = attrs_index<SoftmaxAttrs>(),
     .attrs_defaultable = true, .differentiable = false},
    {FUSEBOX_OP_ROW(log_softmax_backward), .family = OpFamily::backward, .min_inputs = 2,
     .max_inputs = 2, .roles = op_roles::kDyY, .attrs = attrs_index<SoftmaxAttrs>(),
     .attrs_defaultable = true, .differentiable = false},
    {FUSEBOX_OP_ROW(cross_entropy_backward), .family = OpFamily::backward, .min_inputs = 3,
     .max_inputs = 5, .roles = op_roles::kCrossEntropyBackward,
     .attrs = attrs_index<CrossEntropyAttrs>(), .attrs_defaultable = true, .differentiable = false},
    {FUSEBOX_OP_ROW(reduce_max_backward), .family = OpFamily::backward, .min_inputs = 3,
     .max_inputs = 3, .roles = op_roles::kDyXY, .attrs = attrs_index<ReduceAttrs>(),
     .differentiable = false},
    {FUSEBOX_OP_ROW(max_pool_backward), .family = OpFamily::backward, .min_inputs = 2,
     .max_inputs = 2, .roles = op_roles::kDyX, .attrs = attrs_index<PoolBackwardAttrs>(),
     .layout = LayoutRole::channelwise, .differentiable = false},
    {FUSEBOX_OP_ROW(avg_pool_backward), .family = OpFamily::backward, .min_inputs = 1,
     .max_inputs = 1, .roles = op_roles::kDy, .attrs = attrs_index<PoolBackwardAttrs>(),
     .layout = LayoutRole::channelwise, .differentiable = false},
    {FUSEBOX_OP_ROW(slice_backward), .family = OpFamily::backward, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kDy, .attrs = attrs_index<SliceBackwardAttrs>(), .differentiable = false},
    {FUSEBOX_OP_ROW(pad_backward), .family = OpFamily::backward, .min_inputs = 1, .max_inputs = 1,
     .roles = op_roles::kDy, .attrs = attrs_index<PadBackwardAttrs>(), .differentiable = false},
    {FUSEBOX_OP_ROW(gather_backward), .family = OpFamily::backward, .min_inputs = 2,
     .max_inputs = 2, .roles = op_roles::kGatherBackward,
     .attrs = attrs_index<GatherBackwardAttrs>(), .differentiable = false},
    {FUSEBOX_OP_ROW(gather_elements_backward), .family = OpFamily::backward, .min_inputs = 2,
     .max_inputs = 2, .roles = op_roles::kGatherBackward,
     .attrs = attrs_index<GatherBackwardAttrs>(), .differentiable = false},
    {FUSEBOX_OP_ROW(resize_backward), .family = OpFamily::backward, .min_inputs = 1,
     .max_inputs = 1, .roles = op_roles::kDy, .attrs = attrs_index<ResizeBackwardAttrs>(),
     .differentiable = false},
    // ---- optimizer updates and f16 loss scaling
    {FUSEBOX_OP_ROW(sgd_update), .family = OpFamily::optimizer, .min_inputs = 4, .max_inputs = 7,
     .roles = op_roles::kSgd, .attrs = attrs_index<SgdAttrs>(), .attrs_defaultable = true,
     .layout = LayoutRole::elementwise, .differentiable = false, .in_place = op_in_place::kSgd},
    {FUSEBOX_OP_ROW(adamw_update), .family = OpFamily::optimizer, .min_inputs = 6, .max_inputs = 9,
     .roles = op_roles::kAdamW, .attrs = attrs_index<AdamWAttrs>(), .attrs_defaultable = true,
     .layout = LayoutRole::elementwise, .differentiable = false, .in_place = op_in_place::kAdamW},
    // A reduction to a scalar that reads its inputs in whatever dense order they are in:
    // `elementwise` joins no operands (none has the rank-0 output's shape), so it causes no
    // layout conversion; the CUDA kernel takes contiguous and channels-last inputs as they
    // are.
    {FUSEBOX_OP_ROW(nonfinite_any), .family = OpFamily::optimizer, .min_inputs = 1,
     .max_inputs = kUnboundedInputs, .roles = {}, .layout = LayoutRole::elementwise,
     .cuda_strided_inputs = true, .differentiable = false},
    {FUSEBOX_OP_ROW(loss_scale_update), .family = OpFamily::optimizer, .min_inputs = 3,
     .max_inputs = 4, .roles = op_roles::kLossScaleUpdate, .attrs = attrs_index<LossScaleAttrs>(),
     .attrs_defaultable = true, .differentiable = false, .in_place = op_in_place::kLossScale},
    // ---- generated pointwise programs (formed after autodiff's graphs are built: no VJP)
    {FUSEBOX_OP_ROW(fused_pointwise), .family = OpFamily::pointwise, .min_inputs = 1,
     .max_inputs = 16, .roles = op_roles::kFusedPointwise, .attrs = attrs_index<PointwiseProgram>(),
     .layout = LayoutRole::elementwise, .cuda_strided_inputs = true, .differentiable = false},
    // ---- fused attention
    // (strided q, k, v and dy: cuDNN reads them where they lie, the other paths copy them)
    {FUSEBOX_OP_ROW(attention), .family = OpFamily::attention, .min_inputs = 3, .max_inputs = 4,
     .roles = op_roles::kAttention, .attrs = attrs_index<AttentionAttrs>(),
     .cuda_strided_inputs = true},
    {FUSEBOX_OP_ROW(attention_backward), .family = OpFamily::backward, .min_inputs = 6,
     .max_inputs = 7, .roles = op_roles::kAttentionBackward, .attrs = attrs_index<AttentionAttrs>(),
     .cuda_strided_inputs = true, .differentiable = false},
    // ---- collectives (differentiable: sync batch norm's statistics; passes/vjp_math.cpp);
    // the kernels take strided inputs and copy any that is not in its output's order into
    // that order first
    {FUSEBOX_OP_ROW(all_reduce), .family = OpFamily::collective, .min_inputs = 1,
     .max_inputs = kUnboundedInputs, .roles = {}, .attrs = attrs_index<AllReduceAttrs>(),
     .attrs_defaultable = true, .layout = LayoutRole::pairwise, .cuda_strided_inputs = true},
};

#undef FUSEBOX_OP_ROW

inline constexpr size_t kOpCount = 0
#define FUSEBOX_COUNT_OP(name) +1
    FUSEBOX_OP_KINDS(FUSEBOX_COUNT_OP)
#undef FUSEBOX_COUNT_OP
    ;

constexpr const OpInfo& op_info(OpKind op) {
  return kOpTable[size_t(op)];
}

namespace op_info_checks {
// Row i describes OpKind i; every op names each of its inputs (concat aside); a
// defaultable attribute struct exists; an in-place output names an input the op has.
constexpr bool rows_consistent() {
  for (size_t i = 0; i < std::size(kOpTable); ++i) {
    const OpInfo& r = kOpTable[i];
    if (r.op != OpKind(i) || r.min_inputs > r.max_inputs) return false;
    if (r.max_inputs != kUnboundedInputs && r.roles.size() != size_t(r.max_inputs)) return false;
    if (r.attrs >= std::variant_size_v<Attrs> || (r.attrs_defaultable && r.attrs == 0))
      return false;
    for (int8_t input : r.in_place)
      if (input < -1 || input >= r.max_inputs) return false;
  }
  return true;
}
}  // namespace op_info_checks

static_assert(std::size(kOpTable) == kOpCount, "one row per OpKind");
static_assert(op_info_checks::rows_consistent(),
              "rows out of enum order, or inputs, roles, attrs and in_place disagree");

}  // namespace fusebox
