#include <algorithm>
#include <optional>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/converted_inputs.h"
#include "fusebox/ir/op_groups.h"
#include "fusebox/ir/op_info.h"
#include "fusebox/passes/layout.h"

namespace fusebox::cuda {

namespace {

// clang-format off
void run_contiguous(Context& ctx, const Node& n, Inputs in, Outputs out) {
  switch (n.op) {
    case OpKind::conv: return conv_forward(ctx, n, in, out);
    case OpKind::conv_backward_data: return conv_backward_data(ctx, n, in, out);
    case OpKind::conv_backward_filter: return conv_backward_filter(ctx, n, in, out);
    case OpKind::batch_norm: return batch_norm(ctx, n, in, out);
    case OpKind::batch_norm_apply: return batch_norm_apply(ctx, n, in, out);
    case OpKind::layer_norm: return layer_norm(ctx, n, in, out);
    case OpKind::rms_norm: return rms_norm(ctx, n, in, out);
    FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
    case OpKind::identity:
      return unary(ctx, n, in, out);
    FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return binary(ctx, n, in, out);
    case OpKind::matmul: return matmul(ctx, n, in, out);
    case OpKind::gemm: return gemm(ctx, n, in, out);
    FUSEBOX_REDUCE_OPS(FUSEBOX_OP_CASE)
      return reduce(ctx, n, in, out);
    case OpKind::arg_max: case OpKind::arg_min: return arg_reduce(ctx, n, in, out);
    case OpKind::top_k: return top_k(ctx, n, in, out);
    case OpKind::cumsum: return cumsum(ctx, n, in, out);
    FUSEBOX_LOGIC_OPS(FUSEBOX_OP_CASE)
      return logic(ctx, n, in, out);
    case OpKind::where: return where(ctx, n, in, out);
    case OpKind::softmax: case OpKind::log_softmax: return softmax(ctx, n, in, out);
    case OpKind::max_pool: return max_pool(ctx, n, in, out);
    case OpKind::avg_pool: return avg_pool(ctx, n, in, out);
    case OpKind::global_avg_pool: return global_avg_pool(ctx, n, in, out);
    FUSEBOX_RESHAPE_OPS(FUSEBOX_OP_CASE)
      return copy_reshape(ctx, n, in, out);
    case OpKind::transpose: return transpose(ctx, n, in, out);
    case OpKind::concat: return concat(ctx, n, in, out);
    case OpKind::slice: return slice(ctx, n, in, out);
    case OpKind::pad: return pad(ctx, n, in, out);
    case OpKind::cast: return cast(ctx, n, in, out);
    case OpKind::constant: return constant(ctx, n, in, out);
    case OpKind::cross_entropy: return cross_entropy(ctx, n, in, out);
    case OpKind::expand: return expand(ctx, n, in, out);
    case OpKind::gather: return gather(ctx, n, in, out);
    case OpKind::gather_backward: return gather_backward(ctx, n, in, out);
    case OpKind::gather_elements: return gather_elements(ctx, n, in, out);
    case OpKind::gather_elements_backward: return gather_elements_backward(ctx, n, in, out);
    case OpKind::resize: return resize(ctx, n, in, out);
    case OpKind::resize_backward: return resize_backward(ctx, n, in, out);
    case OpKind::unary_backward: return unary_backward(ctx, n, in, out);
    case OpKind::binary_backward: return binary_backward(ctx, n, in, out);
    case OpKind::batch_norm_backward: return batch_norm_backward(ctx, n, in, out);
    case OpKind::layer_norm_backward: return layer_norm_backward(ctx, n, in, out);
    case OpKind::rms_norm_backward: return rms_norm_backward(ctx, n, in, out);
    case OpKind::softmax_backward: case OpKind::log_softmax_backward:
      return softmax_backward(ctx, n, in, out);
    case OpKind::cross_entropy_backward: return cross_entropy_backward(ctx, n, in, out);
    case OpKind::reduce_max_backward: return reduce_max_backward(ctx, n, in, out);
    case OpKind::max_pool_backward: return max_pool_backward(ctx, n, in, out);
    case OpKind::avg_pool_backward: return avg_pool_backward(ctx, n, in, out);
    case OpKind::slice_backward: return slice_backward(ctx, n, in, out);
    case OpKind::pad_backward: return pad_backward(ctx, n, in, out);
    case OpKind::sgd_update: return sgd_update(ctx, n, in, out);
    case OpKind::adamw_update: return adamw_update(ctx, n, in, out);
    case OpKind::nonfinite_any: return nonfinite_any(ctx, n, in, out);
    case OpKind::loss_scale_update: return loss_scale_update(ctx, n, in, out);
    case OpKind::fused_pointwise: return fused_pointwise(ctx, n, in, out);
    case OpKind::attention: return attention(ctx, n, in, out);
    case OpKind::attention_backward: return attention_backward(ctx, n, in, out);
    case OpKind::all_reduce: return all_reduce(ctx, n, in, out);
  }
  throw Error(node_label(n), "no CUDA kernel for this op");
}
// clang-format on

// ---- Layouts -------------------------------------------------------------------------------
// The executor stores values contiguous or channels-last (passes/layout.h); run_node gives
// every op what its kernels take, whatever it gets, so any layout plan computes the same:
//  - convolution ops: activations and filters in the output's order (cuDNN takes any
//    strides, but its fast engines and our tests are for one layout throughout: an input
//    written contiguous by, e.g., a pad or a concat is converted to channels-last when the
//    output is channels-last);
//  - elementwise ops whose outputs are channels-last: every operand is viewed in the
//    outputs' physical order (dims permuted; an operand of lower rank, a broadcast one, is
//    first given leading dims of extent 1), in which the outputs are contiguous, so the
//    kernels' contiguous-output paths run unchanged;
//  - channelwise ops (batch_norm, pools and their backward ops) whose outputs are
//    channels-last: inputs of the outputs' rank are converted to channels-last when they
//    are not; the kernels take NCHW or channels-last operands, all in one order (concat
//    and slice, copies from any strides, take their inputs as they are);
//  - reductions of a channels-last input that keep C alone run in its physical order
//    (reduced_channels_last: a column reduction, no copy; the layout plan still lists the
//    conversion it would have been);
//  - pairwise ops (all_reduce) take every pair as it is: the kernels copy an input that is not
//    in its output's order into that order;
//  - any_order ops (transpose) copy from any strides into any order, or nothing where the
//    executable planned the output as the input's bytes;
//  - otherwise, and whenever the outputs are in neither order: strided inputs are made
//    contiguous (unless the op takes strides), outputs that are not contiguous are computed
//    into contiguous temporaries and copied into place.

// Whether an elementwise or channelwise node runs channels-last: every output is dense
// channels-last, and some output, or (all outputs being both orders, e.g. a pool's
// [N, C, 1, 1]) some input of the outputs' rank, is channels-last and not contiguous.
bool runs_channels_last(Inputs in, Outputs out) {
  if (out.empty() || out[0].rank() < 3) return false;
  bool differs = false;
  for (const DeviceTensor& t : out) {
    if (!t.is_channels_last()) return false;
    differs = differs || !t.is_contiguous();
  }
  if (differs) return true;
  for (const DeviceTensor* t : in)
    if (t != nullptr && t->rank() == out[0].rank() && t->is_channels_last() && !t->is_contiguous())
      return true;
  return false;
}

void run_with_contiguous_outputs(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const bool strided_ok = op_info(n.op).cuda_strided_inputs;
  const ConvertedInputs inputs(ctx, in, [&](const DeviceTensor& t) -> std::optional<MemoryFormat> {
    return strided_ok ? std::nullopt : unless_contiguous(t);
  });
  std::vector<DeviceTensor> outputs(out.begin(), out.end());
  bool staged = false;
  for (DeviceTensor& t : outputs) {
    if (t.is_contiguous()) continue;
    t = temporary_tensor(ctx, t.dtype, t.shape);
    staged = true;
  }
  run_contiguous(ctx, n, inputs.get(), outputs);
  if (!staged) return;
  for (size_t i = 0; i < out.size(); ++i)
    if (outputs[i].buffer.data() != out[i].buffer.data()) copy_strided(ctx, outputs[i], out[i]);
}

void run_elementwise_channels_last(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const size_t rank = out[0].shape.size();
  const std::vector<int> order = physical_order(rank, MemoryFormat::channels_last);
  std::vector<DeviceTensor> inputs;
  inputs.reserve(in.size());
  std::vector<const DeviceTensor*> in_ptrs(in.begin(), in.end());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == nullptr || in[i]->rank() == 0 || in[i]->shape.size() > rank) continue;
    DeviceTensor t = *in[i];
    if (t.shape.size() < rank) {  // numpy broadcasting: leading dims of extent 1
      const size_t missing = rank - t.shape.size();
      t.shape.insert(t.shape.begin(), missing, 1);
      t.strides.insert(t.strides.begin(), missing, 0);
    }
    inputs.push_back(t.permuted(order));
    in_ptrs[i] = &inputs.back();
  }
  std::vector<DeviceTensor> outputs;
  outputs.reserve(out.size());
  for (const DeviceTensor& t : out) outputs.push_back(t.permuted(order));
  run_with_contiguous_outputs(ctx, n, in_ptrs, outputs);  // outputs now contiguous views
}

void run_convolution(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const bool channels_last =
      out[0].rank() >= 3 && out[0].is_channels_last() && !out[0].is_contiguous();
  if (!channels_last) return run_contiguous(ctx, n, in, out);
  const ConvertedInputs inputs(ctx, in, [](const DeviceTensor& t) -> std::optional<MemoryFormat> {
    if (t.rank() < 3 || t.is_channels_last()) return std::nullopt;
    return MemoryFormat::channels_last;
  });
  run_contiguous(ctx, n, inputs.get(), out);
}

void run_channelwise_channels_last(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const size_t rank = out[0].shape.size();
  // Activation operands (the outputs' rank) channels-last, per-channel vectors contiguous;
  // ops that copy from any strides (concat, slice) take their inputs as they are.
  const bool strided_ok = op_info(n.op).cuda_strided_inputs;
  const ConvertedInputs inputs(ctx, in, [&](const DeviceTensor& t) -> std::optional<MemoryFormat> {
    if (t.shape.size() == rank)
      return t.is_channels_last() || strided_ok ? std::nullopt
                                                : std::optional(MemoryFormat::channels_last);
    return t.is_contiguous() ? std::nullopt : std::optional(MemoryFormat::contiguous);
  });
  run_contiguous(ctx, n, inputs.get(), out);
}

// A reduction of a dense channels-last x whose only kept dim of extent > 1 is C (per-channel
// statistics, a bias's gradient): reduced in x's physical order (N, D..., C), where it is a
// column reduction, instead of after a contiguous copy of x. The output's elements come in
// the same order either way (one non-unit dim), so it is written as it lies. False: not such
// a case.
bool reduced_channels_last(Context& ctx, const Node& n, Inputs in, Outputs out) {
  if (op_info(n.op).family != OpFamily::reduce || in.empty() || in[0] == nullptr) return false;
  const DeviceTensor& x = *in[0];
  if (x.rank() < 3 || x.is_contiguous() || !x.is_channels_last() || !out[0].is_contiguous())
    return false;
  const auto& a = std::get<ReduceAttrs>(n.attrs);
  const size_t rank = size_t(x.rank());
  std::vector<bool> reduced(rank, false);
  for (int64_t axis : a.axes) reduced[size_t(axis)] = true;
  for (size_t d = 0; d < rank; ++d)
    if (d != 1 && !reduced[d] && x.shape[d] != 1) return false;
  const std::vector<int> order = physical_order(rank, MemoryFormat::channels_last);
  const DeviceTensor physical = x.permuted(order);  // contiguous
  Node node = n;
  ReduceAttrs pa = a;
  pa.axes.clear();
  Shape shape;  // the output in physical order
  for (size_t p = 0; p < rank; ++p) {
    const size_t d = size_t(order[p]);
    if (reduced[d]) pa.axes.push_back(int64_t(p));
    if (!reduced[d] || a.keepdims) shape.push_back(reduced[d] ? 1 : x.shape[d]);
  }
  node.attrs = pa;
  DeviceTensor y = out[0];
  y.shape = shape;
  y.strides = contiguous_strides(shape);
  const DeviceTensor* xs[] = {&physical};
  run_contiguous(ctx, node, xs, std::span<DeviceTensor>(&y, 1));
  return true;
}

}  // namespace

void run_node(Context& ctx, const Node& n, Inputs in, Outputs out) {
  // Zero extents never reach a kernel, cuDNN or cuBLASLt (a grid of 0 blocks is `invalid
  // configuration argument`; descriptors refuse 0 dims): outputs without elements leave
  // nothing to do, and a node with an empty input but elements to write gets what the op
  // computes over nothing (empty_inputs.cpp).
  const auto no_elements = [](const DeviceTensor& t) { return t.numel() == 0; };
  if (std::all_of(out.begin(), out.end(), no_elements)) return;
  if (std::any_of(in.begin(), in.end(),
                  [&](const DeviceTensor* t) { return t && no_elements(*t); }))
    return run_with_empty_inputs(ctx, n, in, out);
  if (reduced_channels_last(ctx, n, in, out)) return;
  switch (layout_role(n)) {
    case LayoutRole::convolution:
      return run_convolution(ctx, n, in, out);
    case LayoutRole::elementwise:
      if (runs_channels_last(in, out)) return run_elementwise_channels_last(ctx, n, in, out);
      break;
    case LayoutRole::channelwise:
      if (runs_channels_last(in, out)) return run_channelwise_channels_last(ctx, n, in, out);
      break;
    case LayoutRole::pairwise:
      return run_contiguous(ctx, n, in, out);  // the kernels take each pair as it is
    case LayoutRole::any_order:
      return run_contiguous(ctx, n, in, out);  // a strided copy between any two orders
    case LayoutRole::contiguous:
      break;
  }
  run_with_contiguous_outputs(ctx, n, in, out);
}

}  // namespace fusebox::cuda
