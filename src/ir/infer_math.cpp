// Inference for the arithmetic ops: unary pointwise ops, numpy-broadcasting binary
// ops, matmul, gemm, reductions and softmax.
#include <algorithm>
#include <cmath>

#include "infer_common.h"

namespace fusebox::infer {
namespace {

// " (dim -1: 3 vs 4)": the first dim, counted from the back, where a and b clash.
std::string broadcast_clash(const Shape& a, const Shape& b) {
  for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
    int64_t da = a[a.size() - i], db = b[b.size() - i];
    if (da != db && da != 1 && db != 1) return cat(" (dim -", i, ": ", da, " vs ", db, ")");
  }
  return "";
}

}  // namespace

// Unary pointwise ops keep x's type. Transcendental ops need floats; relu, neg,
// abs and clip also take integers.
Types infer_unary(Context& c) {
  const OpKind op = c.op();
  if (op == OpKind::relu || op == OpKind::neg || op == OpKind::abs || op == OpKind::clip)
    c.expect_numeric(0);
  else
    c.expect_float(0);
  if (op == OpKind::leaky_relu) {
    const double alpha = c.attrs<LeakyReluAttrs>().alpha;
    FUSEBOX_INFER_CHECK(c, std::isfinite(alpha), "alpha ", alpha, " must be finite");
  }
  if (op == OpKind::clip) {
    const ClipAttrs& a = c.attrs<ClipAttrs>();
    FUSEBOX_INFER_CHECK(c, !std::isnan(a.min) && !std::isnan(a.max), "min ", a.min, " and max ",
                        a.max, " must not be NaN (use +-infinity for no bound)");
    FUSEBOX_INFER_CHECK(c, a.min <= a.max, "min ", a.min, " is greater than max ", a.max);
  }
  return {c.type(0)};
}

// add sub mul div max min pow: numpy broadcasting; both operands share a dtype,
// except pow's exponent (any numeric dtype; the result has the base's dtype).
Types infer_binary(Context& c) {
  c.expect_numeric(0);
  c.expect_numeric(1);
  if (c.op() != OpKind::pow) c.expect_same_dtype(1, 0);
  Shape out;
  FUSEBOX_INFER_CHECK(c, broadcast_shapes(c.shape(0), c.shape(1), &out), c.shaped(0), " and ",
                      c.shaped(1), " do not broadcast", broadcast_clash(c.shape(0), c.shape(1)));
  return {{c.dtype(0), out}};
}

// The comparisons and logic ops (ops.h): numpy broadcasting, a bool result. Comparisons
// take one numeric dtype for both operands (equal also bool); the logic ops bools.
Types infer_logic(Context& c) {
  const bool logic = c.op() == OpKind::logical_not || c.op() == OpKind::logical_and ||
                     c.op() == OpKind::logical_or || c.op() == OpKind::logical_xor;
  for (int i = 0; i < c.count(); ++i) {
    if (logic)
      FUSEBOX_INFER_CHECK(c, c.dtype(i) == DType::boolean, c.input(i), " must be bool, got ",
                          dtype_name(c.dtype(i)));
    else if (c.op() != OpKind::equal || c.dtype(i) != DType::boolean)
      c.expect_numeric(i);
  }
  if (c.count() == 1) return {{DType::boolean, c.shape(0)}};
  c.expect_same_dtype(1, 0);
  Shape out;
  FUSEBOX_INFER_CHECK(c, broadcast_shapes(c.shape(0), c.shape(1), &out), c.shaped(0), " and ",
                      c.shaped(1), " do not broadcast", broadcast_clash(c.shape(0), c.shape(1)));
  return {{DType::boolean, out}};
}

// where: condition (bool), a, b (one dtype, any) broadcast together -> a's dtype.
Types infer_where(Context& c) {
  FUSEBOX_INFER_CHECK(c, c.dtype(0) == DType::boolean, c.input(0), " must be bool, got ",
                      dtype_name(c.dtype(0)));
  c.expect_same_dtype(2, 1);
  Shape ab, out;
  FUSEBOX_INFER_CHECK(c, broadcast_shapes(c.shape(1), c.shape(2), &ab), c.shaped(1), " and ",
                      c.shaped(2), " do not broadcast", broadcast_clash(c.shape(1), c.shape(2)));
  FUSEBOX_INFER_CHECK(c, broadcast_shapes(c.shape(0), ab, &out), c.shaped(0),
                      " does not broadcast with ", shape_str(ab), broadcast_clash(c.shape(0), ab));
  return {{c.dtype(1), out}};
}

// matmul (numpy): a [..., M, K] @ b [..., K, N] -> [..., M, N]; a 1-D a is [1, K] and
// a 1-D b is [K, 1], with the added dim removed from the result; batch dims broadcast.
Types infer_matmul(Context& c) {
  c.expect_float(0);
  c.expect_same_dtype(1, 0);
  FUSEBOX_INFER_CHECK(c, c.rank(0) >= 1 && c.rank(1) >= 1,
                      "matmul needs operands of rank >= 1, got ", c.shaped(0), " and ",
                      c.shaped(1));
  Shape a = c.shape(0), b = c.shape(1);
  const bool a_vector = a.size() == 1, b_vector = b.size() == 1;
  if (a_vector) a.insert(a.begin(), 1);
  if (b_vector) b.push_back(1);
  const int64_t M = a[a.size() - 2], K = a.back(), b_rows = b[b.size() - 2], N = b.back();
  FUSEBOX_INFER_CHECK(c, K == b_rows, c.shaped(0), " and ", c.shaped(1), " do not multiply: a has ",
                      K, " columns (K) but b has ", b_rows, " rows");
  const Shape a_batch(a.begin(), a.end() - 2), b_batch(b.begin(), b.end() - 2);
  Shape out;
  FUSEBOX_INFER_CHECK(c, broadcast_shapes(a_batch, b_batch, &out), "the batch dims of ",
                      c.shaped(0), " and ", c.shaped(1), " do not broadcast",
                      broadcast_clash(a_batch, b_batch));
  if (!a_vector) out.push_back(M);
  if (!b_vector) out.push_back(N);
  return {{c.dtype(0), out}};
}

// gemm: A [M, K] (or [K, M] with trans_a), B [K, N] (or [N, K]), C? broadcastable to [M, N].
Types infer_gemm(Context& c) {
  const GemmAttrs& a = c.attrs<GemmAttrs>();
  c.expect_float(0);
  expect_activation(c, a.activation, "activation");
  c.expect_same_dtype(1, 0);
  c.expect_rank(0, 2, a.trans_a ? "[K, M] (trans_a)" : "[M, K]");
  c.expect_rank(1, 2, a.trans_b ? "[N, K] (trans_b)" : "[K, N]");
  const Shape& A = c.shape(0);
  const Shape& B = c.shape(1);
  const int64_t M = a.trans_a ? A[1] : A[0], K = a.trans_a ? A[0] : A[1];
  const int64_t b_K = a.trans_b ? B[1] : B[0], N = a.trans_b ? B[0] : B[1];
  FUSEBOX_INFER_CHECK(c, K == b_K, c.shaped(0), " (trans_a ", a.trans_a, ") gives K = ", K, " but ",
                      c.shaped(1), " (trans_b ", a.trans_b, ") gives K = ", b_K);
  const Shape y = {M, N};
  if (c.has(2)) {
    c.expect_same_dtype(2, 0);
    Shape b;
    FUSEBOX_INFER_CHECK(c, broadcast_shapes(c.shape(2), y, &b) && b == y, c.shaped(2),
                        " does not broadcast to [M, N] = ", shape_str(y));
  }
  // The mixed form (ir/ops.h GemmAttrs): f16/bf16 operands, the f32 accumulator stored.
  const DType y_dtype = a.y_dtype.value_or(c.dtype(0));
  if (y_dtype != c.dtype(0))
    FUSEBOX_INFER_CHECK(c, is_low_float(c.dtype(0)) && y_dtype == DType::f32 && !c.has(2),
                        "y_dtype ", dtype_name(y_dtype), " with ", c.shaped(0),
                        ": the mixed form takes f16 or bf16 operands without C and stores f32");
  return {{y_dtype, y}};
}

// reduce_sum / reduce_mean / reduce_max over the listed axes (all when empty).
// Normalises axes to an explicit, sorted list. An empty reduced axis gives the identity:
// sum 0, max -inf (the dtype's lowest for integers: ONNX ReduceMax of an empty set), mean
// NaN (0 / 0, as onnxruntime and torch.mean).
Types infer_reduce(Context& c) {
  ReduceAttrs& a = c.attrs<ReduceAttrs>();
  if (c.op() == OpKind::reduce_mean)
    c.expect_float(0);
  else
    c.expect_numeric(0);
  const Shape& x = c.shape(0);
  const int64_t r = c.rank(0);
  std::vector<int64_t> axes;
  if (a.axes.empty()) {
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  } else {
    axes = c.axes(a.axes, r, "axes");
    std::sort(axes.begin(), axes.end());
  }
  Shape y;
  for (int64_t d = 0; d < r; ++d) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), d);
    if (!reduced)
      y.push_back(x[size_t(d)]);
    else if (a.keepdims)
      y.push_back(1);
  }
  a.axes = axes;
  return {{c.dtype(0), y}};
}

// arg_max / arg_min: i64 indices along one axis (normalised to non-negative), which must
// not be empty; the axis stays as 1 with keepdims.
Types infer_arg_reduce(Context& c) {
  ArgReduceAttrs& a = c.attrs<ArgReduceAttrs>();
  c.expect_numeric(0);
  FUSEBOX_INFER_CHECK(c, c.rank(0) >= 1, c.op_name(), " of a scalar ", c.shaped(0));
  a.axis = c.axis(a.axis, c.rank(0), "axis");
  const Shape& x = c.shape(0);
  FUSEBOX_INFER_CHECK(c, x[size_t(a.axis)] > 0, c.op_name(), " over axis ", a.axis, " of ",
                      c.shaped(0), ", which is empty");
  Shape y;
  for (int64_t d = 0; d < c.rank(0); ++d) {
    if (d != a.axis)
      y.push_back(x[size_t(d)]);
    else if (a.keepdims)
      y.push_back(1);
  }
  return {{DType::i64, y}};
}

// top_k: values of x's type and i64 indices, x's shape with the axis's extent k; numeric x
// of rank >= 1, 0 <= k <= the axis's extent; the axis normalised.
Types infer_top_k(Context& c) {
  TopKAttrs& a = c.attrs<TopKAttrs>();
  c.expect_numeric(0);
  FUSEBOX_INFER_CHECK(c, c.rank(0) >= 1, "top_k of a scalar ", c.shaped(0));
  a.axis = c.axis(a.axis, c.rank(0), "axis");
  Shape y = c.shape(0);
  FUSEBOX_INFER_CHECK(c, a.k >= 0 && a.k <= y[size_t(a.axis)], "k ", a.k, " is outside [0, ",
                      y[size_t(a.axis)], "], the extent of axis ", a.axis, " of ", c.shaped(0));
  y[size_t(a.axis)] = a.k;
  return {{c.dtype(0), y}, {DType::i64, y}};
}

// cumsum: numeric x, y of x's type; the axis normalised.
Types infer_cumsum(Context& c) {
  CumSumAttrs& a = c.attrs<CumSumAttrs>();
  c.expect_numeric(0);
  FUSEBOX_INFER_CHECK(c, c.rank(0) >= 1, "cumsum of a scalar ", c.shaped(0));
  a.axis = c.axis(a.axis, c.rank(0), "axis");
  return {c.type(0)};
}

// softmax / log_softmax over one axis, normalised to non-negative.
Types infer_softmax(Context& c) {
  SoftmaxAttrs& a = c.attrs<SoftmaxAttrs>();
  c.expect_float(0);
  a.axis = c.axis(a.axis, c.rank(0), "axis");
  return {c.type(0)};
}

// attention: q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv], bias? -> [..., Tq, dv] (ir/ops.h).
Types infer_attention(Context& c) {
  const AttentionAttrs& a = c.attrs<AttentionAttrs>();
  c.expect_float(0);
  c.expect_same_dtype(1, 0);
  c.expect_same_dtype(2, 0);
  FUSEBOX_INFER_CHECK(c, c.rank(0) >= 3 && c.rank(0) <= 4,
                      "attention takes q [B, H, Tq, d] or [B, Tq, d], got ", c.shaped(0));
  FUSEBOX_INFER_CHECK(c, c.rank(1) == c.rank(0) && c.rank(2) == c.rank(0),
                      "q, k and v need one rank: ", c.shaped(0), ", ", c.shaped(1), ", ",
                      c.shaped(2));
  const Shape &q = c.shape(0), &k = c.shape(1), &v = c.shape(2);
  const size_t r = q.size();
  for (size_t d = 0; d + 2 < r; ++d)
    FUSEBOX_INFER_CHECK(c, k[d] == q[d] && v[d] == q[d], "the leading dims of ", c.shaped(0), ", ",
                        c.shaped(1), " and ", c.shaped(2), " differ");
  FUSEBOX_INFER_CHECK(c, k[r - 1] == q[r - 1], c.shaped(0), " and ", c.shaped(1),
                      " differ in the head dim");
  FUSEBOX_INFER_CHECK(c, v[r - 2] == k[r - 2], c.shaped(1), " and ", c.shaped(2),
                      " differ in the key count");
  // A query row over no keys has no softmax (PyTorch's fused kernels refuse it too); with
  // no query rows there is nothing to compute.
  FUSEBOX_INFER_CHECK(c, k[r - 2] > 0 || numel(Shape(q.begin(), q.end() - 1)) == 0, c.shaped(1),
                      " has no keys (Tk = 0) for the queries of ", c.shaped(0),
                      ": a softmax over nothing");
  FUSEBOX_INFER_CHECK(c, std::isfinite(a.scale), "scale ", a.scale, " is not finite");
  FUSEBOX_INFER_CHECK(c, !a.bias_grad,
                      "bias_grad is attention_backward's attribute, not attention's");
  FUSEBOX_INFER_CHECK(c, !a.causal || q[r - 2] <= k[r - 2], "causal attention needs Tq <= Tk, got ",
                      c.shaped(0), " and ", c.shaped(1));
  if (c.has(3)) {
    c.expect_float(3);
    Shape scores = q, joined;
    scores[r - 1] = k[r - 2];
    FUSEBOX_INFER_CHECK(
        c, c.rank(3) <= r && broadcast_shapes(c.shape(3), scores, &joined) && joined == scores,
        c.shaped(3), " does not broadcast to the scores ", shape_str(scores));
  }
  Shape y = q;
  y[r - 1] = v[r - 1];
  if (!a.with_lse) return {{c.dtype(0), y}};
  return {{c.dtype(0), y}, {DType::f32, Shape(q.begin(), q.end() - 1)}};
}

}  // namespace fusebox::infer
