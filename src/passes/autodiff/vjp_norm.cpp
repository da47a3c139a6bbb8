// VJP rules for the normalisations, softmax and the cross-entropy loss. The training
// forms reuse the statistics the forward node saved (its extra outputs) instead of
// recomputing them.
#include "vjp.h"

namespace fusebox::autodiff {
namespace {

// batch_norm inference: y = (x - mean) * inv_std * scale + bias with
// inv_std = 1 / sqrt(var + eps), all per channel. With s = scale * inv_std and
// xhat = (x - mean) * inv_std:
//   dx = dy * s                          dbias = sum(dy)
//   dscale = sum(dy * xhat)              dmean = -dbias * s
//   dvar = dscale * scale * (-1/2) * inv_std^2     (d inv_std / d var = -inv_std^3 / 2)
// where sum runs over every dim but the channel's and [C] vectors are reshaped to
// [C, 1...] to broadcast against x. With mixed precision (f16 / bf16 x, f32 parameters) dy
// and x are cast up to the parameters' dtype first, so that the per-channel sums accumulate
// and round in f32, and dx is cast back to x's dtype once at the end. A fused relu's
// gradient comes first, as relu's own rule (vjp_math.cpp) gives it: unary_backward at the
// output.
bool has_residual(const VjpArgs& a) {
  return a.node.inputs.size() > 5 && a.node.inputs[5] != kNoValue;
}

// The gradient at y + residual (before a fused relu): relu's rule at the output when fused.
ValueId gradient_at_sum(VjpArgs& a) {
  if (!std::get<BatchNormAttrs>(a.node.attrs).relu) return a.dy[0];
  return a.e.op1(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::relu},
                 {a.dy[0], a.output(0)}, "relu_dx");
}

Grads batch_norm_inference(VjpArgs& a) {
  Emitter& e = a.e;
  const BatchNormAttrs& bn = std::get<BatchNormAttrs>(a.node.attrs);
  const ValueId scale = a.input(1), mean = a.input(3), var = a.input(4);
  const DType xt = e.dtype(a.input(0)), t = e.dtype(scale);
  const auto to = [&](ValueId v, DType d) {
    return e.dtype(v) == d ? v : e.op1(OpKind::cast, CastAttrs{d}, {v}, "cast");
  };
  const ValueId dy_out = gradient_at_sum(a);
  const ValueId dy = to(dy_out, t);
  Shape per_channel(size_t(e.rank(dy) - 1), 1);
  per_channel[0] = e.shape(dy)[1];
  const auto channel = [&](ValueId v) { return e.reshape(v, per_channel); };

  const ValueId inv_std =
      e.op1(OpKind::rsqrt, {}, {e.add(var, e.scalar(t, bn.epsilon))}, "inv_std");
  const ValueId s = e.mul(scale, inv_std);
  Grads out(a.node.inputs.size(), kNoValue);
  if (has_residual(a) && a.needs_input(5)) out[5] = dy_out;
  if (a.needs_input(0)) out[0] = to(e.mul(dy, channel(s)), xt);
  ValueId dbias = kNoValue, dscale = kNoValue;
  if (a.needs_input(2) || a.needs_input(3)) dbias = e.sum_per_channel(dy);
  if (a.needs_input(1) || a.needs_input(4)) {
    const ValueId xhat = e.mul(e.sub(to(a.input(0), t), channel(mean)), channel(inv_std));
    dscale = e.sum_per_channel(e.mul(dy, xhat));
  }
  if (a.needs_input(1)) out[1] = dscale;
  if (a.needs_input(2)) out[2] = dbias;
  if (a.needs_input(3)) out[3] = e.neg(e.mul(dbias, s));
  if (a.needs_input(4)) {
    const ValueId inv_var = e.mul(inv_std, inv_std);
    out[4] = e.scale(e.mul(e.mul(dscale, scale), inv_var), -0.5);
  }
  return out;
}

// Whether summing over broadcast dims takes `from` to `to` (to aligns at the back, each
// of its dims 1 or equal).
bool sums_to(const Shape& from, const Shape& to) {
  if (to.size() > from.size()) return false;
  const size_t lead = from.size() - to.size();
  for (size_t d = 0; d < to.size(); ++d)
    if (to[d] != 1 && to[d] != from[lead + d]) return false;
  return true;
}

// The norm backward ops give dscale / dbias shaped like scale (or like the normalised
// dims without one), while the operand may broadcast to the normalised dims: sum them
// to the operand's shape. A bias broadcasting differently from the scale (scale [W],
// bias [H, W]) cannot come from the op's dbias; since y = ... + bias, its gradient is
// then dy summed to bias's shape.
ValueId like_operand(VjpArgs& a, ValueId grad, size_t input) {
  const Shape shape = a.e.shape(a.input(input));
  if (sums_to(a.e.shape(grad), shape)) return a.e.sum_to_shape(grad, shape);
  return a.e.sum_to_shape(a.dy[0], shape);
}

// The forward's scale, or ones over the normalised dims when it has none: the IR
// (infer.cpp's op table) requires layer_norm_backward's and rms_norm_backward's scale
// input although ops.h marks it optional.
ValueId scale_or_ones(VjpArgs& a) {
  if (a.node.inputs.size() > 1 && a.input(1) != kNoValue) return a.input(1);
  const Shape x = a.e.shape(a.input(0));
  const int64_t axis = std::get<NormAttrs>(a.node.attrs).axis;  // normalised
  const Shape normalised(x.begin() + axis, x.end());
  return a.e.expand(a.e.scalar(a.e.dtype(a.input(0)), 1.0), normalised);
}

// The mixed form (ir/ops.h NormAttrs: another y dtype, f32 parameters) is an inference form
// made after autodiff would have run (fold_norm_casts): it has no gradient rule.
void expect_plain_norm(VjpArgs& a) {
  const DType x = a.e.dtype(a.input(0));
  bool mixed = std::get<NormAttrs>(a.node.attrs).y_dtype.value_or(x) != x;
  for (size_t i = 1; i < a.node.inputs.size(); ++i)
    if (a.input(i) != kNoValue && a.e.dtype(a.input(i)) != x) mixed = true;
  if (mixed)
    a.no_gradient(
        "its mixed-dtype form (f32 scale and bias or another y dtype, made by "
        "fold_norm_casts for inference) has no gradient rule");
}

}  // namespace

// batch_norm training: (dx, dscale, dbias) = batch_norm_backward(dy, x, scale,
// saved_mean, saved_inv_std), the forward's outputs 3 and 4; with a fused relu also y, the
// forward's output 0, by which the backward op masks dy (relu's gradient), and the forward's
// bias. The running statistics (inputs 3, 4 and outputs 1, 2) and the saved statistics carry
// no gradient.
Grads vjp_batch_norm(VjpArgs& a) {
  const BatchNormAttrs& bn = std::get<BatchNormAttrs>(a.node.attrs);
  if (!bn.training) return batch_norm_inference(a);
  a.expect_gradient_only_on_first(
      1, "but batch_norm's running and saved statistics have no gradient rule");
  Grads out(a.node.inputs.size(), kNoValue);
  if (has_residual(a)) {
    // relu?(y + residual): the gradient at the sum goes to the residual as it is and
    // through the batch norm as an unfused one's. With the relu, the backward op masks dy by
    // y itself and writes the masked dy it used for the residual (dy_output): one pass over
    // the gradient, not a relu_dx of its own. Without bias: y is not the affine map of x
    // alone here. Without the relu, the residual's gradient is dy itself (no copy).
    if (!a.needs_input(0) && !a.needs_input(1) && !a.needs_input(2)) {
      if (a.needs_input(5)) out[5] = gradient_at_sum(a);
      return out;
    }
    BatchNormAttrs fused = bn;
    fused.dy_output = bn.relu && a.needs_input(5);
    if (a.needs_input(5) && !bn.relu) out[5] = a.dy[0];
    std::vector<ValueId> inputs = {a.dy[0], a.input(0), a.input(1), a.output(3), a.output(4)};
    if (bn.relu) inputs.push_back(a.output(0));
    const std::vector<ValueId> d =
        a.e.op(OpKind::batch_norm_backward, fused, std::move(inputs), "dx_dscale_dbias");
    for (size_t i = 0; i < 3; ++i)
      if (a.needs_input(i)) out[i] = d.at(i);
    if (fused.dy_output) out[5] = d.at(3);
    return out;
  }
  if (!a.needs_input(0) && !a.needs_input(1) && !a.needs_input(2)) return out;
  std::vector<ValueId> inputs = {a.dy[0], a.input(0), a.input(1), a.output(3), a.output(4)};
  // With a fused relu: y, and the bias by which a backend may recompute y from x instead of
  // reading it (ir/ops.h).
  if (bn.relu) inputs.insert(inputs.end(), {a.output(0), a.input(2)});
  const std::vector<ValueId> d =
      a.e.op(OpKind::batch_norm_backward, bn, std::move(inputs), "dx_dscale_dbias");
  for (size_t i = 0; i < 3; ++i)
    if (a.needs_input(i)) out[i] = d.at(i);
  return out;
}

// layer_norm: (dx, dscale, dbias) = layer_norm_backward(dy, x, scale?, mean, inv_std_dev)
// with the forward's statistics outputs; dscale and dbias are summed to their operands'
// shapes when those broadcast.
Grads vjp_layer_norm(VjpArgs& a) {
  a.expect_gradient_only_on_first(1, "but layer_norm's mean and inv_std_dev have no gradient rule");
  expect_plain_norm(a);
  const size_t count = a.node.inputs.size();
  const ValueId scale = scale_or_ones(a);
  const std::vector<ValueId> d =
      a.e.op(OpKind::layer_norm_backward, a.node.attrs,
             {a.dy[0], a.input(0), scale, a.output(1), a.output(2)}, "dx_dscale_dbias");
  Grads out(count, kNoValue);
  for (size_t i = 0; i < count; ++i)
    if (a.needs_input(i)) out[i] = i == 0 ? d.at(0) : like_operand(a, d.at(i), i);
  return out;
}

// rms_norm: (dx, dscale) = rms_norm_backward(dy, x, scale?, inv_rms).
Grads vjp_rms_norm(VjpArgs& a) {
  a.expect_gradient_only_on_first(1, "but rms_norm's inv_rms has no gradient rule");
  expect_plain_norm(a);
  const size_t count = a.node.inputs.size();
  const ValueId scale = scale_or_ones(a);
  const std::vector<ValueId> d = a.e.op(OpKind::rms_norm_backward, a.node.attrs,
                                        {a.dy[0], a.input(0), scale, a.output(1)}, "dx_dscale");
  Grads out(count, kNoValue);
  for (size_t i = 0; i < count; ++i)
    if (a.needs_input(i)) out[i] = i == 0 ? d.at(0) : like_operand(a, d.at(i), i);
  return out;
}

// softmax / log_softmax: their backward ops, from the forward output y.
Grads vjp_softmax(VjpArgs& a) {
  const OpKind back =
      a.node.op == OpKind::softmax ? OpKind::softmax_backward : OpKind::log_softmax_backward;
  return {a.e.op1(back, a.node.attrs, {a.dy[0], a.output(0)}, "dx")};
}

// attention: one attention_backward for dq, dk and dv (and dbias when the bias needs one),
// reading the forward's y and lse (a node formed without lse is computed again with it:
// fuse_attention(with_lse) avoids that). lse is a statistic: no gradient flows into it.
Grads vjp_attention(VjpArgs& a) {
  a.expect_gradient_only_on_first(1, "attention's lse output has no gradient rule");
  AttentionAttrs attrs = std::get<AttentionAttrs>(a.node.attrs);
  const bool has_bias = a.node.inputs.size() > 3;
  std::vector<ValueId> forward_inputs = {a.input(0), a.input(1), a.input(2)};
  if (has_bias) forward_inputs.push_back(a.input(3));
  ValueId y = a.output(0), lse = kNoValue;
  if (attrs.with_lse) {
    lse = a.output(1);
  } else {
    attrs.with_lse = true;
    const std::vector<ValueId> again =
        a.e.op(OpKind::attention, attrs, forward_inputs, "forward_lse");
    y = again[0], lse = again[1];
  }
  std::vector<ValueId> in = {a.dy[0], a.input(0), a.input(1), a.input(2), y, lse};
  if (has_bias) in.push_back(a.input(3));
  attrs.bias_grad = has_bias && a.needs_input(3);
  return a.e.op(OpKind::attention_backward, attrs, std::move(in), "dqkv");
}

// cross_entropy: outputs loss and log_prob.
//   from the loss:     dlogits = cross_entropy_backward(dloss, log_prob, labels, weight?)
//   from log_prob:     dlogits += log_softmax_backward(dlog_prob, log_prob) over dim 1
// The lse_stash form: dlogits = cross_entropy_backward(dloss, lse, labels, weight?, logits);
// its lse is a statistic (no gradient flows into it).
// Labels are integers (no gradient); the class weights have no gradient rule.
Grads vjp_cross_entropy(VjpArgs& a) {
  Emitter& e = a.e;
  const size_t count = a.node.inputs.size();
  if (count > 2 && a.needs_input(2) && a.dy[0] != kNoValue)
    a.no_gradient("cross_entropy's class weights have no gradient rule");
  Grads out(count, kNoValue);
  if (!a.needs_input(0)) return out;
  ValueId dlogits = kNoValue;
  const bool lse_stash = std::get<CrossEntropyAttrs>(a.node.attrs).lse_stash;
  if (a.dy[0] != kNoValue) {
    std::vector<ValueId> in = {a.dy[0], a.output(1), a.input(1)};
    if (count > 2 || lse_stash) in.push_back(count > 2 ? a.input(2) : kNoValue);
    if (lse_stash) in.push_back(a.input(0));
    dlogits = e.op1(OpKind::cross_entropy_backward, a.node.attrs, std::move(in), "dlogits");
  }
  if (a.dy[1] != kNoValue && lse_stash)
    a.no_gradient("the lse output of cross_entropy's lse_stash form has no gradient rule");
  if (a.dy[1] != kNoValue) {
    const ValueId d = e.op1(OpKind::log_softmax_backward, SoftmaxAttrs{1}, {a.dy[1], a.output(1)},
                            "dlogits_from_log_prob");
    dlogits = dlogits == kNoValue ? d : e.add(dlogits, d);
  }
  out[0] = dlogits;
  return out;
}

}  // namespace fusebox::autodiff
