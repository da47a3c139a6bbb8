// Nodes with an empty input (a zero extent) whose outputs still have elements: run_node
// (dispatch.cpp) sends them here instead of to their kernels, which, like cuDNN and
// cuBLASLt, refuse zero extents (a grid of 0 blocks is `invalid configuration argument`).
// Each output gets what the op computes over nothing, as the CPU backend computes it (the
// oracle; tests/unit/ops/test_op_empty.cpp):
//  - reductions: their identity (sum 0, max -inf or the dtype's lowest, mean NaN: 0 / 0);
//    global_avg_pool NaN; cross_entropy's loss over no samples NaN (mean) or 0 (sum);
//  - a product over an empty inner dim: matmul 0; gemm runs its kernel with K widened to 1
//    and zeros, so that beta * c and any fused activation come out as the kernel computes
//    them; attention with an empty head dim likewise (scores of the bias alone; lse when
//    dv = 0);
//  - gradients (backward ops, conv_backward_filter): sums over no elements, zeros;
//  - a constant pad of an empty x: the pad value;
//  - concat, nonfinite_any and all_reduce: the same op without the empty operands.
// Inference refuses the rest (a zero-extent filter, an arg_max or a top_k over an empty
// axis, a pool or a resize of an empty image, training batch norm over an empty batch,
// attention over no keys, ...); anything that still arrives is an Error naming the node,
// never a launch.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cuda/kernels.h"
#include "fusebox/ir/op_info.h"

namespace fusebox::cuda {

namespace {

bool has_no_elements(const DeviceTensor* t) {
  return t != nullptr && t->numel() == 0;
}

// Every element of the dense tensor `y` (contiguous or channels-last: the same value
// everywhere, so it is filled as one flat run) set to `value` in y's dtype.
void fill(Context& ctx, const Node& n, const DeviceTensor& y, double value) {
  if (value == 0.0 && !std::signbit(value)) {
    ctx.encoder.memset(y.range(), 0);  // +0 in every dtype
    return;
  }
  Node constant_node = n;
  constant_node.op = OpKind::constant;
  constant_node.attrs = ConstantAttrs{Tensor::full(y.dtype, {}, value)};
  DeviceTensor scalar[] = {temporary_tensor(ctx, y.dtype, {})};
  constant(ctx, constant_node, {}, scalar);
  Node expand_node = n;
  expand_node.op = OpKind::expand;
  expand_node.attrs = ExpandAttrs{{y.numel()}};
  const DeviceTensor* source[] = {&scalar[0]};
  DeviceTensor flat[] = {y.view(y.offset, {y.numel()}, {1})};
  expand(ctx, expand_node, source, flat);
}

// The identity of reduce_max in `dtype`: -inf, or the lowest integer.
double lowest(DType dtype) {
  if (is_floating(dtype)) return -INFINITY;
  return dtype == DType::i32 ? double(std::numeric_limits<int32_t>::lowest())
                             : double(std::numeric_limits<int64_t>::lowest());
}

// A temporary of t's dtype and the shape `widened` (t's with its zero extents widened), zeros.
DeviceTensor zeros_widened(Context& ctx, const DeviceTensor& t, const Shape& widened) {
  DeviceTensor z = temporary_tensor(ctx, t.dtype, widened);
  ctx.encoder.memset(z.range(), 0);
  return z;
}

Shape with_extent(Shape shape, size_t dim, int64_t extent) {
  shape[dim] = extent;
  return shape;
}

// gemm with its empty inputs replaced by zeros with each zero extent 1 (the output having
// elements, the zero extent is the contraction K).
void run_with_unit_contraction(Context& ctx, const Node& n, Inputs in, Outputs out) {
  std::vector<DeviceTensor> zeros;
  zeros.reserve(in.size());
  std::vector<const DeviceTensor*> inputs(in.begin(), in.end());
  for (size_t i = 0; i < in.size(); ++i) {
    if (!has_no_elements(in[i])) continue;
    Shape shape = in[i]->shape;
    std::replace(shape.begin(), shape.end(), int64_t(0), int64_t(1));
    zeros.push_back(zeros_widened(ctx, *in[i], shape));
    inputs[i] = &zeros.back();
  }
  run_node(ctx, n, inputs, out);
}

// attention whose head dim d (q, k) or dv (v) is 0: scores over d = 0 are the bias alone,
// and dv = 0 leaves y empty but not lse. The kernels run with each empty head dim one zero
// column wide (y then into a temporary), which changes neither scores nor lse.
void run_attention_with_unit_head_dims(Context& ctx, const Node& n, Inputs in, Outputs out) {
  std::vector<DeviceTensor> zeros;
  zeros.reserve(3);
  std::vector<const DeviceTensor*> inputs(in.begin(), in.end());
  for (size_t i = 0; i < 3; ++i) {
    const DeviceTensor& t = *in[i];
    FUSEBOX_CHECK(t.numel() > 0 || t.shape.back() == 0, node_label(n), "input ", i, " ",
                  shape_str(t.shape), " is empty in a dim other than its head dim: no CUDA path");
    if (t.numel() > 0) continue;
    zeros.push_back(zeros_widened(ctx, t, with_extent(t.shape, t.shape.size() - 1, 1)));
    inputs[i] = &zeros.back();
  }
  std::vector<DeviceTensor> outputs(out.begin(), out.end());
  if (out[0].numel() == 0) {  // dv = 0
    Shape y = out[0].shape;
    y.back() = 1;
    outputs[0] = temporary_tensor(ctx, out[0].dtype, y);
  }
  run_node(ctx, n, inputs, outputs);
}

// The node without its empty operands: concat and nonfinite_any drop empty inputs;
// all_reduce drops the (input, output) pairs that are empty.
void run_without_empty_operands(Context& ctx, const Node& n, Inputs in, Outputs out) {
  std::vector<const DeviceTensor*> inputs;
  std::vector<DeviceTensor> outputs;
  const bool pairwise = n.op == OpKind::all_reduce;
  for (size_t i = 0; i < in.size(); ++i) {
    if (has_no_elements(in[i])) continue;
    inputs.push_back(in[i]);
    if (pairwise) outputs.push_back(out[i]);
  }
  if (!pairwise) outputs.assign(out.begin(), out.end());
  if (inputs.empty()) {  // nonfinite_any over nothing: no element is non-finite
    for (const DeviceTensor& y : out) fill(ctx, n, y, 0.0);
    return;
  }
  run_node(ctx, n, inputs, outputs);  // all_reduce's outputs share the given buffers
}

}  // namespace

void run_with_empty_inputs(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const OpFamily family = op_info(n.op).family;
  if (family == OpFamily::backward || n.op == OpKind::conv_backward_filter) {
    // A gradient summed over no elements (dscale of an empty batch, the data of an empty
    // gather's scatter, ...).
    for (const DeviceTensor& y : out)
      if (y.numel() > 0) fill(ctx, n, y, 0.0);
    return;
  }
  switch (n.op) {
    case OpKind::reduce_sum:
      return fill(ctx, n, out[0], 0.0);
    case OpKind::reduce_max:
      return fill(ctx, n, out[0], lowest(out[0].dtype));
    case OpKind::reduce_mean:
    case OpKind::global_avg_pool:
      return fill(ctx, n, out[0], NAN);
    case OpKind::matmul:
      return fill(ctx, n, out[0], 0.0);
    case OpKind::gemm:
      return run_with_unit_contraction(ctx, n, in, out);
    case OpKind::cross_entropy: {
      // logits [0, C, ...]: no samples. The loss's mean over them is NaN (0 / 0), its sum 0;
      // log_prob and a per-sample loss are empty.
      const bool mean = std::get<CrossEntropyAttrs>(n.attrs).reduction == Reduction::mean;
      for (const DeviceTensor& y : out)
        if (y.numel() > 0) fill(ctx, n, y, mean ? NAN : 0.0);
      return;
    }
    case OpKind::pad:
      if (std::get<PadAttrs>(n.attrs).mode == PadMode::constant)
        return fill(ctx, n, out[0], std::get<PadAttrs>(n.attrs).value);
      break;
    case OpKind::attention:
      return run_attention_with_unit_head_dims(ctx, n, in, out);
    case OpKind::concat:
    case OpKind::nonfinite_any:
    case OpKind::all_reduce:
      return run_without_empty_operands(ctx, n, in, out);
    default:
      break;
  }
  std::string shapes;
  for (const DeviceTensor* t : in) shapes += t ? shape_str(t->shape) + " " : "absent ";
  throw Error(node_label(n), cat("has an empty input (", shapes,
                                 ") and outputs with elements: no CUDA path computes it"));
}

}  // namespace fusebox::cuda
