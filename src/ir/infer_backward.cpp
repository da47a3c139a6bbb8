// Inference for expand, the backward ops, the optimizer updates and loss scaling (ops.h).
//
// A backward op is checked against its forward op: the forward's inference runs on
// the forward's inputs (rebuilt from the backward's inputs and attributes), which
// normalises the shared attributes exactly as the forward node's are, and gives the
// forward output's type that dy (dloss, y) must have. Its errors are re-thrown as
// this node's, prefixed with the forward op they came from.
#include <cmath>
#include <limits>

#include "fusebox/ir/op_info.h"
#include "infer_common.h"

namespace fusebox::infer {
namespace {

using Inputs = std::vector<std::optional<TensorType>>;

// The forward op's inference on `inputs` with `attrs`, normalising `attrs` in place.
// `what` describes the forward's inputs in messages ("x f32[1, 2, 5] (input_shape)").
template <class A>
Types forward_types(Context& c, OpKind forward, A& attrs, const Inputs& inputs,
                    const std::string& what) {
  Node n;
  n.name = c.node().name;
  n.op = forward;
  n.attrs = attrs;
  Types out;
  try {
    out = infer_and_normalize(n, inputs);
  } catch (const Error& e) {
    const std::string message = e.what();
    const size_t prefix = e.where().size() + 3;  // "[" where "] "
    c.fail(cat("as the forward ", op_name(forward), " of ", what, ": ",
               message.size() > prefix ? message.substr(prefix) : message));
  }
  attrs = std::get<A>(n.attrs);
  return out;
}

std::string type_str(const TensorType& t) {
  return cat(dtype_name(t.dtype), shape_str(t.shape));
}

// Input i must have exactly type `t`, the forward's `what` ("output", "x").
void expect_type(const Context& c, int i, const TensorType& t, const std::string& what) {
  FUSEBOX_INFER_CHECK(c, c.type(i) == t, c.input(i), " is ", type_str(c.type(i)), " but must be ",
                      type_str(t), ", like the forward's ", what);
}

// An input_shape attribute: extents >= 0.
void expect_extents(const Context& c, const Shape& s, const char* name) {
  for (int64_t d : s)
    FUSEBOX_INFER_CHECK(c, d >= 0, name, " ", shape_str(s), " has a negative extent");
}

void expect_finite(const Context& c, double v, const char* name) {
  FUSEBOX_INFER_CHECK(c, std::isfinite(v), name, " ", v, " must be finite");
}

// A rank-0 tensor of any dtype (skip, found_inf: nonzero means true).
void expect_any_scalar(const Context& c, int i) {
  FUSEBOX_INFER_CHECK(c, c.rank(i) == 0, c.input(i), " must be a scalar (shape []) but is ",
                      shape_str(c.shape(i)));
}

// A rank-0 tensor of one of the two given dtype classes (lr: float, step: integer).
void expect_scalar(const Context& c, int i, bool floating) {
  FUSEBOX_INFER_CHECK(c, floating ? is_floating(c.dtype(i)) : is_integer(c.dtype(i)), c.input(i),
                      " is ", dtype_name(c.dtype(i)), " but must be ",
                      floating ? "a float (f32)" : "i64 (or i32)");
  expect_any_scalar(c, i);
}

}  // namespace

// unary_backward: (dy, x) -> dx, all of x's type.
Types infer_unary_backward(Context& c) {
  const UnaryBackwardAttrs& a = c.attrs<UnaryBackwardAttrs>();
  FUSEBOX_INFER_CHECK(c, op_info(a.op).family == OpFamily::unary, "op ", op_name(a.op),
                      " is not a unary op with a derivative (relu .. clip)");
  c.expect_float(1);
  expect_type(c, 0, c.type(1), "output (x's type)");
  if (a.op == OpKind::leaky_relu) expect_finite(c, a.alpha, "alpha");
  if (a.op == OpKind::clip) {
    FUSEBOX_INFER_CHECK(c, !std::isnan(a.min) && !std::isnan(a.max), "min ", a.min, " and max ",
                        a.max, " must not be NaN (use +-infinity for no bound)");
    FUSEBOX_INFER_CHECK(c, a.min <= a.max, "min ", a.min, " is greater than max ", a.max);
  }
  return {c.type(1)};
}

// binary_backward: (dy, a, b) -> (da, db) at the broadcast shape, in a's dtype.
Types infer_binary_backward(Context& c) {
  const OpKind op = c.attrs<BinaryBackwardAttrs>().op;
  FUSEBOX_INFER_CHECK(
      c, op == OpKind::div || op == OpKind::max || op == OpKind::min || op == OpKind::pow, "op ",
      op_name(op), " is not one of div, max, min, pow");
  c.expect_float(1);
  if (op == OpKind::pow)
    c.expect_numeric(2);
  else
    c.expect_same_dtype(2, 1);
  Shape out;
  FUSEBOX_INFER_CHECK(c, broadcast_shapes(c.shape(1), c.shape(2), &out), c.shaped(1), " and ",
                      c.shaped(2), " do not broadcast");
  const TensorType grad{c.dtype(1), out};
  expect_type(c, 0, grad, cat(op_name(op), " output"));
  return {grad, grad};
}

// batch_norm_backward: (dy, x, scale, saved_mean, saved_inv_std, y?, bias?, dy_addend?) -> (dx,
// dscale, dbias, dy_used?): dx in x's type, dscale and dbias in the per-channel inputs' dtype
// (x's, or f32 for f16 or bf16 x, as the forward). y (x's type) is given exactly when relu is;
// bias ([C]) may be with it; dy_addend has dy's type; dy_used (dy's type) with dy_output.
Types infer_batch_norm_backward(Context& c) {
  c.expect_float(1);
  c.expect_rank_between(1, 2, std::numeric_limits<int64_t>::max(), "[N, C, D...]");
  expect_type(c, 0, c.type(1), "output (x's type)");
  const BatchNormAttrs& a = c.attrs<BatchNormAttrs>();
  if (a.relu) {
    FUSEBOX_INFER_CHECK(
        c, c.has(5), c.input(5),
        " is required with relu: the forward's output 0, which masks dy as relu's gradient");
    expect_type(c, 5, c.type(1), "output y (x's type)");
  } else {
    FUSEBOX_INFER_CHECK(c, !c.has(5) && !c.has(6), c.input(c.has(5) ? 5 : 6),
                        " is given but relu is false (only a fused relu reads y and bias)");
  }
  const int64_t C = c.shape(1)[1];
  const int last = c.has(6) ? 6 : 4;
  for (int i = 2; i <= last; ++i) {
    if (i == 5) continue;  // y
    c.expect_shape(i, {C}, cat("([C], one per channel of x ", shape_str(c.shape(1)), ")"));
  }
  const DType param = expect_channel_params(c, 1, 2, 4);
  if (c.has(6)) expect_type(c, 6, TensorType{param, {C}}, "bias (the per-channel dtype)");
  FUSEBOX_INFER_CHECK(c, !a.training || C == 0 || c.product(c.shape(1), 0, c.shape(1).size()) > 0,
                      "training needs batch statistics but ", c.shaped(1),
                      " has no elements per channel");
  if (c.has(7)) expect_type(c, 7, c.type(1), "x (a second term of dy, of dy's type)");
  const TensorType per_channel{param, {C}};
  if (a.dy_output) return {c.type(1), per_channel, per_channel, c.type(1)};
  return {c.type(1), per_channel, per_channel};
}

// layer_norm_backward: (dy, x, scale?, mean, inv_std_dev) -> (dx, dscale, dbias);
// rms_norm_backward: (dy, x, scale?, inv_rms) -> (dx, dscale). The parameter gradients
// are shaped like scale when it is given, else like the normalised dims.
Types infer_norm_backward(Context& c) {
  const bool rms = c.op() == OpKind::rms_norm_backward;
  NormAttrs& a = c.attrs<NormAttrs>();
  Inputs forward_inputs = {c.type(1)};
  if (c.has(2)) forward_inputs.push_back(c.type(2));
  const Types fwd = forward_types(c, rms ? OpKind::rms_norm : OpKind::layer_norm, a, forward_inputs,
                                  cat("x ", type_str(c.type(1))));
  expect_type(c, 0, fwd[0], "output y");
  expect_type(c, 3, fwd[1], rms ? "inv_rms" : "mean");
  if (!rms) expect_type(c, 4, fwd[2], "inv_std_dev");
  const Shape& x = c.shape(1);
  const TensorType param{c.dtype(1), c.has(2) ? c.shape(2) : Shape(x.begin() + a.axis, x.end())};
  if (rms) return {c.type(1), param};
  return {c.type(1), param, param};
}

// softmax_backward / log_softmax_backward: (dy, y) -> dx, y's type.
Types infer_softmax_backward(Context& c) {
  const bool log = c.op() == OpKind::log_softmax_backward;
  const Types fwd =
      forward_types(c, log ? OpKind::log_softmax : OpKind::softmax, c.attrs<SoftmaxAttrs>(),
                    {c.type(1)}, cat("y ", type_str(c.type(1))));
  expect_type(c, 0, fwd[0], "output y");
  return {c.type(1)};
}

// attention_backward: (dy, q, k, v, y, lse, bias?) -> (dq, dk, dv, dbias?), the types of q, k,
// v (and bias).
Types infer_attention_backward(Context& c) {
  AttentionAttrs forward = c.attrs<AttentionAttrs>();
  forward.with_lse = true;
  forward.bias_grad = false;
  Inputs forward_inputs = {c.type(1), c.type(2), c.type(3)};
  if (c.has(6)) forward_inputs.push_back(c.type(6));
  const Types fwd =
      forward_types(c, OpKind::attention, forward, forward_inputs, cat("q ", type_str(c.type(1))));
  expect_type(c, 0, fwd[0], "output y");
  expect_type(c, 4, fwd[0], "output y");
  expect_type(c, 5, fwd[1], "output lse");
  FUSEBOX_INFER_CHECK(c, !c.attrs<AttentionAttrs>().bias_grad || c.has(6),
                      "bias_grad without a bias input");
  if (c.attrs<AttentionAttrs>().bias_grad) return {c.type(1), c.type(2), c.type(3), c.type(6)};
  return {c.type(1), c.type(2), c.type(3)};
}

// cross_entropy_backward: (dloss, log_prob, labels, weight?) -> dlogits, log_prob's type;
// the lse_stash form: (dloss, lse, labels, weight?, logits) -> dlogits, the logits' type.
Types infer_cross_entropy_backward(Context& c) {
  CrossEntropyAttrs& a = c.attrs<CrossEntropyAttrs>();
  FUSEBOX_INFER_CHECK(c, a.lse_stash == c.has(4),
                      a.lse_stash ? "the lse_stash form needs the input logits"
                                  : "takes logits only in the lse_stash form");
  const int logits = a.lse_stash ? 4 : 1;
  Inputs forward_inputs = {c.type(logits), c.type(2)};
  if (c.has(3)) forward_inputs.push_back(c.type(3));
  const Types fwd = forward_types(c, OpKind::cross_entropy, a, forward_inputs,
                                  cat("logits ", type_str(c.type(logits))));
  expect_type(c, 0, fwd[0], "loss");
  if (a.lse_stash) expect_type(c, 1, fwd[1], "lse");
  return {c.type(logits)};
}

// reduce_max_backward: (dy, x, y) -> dx, x's type; dy and y are the forward's output.
Types infer_reduce_max_backward(Context& c) {
  c.expect_float(1);
  const Types fwd = forward_types(c, OpKind::reduce_max, c.attrs<ReduceAttrs>(), {c.type(1)},
                                  cat("x ", type_str(c.type(1))));
  expect_type(c, 0, fwd[0], "output y");
  expect_type(c, 2, fwd[0], "output y");
  return {c.type(1)};
}

// max_pool_backward: (dy, x) -> dx; avg_pool_backward: (dy) -> dx of input_shape.
Types infer_pool_backward(Context& c) {
  const bool is_max = c.op() == OpKind::max_pool_backward;
  PoolBackwardAttrs& a = c.attrs<PoolBackwardAttrs>();
  c.expect_float(0);
  if (is_max) {
    if (a.input_shape.empty()) a.input_shape = c.shape(1);
    FUSEBOX_INFER_CHECK(c, a.input_shape == c.shape(1), "input_shape ", shape_str(a.input_shape),
                        " does not match ", c.shaped(1));
    c.expect_same_dtype(1, 0);
  }
  expect_extents(c, a.input_shape, "input_shape");
  // The forward's second output (indices) plays no part in the gradient.
  a.pool.return_indices = false;
  const TensorType x{c.dtype(0), a.input_shape};
  const Types fwd = forward_types(c, is_max ? OpKind::max_pool : OpKind::avg_pool, a.pool, {x},
                                  cat("x ", type_str(x), is_max ? "" : " (input_shape)"));
  expect_type(c, 0, fwd[0], "output y");
  return {x};
}

// The backward ops whose forward has one input: (dy) -> dx of input_shape, dy's dtype
// (float); the forward's attributes are normalised against input_shape as the forward's.
template <class A>
Types infer_dy_to_input(Context& c, OpKind forward, A& forward_attrs, const Shape& input_shape) {
  c.expect_float(0);
  expect_extents(c, input_shape, "input_shape");
  const TensorType x{c.dtype(0), input_shape};
  const Types fwd =
      forward_types(c, forward, forward_attrs, {x}, cat("x ", type_str(x), " (input_shape)"));
  expect_type(c, 0, fwd[0], "output y");
  return {x};
}

Types infer_slice_backward(Context& c) {
  SliceBackwardAttrs& a = c.attrs<SliceBackwardAttrs>();
  return infer_dy_to_input(c, OpKind::slice, a.slice, a.input_shape);
}

Types infer_pad_backward(Context& c) {
  PadBackwardAttrs& a = c.attrs<PadBackwardAttrs>();
  return infer_dy_to_input(c, OpKind::pad, a.pad, a.input_shape);
}

Types infer_resize_backward(Context& c) {
  ResizeBackwardAttrs& a = c.attrs<ResizeBackwardAttrs>();
  return infer_dy_to_input(c, OpKind::resize, a.resize, a.input_shape);
}

// gather_backward, gather_elements_backward: (dy, indices) -> ddata of data_shape, dy's
// dtype (float).
Types infer_gather_backward(Context& c) {
  GatherBackwardAttrs& a = c.attrs<GatherBackwardAttrs>();
  c.expect_float(0);
  expect_extents(c, a.data_shape, "data_shape");
  const TensorType data{c.dtype(0), a.data_shape};
  const OpKind forward =
      c.op() == OpKind::gather_backward ? OpKind::gather : OpKind::gather_elements;
  const Types fwd = forward_types(c, forward, a.gather, {data, c.type(1)},
                                  cat("data ", type_str(data), " (data_shape)"));
  expect_type(c, 0, fwd[0], "output y");
  return {data};
}

// expand: numpy broadcast_to(x, shape): x's dims, aligned at the back, are 1 or equal
// to shape's.
Types infer_expand(Context& c) {
  const ExpandAttrs& a = c.attrs<ExpandAttrs>();
  const Shape& x = c.shape(0);
  expect_extents(c, a.shape, "shape");
  FUSEBOX_INFER_CHECK(c, x.size() <= a.shape.size(), c.shaped(0), " has more dims than shape ",
                      shape_str(a.shape), " to expand to");
  const size_t lead = a.shape.size() - x.size();
  for (size_t d = 0; d < x.size(); ++d) {
    FUSEBOX_INFER_CHECK(c, x[d] == 1 || x[d] == a.shape[lead + d], c.shaped(0),
                        " does not broadcast to shape ", shape_str(a.shape), " (dim ", d,
                        " of x: ", x[d], " vs ", a.shape[lead + d], ")");
  }
  return {{c.dtype(0), a.shape}};
}

// sgd_update: (param, grad, momentum_buf, lr, grad_scale?, skip?, low_param?) -> (new_param,
// new_momentum_buf, new_low_param?); adamw_update: (param, grad, m, v, lr, step, grad_scale?,
// skip?, low_param?) -> (new_param, new_m, new_v, new_low_param?). The state tensors have
// param's type, grad too or (param f32) bf16/f16 of its shape, low_param bf16/f16 of its shape
// beside an f32 param; lr and grad_scale are float scalars, step an integer one, skip a scalar
// of any dtype.
Types infer_optimizer(Context& c) {
  const bool adamw = c.op() == OpKind::adamw_update;
  const int states = adamw ? 4 : 3;  // param, grad and the state buffers
  c.expect_float(0);
  const TensorType& param = c.type(0);
  const bool f32 = param.dtype == DType::f32;
  FUSEBOX_INFER_CHECK(c,
                      c.type(1) == param ||
                          (f32 && is_low_float(c.type(1).dtype) && c.type(1).shape == param.shape),
                      c.input(1), " is ", type_str(c.type(1)), " but must be ", type_str(param),
                      " like ", c.input(0), f32 ? " (or bf16 / f16 of its shape)" : "");
  for (int i = 2; i < states; ++i)
    FUSEBOX_INFER_CHECK(c, c.type(i) == param, c.input(i), " is ", type_str(c.type(i)),
                        " but must be ", type_str(param), " like ", c.input(0));
  expect_scalar(c, states, true);
  const int grad_scale = adamw ? states + 2 : states + 1;
  if (c.has(grad_scale)) expect_scalar(c, grad_scale, true);
  if (c.has(grad_scale + 1)) expect_any_scalar(c, grad_scale + 1);
  Types out(size_t(states - 1), param);
  if (const int low = grad_scale + 2; c.has(low)) {
    FUSEBOX_INFER_CHECK(
        c, f32 && is_low_float(c.type(low).dtype) && c.type(low).shape == param.shape, c.input(low),
        " is ", type_str(c.type(low)), " but must be bf16 or f16 of ", c.input(0),
        "'s shape beside an f32 ", c.input(0), " (", type_str(param), ")");
    out.push_back(c.type(low));
  }
  if (adamw) {
    expect_scalar(c, states + 1, false);
    const AdamWAttrs& a = c.attrs<AdamWAttrs>();
    FUSEBOX_INFER_CHECK(c, a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1, "beta1 ",
                        a.beta1, " and beta2 ", a.beta2, " must be in [0, 1)");
    FUSEBOX_INFER_CHECK(c, std::isfinite(a.epsilon) && a.epsilon >= 0, "epsilon ", a.epsilon,
                        " must be finite and >= 0");
    expect_finite(c, a.weight_decay, "weight_decay");
    return out;
  }
  const SgdAttrs& a = c.attrs<SgdAttrs>();
  expect_finite(c, a.momentum, "momentum");
  expect_finite(c, a.dampening, "dampening");
  expect_finite(c, a.weight_decay, "weight_decay");
  FUSEBOX_INFER_CHECK(c, !a.nesterov || (a.momentum > 0 && a.dampening == 0),
                      "nesterov needs momentum > 0 and dampening 0 (PyTorch), got momentum ",
                      a.momentum, " and dampening ", a.dampening);
  return out;
}

// nonfinite_any: (x1, ..., xn) -> f32 [], floating-point inputs of any shapes.
Types infer_nonfinite_any(Context& c) {
  for (int i = 0; i < c.count(); ++i) c.expect_float(i);
  return {TensorType{DType::f32, {}}};
}

// all_reduce: (x1, ..., xn) -> (y1, ..., yn), each yi of xi's type; floating-point inputs,
// reduced as f32, bf16 or f16.
Types infer_all_reduce(Context& c) {
  const AllReduceAttrs& a = c.attrs<AllReduceAttrs>();
  FUSEBOX_INFER_CHECK(
      c,
      a.reduce_dtype == DType::f32 || a.reduce_dtype == DType::bf16 || a.reduce_dtype == DType::f16,
      "reduce_dtype ", dtype_name(a.reduce_dtype), " must be f32, bf16 or f16");
  Types out;
  for (int i = 0; i < c.count(); ++i) {
    c.expect_float(i);
    out.push_back(c.type(i));
  }
  return out;
}

// loss_scale_update: (scale, growth_tracker, found_inf, skipped?) -> (new_scale,
// new_growth_tracker, new_skipped?), each output of its input's type.
Types infer_loss_scale_update(Context& c) {
  const LossScaleAttrs& a = c.attrs<LossScaleAttrs>();
  FUSEBOX_INFER_CHECK(c, std::isfinite(a.growth_factor) && a.growth_factor > 1, "growth_factor ",
                      a.growth_factor, " must be finite and > 1");
  FUSEBOX_INFER_CHECK(c, a.backoff_factor > 0 && a.backoff_factor < 1, "backoff_factor ",
                      a.backoff_factor, " must be in (0, 1)");
  FUSEBOX_INFER_CHECK(c, a.growth_interval >= 1, "growth_interval ", a.growth_interval,
                      " must be >= 1");
  expect_scalar(c, 0, true);
  expect_scalar(c, 1, false);
  expect_any_scalar(c, 2);
  Types out = {c.type(0), c.type(1)};
  if (c.has(3)) {
    expect_scalar(c, 3, false);
    out.push_back(c.type(3));
  }
  return out;
}

}  // namespace fusebox::infer
