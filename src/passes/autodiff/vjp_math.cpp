// VJP rules for the arithmetic ops: unary and binary pointwise ops, matmul, gemm and
// the reductions.
#include <algorithm>

#include "vjp.h"

namespace fusebox::autodiff {
namespace {

// The forward attributes a unary op's derivative needs, in unary_backward's form.
UnaryBackwardAttrs unary_backward_attrs(const Node& n) {
  UnaryBackwardAttrs b;
  b.op = n.op;
  if (const auto* a = std::get_if<LeakyReluAttrs>(&n.attrs)) b.alpha = a->alpha;
  if (const auto* a = std::get_if<GeluAttrs>(&n.attrs))
    b.tanh_approximation = a->tanh_approximation;
  if (const auto* a = std::get_if<ClipAttrs>(&n.attrs)) {
    b.min = a->min;
    b.max = a->max;
  }
  return b;
}

// perm swapping the last two of `rank` dims.
std::vector<int64_t> swap_last_two(int64_t rank) {
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d) perm.push_back(d);
  std::swap(perm[size_t(rank - 2)], perm[size_t(rank - 1)]);
  return perm;
}

}  // namespace

// Unary pointwise ops: dx = unary_backward(dy, x) = dy * f'(x); neg: dx = -dy.
// relu reads its output instead: y > 0 exactly where x > 0, so relu'(y) is relu'(x), and
// the input (a batch norm's output, usually) need not live until the backward pass: the
// output is kept anyway, as the next convolution's input (a third less activation memory
// in a ResNet's training step).
Grads vjp_unary(VjpArgs& a) {
  if (a.node.op == OpKind::neg) return {a.e.neg(a.dy[0])};
  // floor, ceil, round are piecewise constant: a zero gradient (as PyTorch), no node.
  if (a.node.op == OpKind::floor || a.node.op == OpKind::ceil || a.node.op == OpKind::round)
    return {kNoValue};
  const ValueId at = a.node.op == OpKind::relu ? a.output(0) : a.input(0);
  return {a.e.op1(OpKind::unary_backward, unary_backward_attrs(a.node), {a.dy[0], at}, "dx")};
}

// Binary ops broadcast, so each operand's gradient (taken at the output's shape) is
// summed back to the operand's shape.
//   add: da = dy, db = dy;  sub: da = dy, db = -dy;  mul: da = dy * b, db = dy * a;
//   div by what needs no gradient: da = dy / b;
//   div, max, min, pow: (da, db) = binary_backward(dy, a, b).
Grads vjp_binary(VjpArgs& a) {
  Emitter& e = a.e;
  const ValueId dy = a.dy[0], x0 = a.input(0), x1 = a.input(1);
  ValueId d0 = kNoValue, d1 = kNoValue;  // at the output's shape
  const OpKind op = a.node.op;
  if (op == OpKind::add) {
    d0 = d1 = dy;
  } else if (op == OpKind::sub) {
    d0 = dy;
    if (a.needs_input(1)) d1 = e.neg(dy);
  } else if (op == OpKind::mul) {
    if (a.needs_input(0)) d0 = e.mul(dy, x1);
    if (a.needs_input(1)) d1 = x0 == x1 ? d0 : e.mul(dy, x0);  // x * x: one product, twice
  } else if (op == OpKind::div && !a.needs_input(1)) {
    // A quotient by what needs no gradient (x / 6, q / sqrt(d)): da = dy / b alone, an
    // elementwise op the backward's chains fuse, reading b only (a need not be kept).
    d0 = e.op1(OpKind::div, {}, {dy, x1}, "div");
  } else {
    // div, max, min, pow
    const std::vector<ValueId> both =
        e.op(OpKind::binary_backward, BinaryBackwardAttrs{op}, {dy, x0, x1}, "da_db");
    d0 = both.at(0);
    d1 = both.at(1);
  }
  Grads out(2, kNoValue);
  if (a.needs_input(0)) out[0] = e.sum_to_shape(d0, e.shape(x0));
  if (a.needs_input(1)) out[1] = e.sum_to_shape(d1, e.shape(x1));
  return out;
}

// all_reduce: data-parallel training averages every rank's parameter gradients at the end
// (the objective is the ranks' mean loss), so each rank propagates W times its share of the
// true gradient. Through a sum y = sum_r x_r that is sum_r dy_r, through a mean it is
// mean_r dy_r: the cotangents all-reduced with the node's own attributes, in one bucket (every
// rank builds the same graph, so the collectives match). A world of one: the identity.
Grads vjp_all_reduce(VjpArgs& a) {
  std::vector<ValueId> dys;
  std::vector<size_t> which;
  for (size_t i = 0; i < a.node.inputs.size(); ++i) {
    if (!a.needs_input(i) || a.dy[i] == kNoValue) continue;
    dys.push_back(a.dy[i]);
    which.push_back(i);
  }
  Grads out(a.node.inputs.size(), kNoValue);
  if (dys.empty()) return out;
  const std::vector<ValueId> dx = a.e.op(OpKind::all_reduce, a.node.attrs, dys, "dx");
  for (size_t k = 0; k < which.size(); ++k) out[which[k]] = dx[k];
  return out;
}

// cumsum: x[j] reaches every y[i] with i >= j (reverse: i <= j), so dx is the cumsum of dy
// the other way, exclusive as the forward.
Grads vjp_cumsum(VjpArgs& a) {
  CumSumAttrs c = std::get<CumSumAttrs>(a.node.attrs);
  c.reverse = !c.reverse;
  return {a.e.op1(OpKind::cumsum, c, {a.dy[0]}, "dx")};
}

// where: a's gradient is dy where the condition holds, else 0; b's the rest; each summed
// back to its operand's shape. The condition (bool) has none.
Grads vjp_where(VjpArgs& a) {
  Emitter& e = a.e;
  const ValueId dy = a.dy[0], cond = a.input(0);
  const ValueId zero = e.scalar(e.dtype(dy), 0.0);
  Grads out(3, kNoValue);
  if (a.needs_input(1))
    out[1] = e.sum_to_shape(e.op1(OpKind::where, {}, {cond, dy, zero}, "da"), e.shape(a.input(1)));
  if (a.needs_input(2))
    out[2] = e.sum_to_shape(e.op1(OpKind::where, {}, {cond, zero, dy}, "db"), e.shape(a.input(2)));
  return out;
}

// matmul (numpy): with 1-D operands promoted (a [K] -> [1, K], b [K] -> [K, 1]) and dy
// reshaped to match, da = dy @ b^T and db = a^T @ dy over the last two dims; each is
// then summed over the batch dims that broadcasting stretched and reshaped back.
Grads vjp_matmul(VjpArgs& a) {
  Emitter& e = a.e;
  const ValueId x0 = a.input(0), x1 = a.input(1);
  const Shape a_shape = e.shape(x0), b_shape = e.shape(x1);
  Shape a2 = a_shape, b2 = b_shape, y2 = e.shape(a.dy[0]);
  if (a_shape.size() == 1) {
    a2.insert(a2.begin(), 1);
    y2.insert(y2.end() - (b_shape.size() == 1 ? 0 : 1), 1);  // the removed M
  }
  if (b_shape.size() == 1) {
    b2.push_back(1);
    y2.push_back(1);  // the removed N
  }
  const ValueId dy = e.reshape(a.dy[0], y2);
  const ValueId pa = e.reshape(x0, a2), pb = e.reshape(x1, b2);
  Grads out(2, kNoValue);
  if (a.needs_input(0)) {
    const ValueId bt = e.transpose(pb, swap_last_two(int64_t(b2.size())));
    const ValueId da = e.op1(OpKind::matmul, {}, {dy, bt}, "da");
    out[0] = e.reshape(e.sum_to_shape(da, a2), a_shape);
  }
  if (a.needs_input(1)) {
    const ValueId at = e.transpose(pa, swap_last_two(int64_t(a2.size())));
    const ValueId db = e.op1(OpKind::matmul, {}, {at, dy}, "db");
    out[1] = e.reshape(e.sum_to_shape(db, b2), b_shape);
  }
  return out;
}

// gemm: y = alpha * A' B' + beta * C with A' = trans_a ? A^T : A (B' likewise).
//   dA' = alpha * dy B'^T, so dA = trans_a ? alpha * B' dy^T : alpha * dy B'^T;
//   dB' = alpha * A'^T dy, so dB = trans_b ? alpha * dy^T A' : alpha * A'^T dy;
//   dC = beta * dy summed to C's shape.
// Each product is one gemm whose trans flags absorb the transposes.
Grads vjp_gemm(VjpArgs& a) {
  Emitter& e = a.e;
  const GemmAttrs& g = std::get<GemmAttrs>(a.node.attrs);
  // Activations are fused into inference graphs only, as a conv's epilogue.
  FUSEBOX_CHECK(!g.activation, node_label(a.node),
                "a gemm with a fused activation has no gradient rule: differentiate the "
                "unfused graph (passes/fusion.h)");
  if (g.y_dtype.value_or(a.e.dtype(a.input(0))) != a.e.dtype(a.input(0)))
    a.no_gradient(
        "its mixed-dtype form (an f32 product of low-precision operands, made by "
        "fold_product_casts for inference) has no gradient rule");
  const ValueId dy = a.dy[0], A = a.input(0), B = a.input(1);
  auto product = [&](ValueId lhs, bool t_lhs, ValueId rhs, bool t_rhs, const char* part) {
    return e.op1(OpKind::gemm, GemmAttrs{t_lhs, t_rhs, g.alpha, 1.0}, {lhs, rhs}, part);
  };
  Grads out(a.node.inputs.size(), kNoValue);
  if (a.needs_input(0)) {
    // B'^T is B with the flag flipped; B' is B with trans_b as is.
    out[0] =
        g.trans_a ? product(B, g.trans_b, dy, true, "da") : product(dy, false, B, !g.trans_b, "da");
  }
  if (a.needs_input(1)) {
    out[1] =
        g.trans_b ? product(dy, true, A, g.trans_a, "db") : product(A, !g.trans_a, dy, false, "db");
  }
  if (a.needs_input(2)) out[2] = e.scale(e.sum_to_shape(dy, e.shape(a.input(2))), g.beta);
  return out;
}

// reduce_sum: dx = dy broadcast back over the reduced axes (dy first reshaped to the
// keepdims form). reduce_mean: the same, divided by the count of reduced elements.
// reduce_max: reduce_max_backward(dy, x, y).
Grads vjp_reduce(VjpArgs& a) {
  Emitter& e = a.e;
  const ReduceAttrs& r = std::get<ReduceAttrs>(a.node.attrs);  // axes explicit and sorted
  const ValueId x = a.input(0);
  if (a.node.op == OpKind::reduce_max) {
    return {e.op1(OpKind::reduce_max_backward, r, {a.dy[0], x, a.output(0)}, "dx")};
  }
  const Shape x_shape = e.shape(x);
  Shape kept = x_shape;
  int64_t count = 1;
  for (int64_t axis : r.axes) {
    count *= x_shape[size_t(axis)];
    kept[size_t(axis)] = 1;
  }
  ValueId dy = a.dy[0];
  if (a.node.op == OpKind::reduce_mean) dy = e.scale(dy, 1.0 / double(count));
  return {e.expand(e.reshape(dy, kept), x_shape)};
}

}  // namespace fusebox::autodiff
