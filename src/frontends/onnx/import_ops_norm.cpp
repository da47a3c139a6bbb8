// Normalisation and training-related ops: BatchNormalization, LayerNormalization,
// SoftmaxCrossEntropyLoss, Dropout (inference form).
#include "frontends/onnx/import_context.h"

namespace fusebox::onnx_import {
namespace {

// ONNX float attributes are f32; defaults are rounded the same way so that an
// explicit epsilon=1e-5 and the default agree bit for bit.
double f32_default(float v) {
  return double(v);
}

// BatchNormalization (opsets 9-15). Opset 14 added training_mode and cut the
// outputs to Y, running_mean, running_var; before it the training form is the
// one with more than one output (Y, mean, var, saved_mean, saved_var). Our
// training form's saved statistics (mean and inverse std) are left unnamed. A following
// Relu stays its own node (relu = false): passes/fusion.h fuses them where it pays.
void import_batch_norm(NodeContext& c) {
  BatchNormAttrs a;
  a.epsilon = c.attrs().get_float("epsilon", f32_default(1e-5f));
  a.momentum = c.attrs().get_float("momentum", f32_default(0.9f));
  if (c.opset() >= 14) {
    c.check(c.output_count() <= 3, "has ", c.output_count(),
            " outputs; from opset 14 on it has at most 3 (Y, running_mean, running_var)");
    a.training = c.attrs().get_bool("training_mode", false);
    c.check(a.training || (!c.names_output(1) && !c.names_output(2)),
            "outputs running_mean and running_var are only produced with training_mode=1");
  } else {
    if (c.names_output(3) || c.names_output(4))
      c.unsupported(
          "outputs saved_mean and saved_var (the opset < 14 training form) are not "
          "supported");
    a.training = c.names_output(1) || c.names_output(2);
  }
  std::vector<ValueId> outs =
      c.emit(OpKind::batch_norm, a, {c.input(0), c.input(1), c.input(2), c.input(3), c.input(4)});
  c.set_output(0, outs.at(0));
  for (int i = 1; i <= 2; ++i)
    if (c.wants_output(i)) c.set_output(i, outs.at(size_t(i)));
}

// LayerNormalization (opset 17): Y, and optionally Mean and InvStdDev.
void import_layer_norm(NodeContext& c) {
  NormAttrs a;
  a.axis = c.attrs().get_int("axis", -1);
  a.epsilon = c.attrs().get_float("epsilon", f32_default(1e-5f));
  const int64_t stash_type = c.attrs().get_int("stash_type", 1);
  if (stash_type != 1)
    c.attrs().unsupported_value("stash_type", std::to_string(stash_type), "only 1 (float)");
  std::vector<ValueId> in{c.input(0), c.input(1)};
  if (c.has_input(2)) in.push_back(c.input(2));
  std::vector<ValueId> outs = c.emit(OpKind::layer_norm, a, in);
  for (int i = 0; i < 3; ++i)
    if (c.wants_output(i)) c.set_output(i, outs.at(size_t(i)));
}

// x [N, C, S...] normalised per (sample, group of C / groups channels): reshaped to [N,
// groups, C / groups * prod S], layer_norm over the last dim (no affine), then scale and bias
// (inputs 1 and 2) per group as [groups, 1] there, or per channel as [C, 1...] after the
// reshape back to x's shape.
ValueId group_norm(NodeContext& c, int64_t groups, bool per_channel) {
  const Shape& x = c.input_shape(0);
  const int64_t channels = x[1], affine = per_channel ? channels : groups;
  for (int i = 1; i <= 2; ++i)
    c.check(c.input_shape(i) == Shape{affine}, "input ", i, i == 1 ? " (scale)" : " (bias)",
            " must be [", affine, "], got ", shape_str(c.input_shape(i)));
  int64_t per_group = channels / groups;
  for (size_t d = 2; d < x.size(); ++d) per_group *= x[d];
  NormAttrs a;
  a.axis = 2;
  a.epsilon = c.attrs().get_float("epsilon", f32_default(1e-5f));
  const ValueId grouped =
      c.emit1(OpKind::reshape, ReshapeAttrs{{x[0], groups, per_group}}, {c.input(0)}, "groups");
  ValueId y = c.emit(OpKind::layer_norm, a, {grouped}, "normalised").at(0);
  if (per_channel) y = c.emit1(OpKind::reshape, ReshapeAttrs{x}, {y}, "unflat");
  Shape column(per_channel ? x.size() - 1 : 2, 1);
  column[0] = affine;
  const ValueId scale =
      c.emit1(OpKind::reshape, ReshapeAttrs{column}, {c.input(1)}, "scale_column");
  const ValueId bias = c.emit1(OpKind::reshape, ReshapeAttrs{column}, {c.input(2)}, "bias_column");
  const ValueId scaled = c.emit1(OpKind::mul, {}, {y, scale}, "scaled");
  if (per_channel) return c.emit1(OpKind::add, {}, {scaled, bias});
  const ValueId shifted = c.emit1(OpKind::add, {}, {scaled, bias}, "shifted");
  return c.emit1(OpKind::reshape, ReshapeAttrs{x}, {shifted});
}

// InstanceNormalization: a group norm of one channel per group.
void import_instance_norm(NodeContext& c) {
  const Shape& x = c.input_shape(0);
  c.check(x.size() >= 3, "input 0 (input) must be [N, C, D1, ...], got ", shape_str(x));
  c.set_output(0, group_norm(c, x[1], false));
}

// GroupNormalization (opset 18; 21 moved scale and bias from per group to per channel), as
// torch.nn.GroupNorm exports it.
void import_group_norm(NodeContext& c) {
  const Shape& x = c.input_shape(0);
  c.check(x.size() >= 2, "input 0 (X) must be [N, C, D...], got ", shape_str(x));
  const int64_t groups = c.attrs().required_int("num_groups");
  if (groups < 1 || x[1] % groups != 0)
    c.attrs().fail("num_groups", cat("is ", groups, ", which does not divide the ", x[1],
                                     " channels of ", shape_str(x)));
  const int64_t stash_type = c.attrs().get_int("stash_type", 1);
  if (stash_type != 1)
    c.attrs().unsupported_value("stash_type", std::to_string(stash_type), "only 1 (float)");
  c.set_output(0, group_norm(c, groups, c.opset() >= 21));
}

// SoftmaxCrossEntropyLoss (opset 12+): our cross_entropy has the same inputs and outputs.
void import_softmax_cross_entropy(NodeContext& c) {
  CrossEntropyAttrs a;
  const std::string reduction = c.attrs().get_string("reduction", "mean");
  if (reduction == "mean")
    a.reduction = Reduction::mean;
  else if (reduction == "sum")
    a.reduction = Reduction::sum;
  else if (reduction == "none")
    a.reduction = Reduction::none;
  else
    c.attrs().unsupported_value("reduction", reduction, "supported: mean, sum, none");
  a.ignore_index = c.attrs().find_int("ignore_index");
  std::vector<ValueId> in{c.input(0), c.input(1)};
  if (c.has_input(2)) in.push_back(c.input(2));
  std::vector<ValueId> outs = c.emit(OpKind::cross_entropy, a, in);
  c.set_output(0, outs.at(0));
  if (c.wants_output(1)) c.set_output(1, outs.at(1));
}

// NegativeLogLikelihoodLoss (opset 12+): input [N, C, D...] (log-probabilities), target
// [N, D...] (i64 or i32), weight [C]?; loss[n, d] = -input[n, target[n, d], d] *
// weight[target[n, d]], 0 where target is ignore_index. As gather_elements on the class dim
// (ignored targets read class 0 first, so they are never out of range), times the gathered
// weights (or 1 / 0 for kept / ignored); mean divides by the sum of those weights, as ONNX.
void import_nll_loss(NodeContext& c) {
  const std::string reduction = c.attrs().get_string("reduction", "mean");
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    c.attrs().unsupported_value("reduction", reduction, "supported: mean, sum, none");
  const std::optional<int64_t> ignore_index = c.attrs().find_int("ignore_index");
  const Shape& x = c.input_shape(0);
  const TensorType& target = c.input_type(1);
  c.check(x.size() >= 2, "input 0 (input) must be [N, C, D...], got ", shape_str(x));
  c.check(target.dtype == DType::i64 || target.dtype == DType::i32,
          "input 1 (target) must be i64 or i32, got ", dtype_name(target.dtype));
  Shape want = x;
  want.erase(want.begin() + 1);
  c.check(target.shape == want, "input 1 (target) must be ", shape_str(want), " for input ",
          shape_str(x), ", got ", shape_str(target.shape));
  const DType dtype = c.input_type(0).dtype;
  ValueId t = c.input(1), ignored = kNoValue;
  if (ignore_index) {
    const ValueId ii = c.constant(Tensor::scalar(target.dtype, double(*ignore_index)), "ii");
    ignored = c.emit1(OpKind::equal, {}, {t, ii}, "ignored");
    const ValueId zero = c.constant(Tensor::scalar(target.dtype, 0.0), "class0");
    t = c.emit1(OpKind::where, {}, {ignored, zero, t}, "safe_target");
  }
  const ValueId idx = c.emit1(OpKind::unsqueeze, AxesAttrs{{1}}, {t}, "index");
  const ValueId picked =
      c.emit1(OpKind::gather_elements, GatherAttrs{1}, {c.input(0), idx}, "pick");
  const ValueId flat = c.emit1(OpKind::squeeze, AxesAttrs{{1}}, {picked}, "picked");
  ValueId loss = c.emit1(OpKind::neg, {}, {flat}, "neg");
  ValueId w = kNoValue;  // the per-element weights, where they are not all 1
  if (c.has_input(2)) w = c.emit1(OpKind::gather, GatherAttrs{0}, {c.input(2), t}, "weights");
  if (ignored != kNoValue) {
    const ValueId zero = c.constant(Tensor::scalar(dtype, 0.0), "zero");
    const ValueId one = c.constant(Tensor::scalar(dtype, 1.0), "one");
    w = c.emit1(OpKind::where, {}, {ignored, zero, w == kNoValue ? one : w}, "kept_weights");
  }
  if (w != kNoValue) loss = c.emit1(OpKind::mul, {}, {loss, w}, "weighted");
  if (reduction == "none") return c.set_output(0, loss);
  const ReduceAttrs all{{}, false};
  const ValueId sum = c.emit1(OpKind::reduce_sum, all, {loss}, reduction == "sum" ? "" : "sum");
  if (reduction == "sum") return c.set_output(0, sum);
  if (w == kNoValue) return c.set_output(0, c.emit1(OpKind::reduce_mean, all, {loss}));
  const ValueId total = c.emit1(OpKind::reduce_sum, all, {w}, "weight_sum");
  c.set_output(0, c.emit1(OpKind::div, {}, {sum, total}));
}

// Dropout at inference (or in training with ratio 0): the identity, and an all-true
// mask. Opset 12 turned ratio into an input and added training_mode; random
// dropout (training with a non-zero ratio) is not supported.
void import_dropout(NodeContext& c) {
  c.attrs().ignore("seed");
  if (c.opset() < 12) {
    c.check(c.input_count() == 1, "takes 1 input before opset 12, got ", c.input_count());
    c.attrs().ignore("ratio");  // only used in training
  }
  if (c.has_input(2) && c.const_scalar(2, "training_mode") != 0) {
    const double ratio = c.has_input(1) ? c.const_scalar(1, "ratio") : 0.5;
    if (ratio != 0)
      c.unsupported(
          cat("training_mode=true with ratio ", ratio, " (random dropout) is not supported"));
  }
  c.set_output(0, c.emit1(OpKind::identity, {}, {c.input(0)}));
  if (c.wants_output(1)) c.set_output(1, Tensor::full(DType::boolean, c.input_shape(0), 1.0));
}

const OpSpec kOps[] = {
    {"BatchNormalization", 1, 5, 5, 5, import_batch_norm},
    {"LayerNormalization", 17, 2, 3, 3, import_layer_norm},
    {"InstanceNormalization", 6, 3, 3, 1, import_instance_norm},
    {"GroupNormalization", 18, 3, 3, 1, import_group_norm},
    {"SoftmaxCrossEntropyLoss", 12, 2, 3, 2, import_softmax_cross_entropy},
    {"NegativeLogLikelihoodLoss", 12, 2, 3, 1, import_nll_loss},
    {"Dropout", 1, 1, 3, 2, import_dropout},
};

}  // namespace

std::span<const OpSpec> norm_ops() {
  return kOps;
}

}  // namespace fusebox::onnx_import
