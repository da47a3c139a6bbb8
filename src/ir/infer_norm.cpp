// Inference for the normalisations (batch_norm, layer_norm, rms_norm) and the
// cross-entropy loss.
#include <cmath>
#include <limits>

#include "infer_common.h"

namespace fusebox::infer {
namespace {

constexpr int64_t kAnyRank = std::numeric_limits<int64_t>::max();

void expect_epsilon(const Context& c, double epsilon) {
  FUSEBOX_INFER_CHECK(c, std::isfinite(epsilon) && epsilon >= 0, "epsilon ", epsilon,
                      " must be finite and >= 0");
}

}  // namespace

DType expect_channel_params(const Context& c, int x, int first, int last) {
  const DType xt = c.dtype(x);
  const bool low = xt == DType::f16 || xt == DType::bf16;
  for (int i = first; i <= last; ++i) {
    FUSEBOX_INFER_CHECK(
        c, c.dtype(i) == xt || (low && c.dtype(i) == DType::f32), c.input(i), " is ",
        dtype_name(c.dtype(i)), " but ", c.input(x), " is ", dtype_name(xt),
        ": the per-channel inputs must have x's dtype, or f32 when x is f16 or bf16");
  }
  for (int i = first + 1; i <= last; ++i) {
    FUSEBOX_INFER_CHECK(c, c.dtype(i) == c.dtype(first), c.input(i), " is ", dtype_name(c.dtype(i)),
                        " but ", c.input(first), " is ", dtype_name(c.dtype(first)),
                        ": the per-channel inputs must share one dtype");
  }
  return c.dtype(first);
}

// batch_norm: x [N, C, D...] with scale, bias, mean, var all [C], of x's dtype or (x f16 or
// bf16) all f32; residual? like x. Inference: y (x's type). Training: y, new running mean, new
// running var, saved mean and saved inverse std ([C] each, the per-channel inputs' dtype).
Types infer_batch_norm(Context& c) {
  const BatchNormAttrs& a = c.attrs<BatchNormAttrs>();
  c.expect_float(0);
  c.expect_rank_between(0, 2, kAnyRank, "[N, C, D...]");
  const Shape& x = c.shape(0);
  const int64_t C = x[1];
  for (int i = 1; i <= 4; ++i)
    c.expect_shape(i, {C}, cat("([C], one per channel of x ", shape_str(x), ")"));
  const DType param = expect_channel_params(c, 0, 1, 4);
  if (c.count() > 5 && c.has(5)) {  // a fused residual add: x's type
    c.expect_same_dtype(5, 0);
    c.expect_shape(5, x, "(the residual added to y: x's shape)");
  }
  if (c.count() > 6 && c.has(6)) {  // x's statistics, from its producer (ops.h)
    FUSEBOX_INFER_CHECK(c, a.training && !a.sync,
                        "batch_stats (x's statistics given) needs the training form without sync");
    FUSEBOX_INFER_CHECK(c, c.dtype(6) == DType::f64, c.shaped(6),
                        " must be f64 (batch_stats: count, mean and M2 of each channel)");
    c.expect_shape(6, {C, 3}, "([C, 3]: count, mean and M2 of each channel of x)");
  }
  expect_epsilon(c, a.epsilon);
  FUSEBOX_INFER_CHECK(c, std::isfinite(a.momentum), "momentum ", a.momentum, " must be finite");
  FUSEBOX_INFER_CHECK(
      c, a.training || !a.sync,
      "sync (statistics over every rank's batch) needs the training form: inference "
      "normalises with the running statistics");
  FUSEBOX_INFER_CHECK(c, !a.dy_output, "dy_output is batch_norm_backward's (the dy it used)");
  if (!a.training) return {c.type(0)};
  // Batch statistics need at least one element per channel.
  FUSEBOX_INFER_CHECK(c, C == 0 || c.product(x, 0, x.size()) > 0,
                      "training needs batch statistics but ", c.shaped(0),
                      " has no elements per channel");
  const TensorType per_channel{param, {C}};
  return {c.type(0), per_channel, per_channel, per_channel, per_channel};
}

// batch_norm_apply: x [N, C, D...] with scale, bias, saved_mean, saved_inv_std all [C], as
// batch_norm's per-channel inputs; y has x's type.
Types infer_batch_norm_apply(Context& c) {
  c.expect_float(0);
  c.expect_rank_between(0, 2, kAnyRank, "[N, C, D...]");
  const Shape& x = c.shape(0);
  for (int i = 1; i <= 4; ++i)
    c.expect_shape(i, {x[1]}, cat("([C], one per channel of x ", shape_str(x), ")"));
  expect_channel_params(c, 0, 1, 4);
  return {c.type(0)};
}

// layer_norm: x, scale?, bias? normalised over dims [axis, rank); scale and bias
// broadcast (one way) to those dims. Outputs y, mean, inv_std_dev; the statistics
// keep x's shape with the normalised dims set to 1, in f32 (f64 for f64 x), as
// ONNX's stash_type. rms_norm: x, scale? -> y, inv_rms (same rules).
Types infer_layer_norm(Context& c) {
  NormAttrs& a = c.attrs<NormAttrs>();
  c.expect_float(0);
  c.expect_rank_between(0, 1, kAnyRank, "[..., normalised dims]");
  const Shape& x = c.shape(0);
  a.axis = c.axis(a.axis, c.rank(0), "axis");
  const Shape normalised(x.begin() + a.axis, x.end());
  for (int64_t d : normalised)
    FUSEBOX_INFER_CHECK(c, d >= 1, "the normalised dims ", shape_str(normalised), " of ",
                        c.shaped(0), " (from axis ", a.axis, ") hold no elements");
  // The mixed form (ir/ops.h NormAttrs): f32 parameters, y's dtype from y_dtype.
  const DType x_dtype = c.dtype(0), y_dtype = a.y_dtype.value_or(x_dtype);
  const auto low = [](DType t) { return t == DType::f16 || t == DType::bf16; };
  bool f32_params = false;
  for (int i = 1; i < c.count(); ++i)
    if (c.has(i) && c.dtype(i) == DType::f32 && x_dtype != DType::f32) f32_params = true;
  const bool mixed = y_dtype != x_dtype || f32_params;
  if (mixed) {
    FUSEBOX_INFER_CHECK(
        c,
        x_dtype == y_dtype
            ? low(x_dtype)
            : (x_dtype == DType::f32 && low(y_dtype)) || (low(x_dtype) && y_dtype == DType::f32),
        "x ", dtype_name(x_dtype), " with y ", dtype_name(y_dtype),
        ": the mixed form takes x and y of one dtype (f16 or bf16) with f32 scale and bias, "
        "or one of them f32 and the other f16 or bf16");
  }
  for (int i = 1; i < c.count(); ++i) {
    if (!c.has(i)) continue;
    if (mixed)
      FUSEBOX_INFER_CHECK(c, c.dtype(i) == DType::f32, c.input(i), " is ", dtype_name(c.dtype(i)),
                          " but the mixed form (x ", dtype_name(x_dtype), ", y ",
                          dtype_name(y_dtype), ") takes f32 scale and bias");
    else
      c.expect_same_dtype(i, 0);
    Shape b;
    FUSEBOX_INFER_CHECK(c, broadcast_shapes(c.shape(i), normalised, &b) && b == normalised,
                        c.shaped(i), " does not broadcast to the normalised dims ",
                        shape_str(normalised), " of ", c.shaped(0), " (axis ", a.axis, ")");
  }
  expect_epsilon(c, a.epsilon);

  Shape stats_shape = x;
  for (size_t d = size_t(a.axis); d < x.size(); ++d) stats_shape[d] = 1;
  const TensorType stats{stash_dtype(c.dtype(0)), stats_shape};
  const TensorType y{y_dtype, x};
  if (c.op() == OpKind::rms_norm) return {y, stats};
  return {y, stats, stats};
}

// cross_entropy: logits [N, C, D...] (float), labels [N, D...] (i64 or i32),
// weight [C]? -> loss (scalar, or [N, D...] with reduction none), log_prob (logits' type);
// the lse_stash form: loss and lse [N, D...] in stash_dtype(logits), weight [classes] too.
Types infer_cross_entropy(Context& c) {
  const CrossEntropyAttrs& a = c.attrs<CrossEntropyAttrs>();
  FUSEBOX_INFER_CHECK(c,
                      a.reduction == Reduction::none || a.reduction == Reduction::sum ||
                          a.reduction == Reduction::mean,
                      "unknown reduction ", int(a.reduction));
  c.expect_float(0);
  c.expect_rank_between(0, 2, kAnyRank, "[N, C, D...]");
  const Shape& logits = c.shape(0);
  FUSEBOX_INFER_CHECK(c, logits[1] >= 1, c.shaped(0), " has no classes (C = 0)");
  FUSEBOX_INFER_CHECK(c, !a.classes || a.lse_stash,
                      "classes is an attribute of the lse_stash form only");
  FUSEBOX_INFER_CHECK(c, !a.classes || (*a.classes >= 1 && *a.classes <= logits[1]), "classes ",
                      a.classes.value_or(0), " is outside [1, ", logits[1], "] (dim 1 of ",
                      c.shaped(0), ")");
  const int64_t classes = a.classes.value_or(logits[1]);
  FUSEBOX_INFER_CHECK(c, is_integer(c.dtype(1)), c.input(1), " is ", dtype_name(c.dtype(1)),
                      " but must be i64 or i32");
  Shape labels = logits;
  labels.erase(labels.begin() + 1);
  c.expect_shape(1, labels, cat("([N, D...]: logits ", shape_str(logits), " without dim 1)"));
  const DType stat = a.lse_stash ? stash_dtype(c.dtype(0)) : c.dtype(0);
  if (c.has(2)) {
    FUSEBOX_INFER_CHECK(c, c.dtype(2) == stat, c.input(2), " is ", dtype_name(c.dtype(2)),
                        " but must be ", dtype_name(stat),
                        a.lse_stash ? " (the lse_stash form's statistics dtype)" : "");
    c.expect_shape(2, {classes}, "([C], one per class)");
  }
  const Shape loss = a.reduction == Reduction::none ? labels : Shape{};
  if (a.lse_stash) return {{stat, loss}, {stat, labels}};
  return {{c.dtype(0), loss}, c.type(0)};
}

}  // namespace fusebox::infer
