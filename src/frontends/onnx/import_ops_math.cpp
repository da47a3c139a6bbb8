// Pointwise ops, matmul/gemm, reductions and softmax.
#include "frontends/onnx/import_context.h"

namespace fusebox::onnx_import {
namespace {

template <OpKind K>
void import_unary(NodeContext& c) {
  c.set_output(0, c.emit1(K, {}, {c.input(0)}));
}

void import_leaky_relu(NodeContext& c) {
  LeakyReluAttrs a{c.attrs().get_float("alpha", double(0.01f))};
  c.set_output(0, c.emit1(OpKind::leaky_relu, a, {c.input(0)}));
}

// Gelu (opset 20): approximate "none" (erf) or "tanh".
void import_gelu(NodeContext& c) {
  const std::string approximate = c.attrs().get_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    c.attrs().unsupported_value("approximate", approximate, "supported: none, tanh");
  c.set_output(0, c.emit1(OpKind::gelu, GeluAttrs{approximate == "tanh"}, {c.input(0)}));
}

// Clip (opset 11+): the bounds are optional scalar inputs, which must be known.
void import_clip(NodeContext& c) {
  ClipAttrs a;
  if (c.has_input(1)) a.min = c.const_scalar(1, "min");
  if (c.has_input(2)) a.max = c.const_scalar(2, "max");
  c.set_output(0, c.emit1(OpKind::clip, a, {c.input(0)}));
}

// ---- activations without an op of their own: chains of existing ops (the CUDA backend's
// pointwise fusion runs each chain as one generated kernel) ----

// A scalar of the input's dtype, broadcast by the binary ops.
ValueId scalar(NodeContext& c, double value, const std::string& suffix) {
  return c.constant(Tensor::full(c.input_type(0).dtype, {}, value), suffix);
}

// clip(alpha x + beta, 0, 1); the last node takes `suffix` ("" for the node's own name).
ValueId hard_sigmoid(NodeContext& c, ValueId x, double alpha, double beta,
                     const std::string& suffix) {
  const std::string base = suffix.empty() ? "" : suffix + "/";
  const ValueId ax =
      c.emit1(OpKind::mul, {}, {x, scalar(c, alpha, base + "alpha")}, base + "scale");
  const ValueId axb =
      c.emit1(OpKind::add, {}, {ax, scalar(c, beta, base + "beta")}, base + "shift");
  return c.emit1(OpKind::clip, ClipAttrs{0.0, 1.0}, {axb}, suffix);
}

void import_hard_sigmoid(NodeContext& c) {
  const double alpha = c.attrs().get_float("alpha", double(0.2f));
  const double beta = c.attrs().get_float("beta", double(0.5f));
  c.set_output(0, hard_sigmoid(c, c.input(0), alpha, beta, ""));
}

// x * HardSigmoid(x; 1/6, 1/2).
void import_hard_swish(NodeContext& c) {
  const ValueId x = c.input(0);
  const ValueId gate = hard_sigmoid(c, x, 1.0 / 6.0, 0.5, "gate");
  c.set_output(0, c.emit1(OpKind::mul, {}, {x, gate}));
}

// log(1 + exp(x)) as relu(x) + log(1 + exp(-|x|)): no overflow for large x.
void import_softplus(NodeContext& c) {
  const ValueId x = c.input(0);
  const ValueId neg_abs = c.emit1(OpKind::neg, {}, {c.emit1(OpKind::abs, {}, {x}, "abs")}, "neg");
  const ValueId e = c.emit1(OpKind::exp, {}, {neg_abs}, "exp");
  const ValueId log1p = c.emit1(
      OpKind::log, {}, {c.emit1(OpKind::add, {}, {e, scalar(c, 1, "one")}, "plus_one")}, "log");
  c.set_output(0, c.emit1(OpKind::add, {}, {c.emit1(OpKind::relu, {}, {x}, "relu"), log1p}));
}

// x > 0 ? x : alpha (exp(x) - 1), as relu(x) - alpha relu(1 - exp(x)) (exp(x) = inf for large x
// gives relu(-inf) = 0, never a NaN).
void import_elu(NodeContext& c) {
  const double alpha = c.attrs().get_float("alpha", 1.0);
  const ValueId x = c.input(0);
  const ValueId e = c.emit1(OpKind::exp, {}, {x}, "exp");
  const ValueId below = c.emit1(
      OpKind::relu, {}, {c.emit1(OpKind::sub, {}, {scalar(c, 1, "one"), e}, "one_minus")}, "below");
  const ValueId scaled = c.emit1(OpKind::mul, {}, {below, scalar(c, alpha, "alpha")}, "scaled");
  c.set_output(0, c.emit1(OpKind::sub, {}, {c.emit1(OpKind::relu, {}, {x}, "relu"), scaled}));
}

// x > 0 ? x : slope x, as relu(x) - slope relu(-x); slope broadcasts to x (any values).
void import_prelu(NodeContext& c) {
  const ValueId x = c.input(0);
  const ValueId below = c.emit1(OpKind::relu, {}, {c.emit1(OpKind::neg, {}, {x}, "neg")}, "below");
  // The slope through an expand to its own shape (no work: a view): training takes a
  // one-element constant that only scalings read for a literal an export left behind
  // (train/session.h), and a shared slope [1] (nn.PReLU()'s default) is a parameter.
  const ValueId slope =
      c.emit1(OpKind::expand, ExpandAttrs{c.input_type(1).shape}, {c.input(1)}, "slope");
  const ValueId scaled = c.emit1(OpKind::mul, {}, {slope, below}, "scaled");
  c.set_output(0, c.emit1(OpKind::sub, {}, {c.emit1(OpKind::relu, {}, {x}, "relu"), scaled}));
}

template <OpKind K>
void import_binary(NodeContext& c) {
  c.set_output(0, c.emit1(K, {}, {c.input(0), c.input(1)}));
}

// Max, Min and Sum take any number of inputs: a chain of the binary op (each step
// broadcasts, so the chain broadcasts all inputs together, as ONNX).
ValueId chain(NodeContext& c, OpKind op, const std::string& last_suffix) {
  ValueId v = c.input(0);
  for (int i = 1; i < c.input_count(); ++i) {
    const bool last = i + 1 == c.input_count();
    v = c.emit1(op, {}, {v, c.input(i)}, last ? last_suffix : cat("step", i));
  }
  return v;
}

template <OpKind K>
void import_variadic(NodeContext& c) {
  c.set_output(0, chain(c, K, ""));
}

// Mean: the sum of the inputs divided by their count.
void import_mean(NodeContext& c) {
  ValueId sum = chain(c, OpKind::add, "sum");
  ValueId count =
      c.constant(Tensor::scalar(c.input_type(0).dtype, double(c.input_count())), "count");
  c.set_output(0, c.emit1(OpKind::div, {}, {sum, count}));
}

void import_matmul(NodeContext& c) {
  c.set_output(0, c.emit1(OpKind::matmul, {}, {c.input(0), c.input(1)}));
}

void import_gemm(NodeContext& c) {
  GemmAttrs a;
  a.trans_a = c.attrs().get_int("transA", 0) != 0;
  a.trans_b = c.attrs().get_int("transB", 0) != 0;
  a.alpha = c.attrs().get_float("alpha", 1.0);
  a.beta = c.attrs().get_float("beta", 1.0);
  std::vector<ValueId> in{c.input(0), c.input(1)};
  if (c.has_input(2)) in.push_back(c.input(2));
  c.set_output(0, c.emit1(OpKind::gemm, a, in));
}

// ---- reductions ----
// ReduceSum takes its axes as an input from opset 13 on, the others from opset 18 (an
// attribute before). Empty axes reduce everything, unless noop_with_empty_axes, which
// makes the op the identity.
struct ReduceSpec {
  ReduceAttrs attrs;
  bool noop = false;  // empty axes with noop_with_empty_axes: the identity
};

ReduceSpec reduce_spec(NodeContext& c, bool axes_input) {
  ReduceSpec r;
  r.attrs.keepdims = c.attrs().get_int("keepdims", 1) != 0;
  if (axes_input) {
    if (c.has_input(1)) r.attrs.axes = c.const_ints(1, "axes");
  } else {
    c.check(c.input_count() == 1, "takes 1 input in opset ", c.opset(),
            " (axes is an attribute before opset 18), got ", c.input_count());
    r.attrs.axes = c.attrs().get_ints("axes");
  }
  const bool noop_if_empty = c.attrs().get_bool("noop_with_empty_axes", false);  // read always
  r.noop = r.attrs.axes.empty() && noop_if_empty;
  return r;
}

bool reduce_sum_axes_input(const NodeContext& c) {
  return c.opset() >= 13;
}

// Sets output 0 to reduce(op) of `x`, or x itself for a no-op reduction.
void reduce_into_output(NodeContext& c, OpKind op, ValueId x, const ReduceSpec& r) {
  c.set_output(0, r.noop ? x : c.emit1(op, r.attrs, {x}));
}

void import_reduce_sum(NodeContext& c) {
  reduce_into_output(c, OpKind::reduce_sum, c.input(0), reduce_spec(c, reduce_sum_axes_input(c)));
}
void import_reduce_mean(NodeContext& c) {
  reduce_into_output(c, OpKind::reduce_mean, c.input(0), reduce_spec(c, c.opset() >= 18));
}
void import_reduce_max(NodeContext& c) {
  reduce_into_output(c, OpKind::reduce_max, c.input(0), reduce_spec(c, c.opset() >= 18));
}

// ReduceMin = -max(-x).
void import_reduce_min(NodeContext& c) {
  ReduceSpec r = reduce_spec(c, c.opset() >= 18);
  if (r.noop) return c.set_output(0, c.input(0));
  ValueId neg = c.emit1(OpKind::neg, {}, {c.input(0)}, "neg");
  ValueId max = c.emit1(OpKind::reduce_max, r.attrs, {neg}, "max");
  c.set_output(0, c.emit1(OpKind::neg, {}, {max}));
}

// ReduceSumSquare = sum(x*x); ReduceL2 = sqrt(sum(x*x)); ReduceL1 = sum(|x|);
// ReduceLogSum = log(sum(x)).
void import_reduce_sum_square(NodeContext& c) {
  ReduceSpec r = reduce_spec(c, c.opset() >= 18);
  if (r.noop) return c.set_output(0, c.input(0));
  ValueId sq = c.emit1(OpKind::mul, {}, {c.input(0), c.input(0)}, "square");
  c.set_output(0, c.emit1(OpKind::reduce_sum, r.attrs, {sq}));
}
void import_reduce_l2(NodeContext& c) {
  ReduceSpec r = reduce_spec(c, c.opset() >= 18);
  if (r.noop) return c.set_output(0, c.input(0));
  ValueId sq = c.emit1(OpKind::mul, {}, {c.input(0), c.input(0)}, "square");
  ValueId sum = c.emit1(OpKind::reduce_sum, r.attrs, {sq}, "sum");
  c.set_output(0, c.emit1(OpKind::sqrt, {}, {sum}));
}
void import_reduce_l1(NodeContext& c) {
  ReduceSpec r = reduce_spec(c, c.opset() >= 18);
  if (r.noop) return c.set_output(0, c.input(0));
  ValueId abs = c.emit1(OpKind::abs, {}, {c.input(0)}, "abs");
  c.set_output(0, c.emit1(OpKind::reduce_sum, r.attrs, {abs}));
}
void import_reduce_log_sum(NodeContext& c) {
  ReduceSpec r = reduce_spec(c, c.opset() >= 18);
  if (r.noop) return c.set_output(0, c.input(0));
  ValueId sum = c.emit1(OpKind::reduce_sum, r.attrs, {c.input(0)}, "sum");
  c.set_output(0, c.emit1(OpKind::log, {}, {sum}));
}

// ReduceLogSumExp, computed stably: log(sum(exp(x - m))) + m with m = max(x).
void import_reduce_log_sum_exp(NodeContext& c) {
  ReduceSpec r = reduce_spec(c, c.opset() >= 18);
  if (r.noop) return c.set_output(0, c.input(0));
  ReduceAttrs keep = r.attrs;
  keep.keepdims = true;
  ValueId m_keep = c.emit1(OpKind::reduce_max, keep, {c.input(0)}, "max_keep");
  ValueId shifted = c.emit1(OpKind::sub, {}, {c.input(0), m_keep}, "shift");
  ValueId e = c.emit1(OpKind::exp, {}, {shifted}, "exp");
  ValueId sum = c.emit1(OpKind::reduce_sum, r.attrs, {e}, "sum");
  ValueId log = c.emit1(OpKind::log, {}, {sum}, "log");
  ValueId m = r.attrs.keepdims ? m_keep : c.emit1(OpKind::reduce_max, r.attrs, {c.input(0)}, "max");
  c.set_output(0, c.emit1(OpKind::add, {}, {log, m}));
}

// ---- arg_max / arg_min ----
// ArgMax / ArgMin: axis (default 0, negative from the end), keepdims (default 1),
// select_last_index (opset 12, default 0); an i64 output.
template <OpKind K>
void import_arg_reduce(NodeContext& c) {
  ArgReduceAttrs a;
  a.axis = c.attrs().get_int("axis", 0);
  a.keepdims = c.attrs().get_int("keepdims", 1) != 0;
  a.select_last_index = c.attrs().get_int("select_last_index", 0) != 0;
  c.set_output(0, c.emit1(K, a, {c.input(0)}));
}

// TopK: k as an attribute (opset 1) or a known one-element input K (opset 10); axis
// (default -1), largest and sorted (opset 11, default 1; unsorted results come sorted, one of
// the orders the spec allows). Outputs values and i64 indices.
void import_top_k(NodeContext& c) {
  TopKAttrs a;
  if (c.opset() < 10) {
    a.k = c.attrs().required_int("k");
  } else {
    c.check(c.input_count() >= 2 && c.has_input(1), "input 1 (K) is missing");
    const std::vector<int64_t> k = c.const_ints_any_rank(1, "K");
    c.check(k.size() == 1, "input 1 (K) must hold one value, got ", k.size());
    a.k = k[0];
  }
  c.check(a.k >= 0, "k must not be negative, got ", a.k);
  a.axis = c.attrs().get_int("axis", -1);
  a.largest = c.attrs().get_bool("largest", true);
  a.sorted = c.attrs().get_bool("sorted", true);
  const std::vector<ValueId> out = c.emit(OpKind::top_k, a, {c.input(0)});
  c.set_output(0, out[0]);
  if (c.output_count() > 1) c.set_output(1, out[1]);
}

// CumSum: axis (input 1, a known scalar, negative from the end), exclusive and reverse
// (default 0).
void import_cumsum(NodeContext& c) {
  const std::vector<int64_t> axis = c.const_ints_any_rank(1, "axis");
  c.check(axis.size() == 1, "input 1 (axis) must hold one value, got ", axis.size());
  const CumSumAttrs a{axis[0], c.attrs().get_int("exclusive", 0) != 0,
                      c.attrs().get_int("reverse", 0) != 0};
  c.set_output(0, c.emit1(OpKind::cumsum, a, {c.input(0)}));
}

// ---- softmax ----
// Opset 13+: along one axis (default -1). Before: the input is coerced to 2-D at
// `axis` (default 1) and normalised along the second dim: flatten, softmax over
// axis 1, reshape back. Over the last axis the two agree, so that case stays one node.
template <OpKind K>
void import_softmax(NodeContext& c) {
  const int64_t rank = c.input_rank(0);
  if (c.opset() >= 13) {
    SoftmaxAttrs a{c.attrs().get_int("axis", -1)};
    return c.set_output(0, c.emit1(K, a, {c.input(0)}));
  }
  const int64_t axis = c.attrs().get_int("axis", 1);
  int64_t norm = axis;
  if (!normalize_axis(axis, rank, &norm))
    c.attrs().fail("axis", cat("is ", axis, ", out of range for rank ", rank));
  if (norm == rank - 1) return c.set_output(0, c.emit1(K, SoftmaxAttrs{-1}, {c.input(0)}));
  ValueId flat = c.emit1(OpKind::flatten, FlattenAttrs{norm}, {c.input(0)}, "flatten");
  ValueId soft = c.emit1(K, SoftmaxAttrs{1}, {flat}, "softmax");
  c.set_output(0, c.emit1(OpKind::reshape, ReshapeAttrs{c.input_shape(0), true}, {soft}));
}

const OpSpec kOps[] = {
    {"Relu", 1, 1, 1, 1, import_unary<OpKind::relu>},
    {"Sigmoid", 1, 1, 1, 1, import_unary<OpKind::sigmoid>},
    {"Tanh", 1, 1, 1, 1, import_unary<OpKind::tanh>},
    {"Exp", 1, 1, 1, 1, import_unary<OpKind::exp>},
    {"Log", 1, 1, 1, 1, import_unary<OpKind::log>},
    {"Sqrt", 1, 1, 1, 1, import_unary<OpKind::sqrt>},
    {"Reciprocal", 1, 1, 1, 1, import_unary<OpKind::reciprocal>},
    {"Neg", 1, 1, 1, 1, import_unary<OpKind::neg>},
    {"Abs", 1, 1, 1, 1, import_unary<OpKind::abs>},
    {"Erf", 9, 1, 1, 1, import_unary<OpKind::erf>},
    {"Sin", 7, 1, 1, 1, import_unary<OpKind::sin>},
    {"Floor", 6, 1, 1, 1, import_unary<OpKind::floor>},
    {"Ceil", 6, 1, 1, 1, import_unary<OpKind::ceil>},
    {"Round", 11, 1, 1, 1, import_unary<OpKind::round>},
    {"Cos", 7, 1, 1, 1, import_unary<OpKind::cos>},
    {"Identity", 1, 1, 1, 1, import_unary<OpKind::identity>},
    {"LeakyRelu", 1, 1, 1, 1, import_leaky_relu},
    {"Gelu", 20, 1, 1, 1, import_gelu},
    {"HardSigmoid", 6, 1, 1, 1, import_hard_sigmoid},
    {"HardSwish", 14, 1, 1, 1, import_hard_swish},
    {"Softplus", 1, 1, 1, 1, import_softplus},
    {"Elu", 6, 1, 1, 1, import_elu},
    {"PRelu", 9, 2, 2, 1, import_prelu},
    {"Clip", 1, 1, 3, 1, import_clip},
    {"Add", 1, 2, 2, 1, import_binary<OpKind::add>},
    {"Sub", 1, 2, 2, 1, import_binary<OpKind::sub>},
    {"Mul", 1, 2, 2, 1, import_binary<OpKind::mul>},
    {"Div", 1, 2, 2, 1, import_binary<OpKind::div>},
    {"Pow", 1, 2, 2, 1, import_binary<OpKind::pow>},
    {"Max", 1, 1, kVariadic, 1, import_variadic<OpKind::max>},
    {"Min", 1, 1, kVariadic, 1, import_variadic<OpKind::min>},
    {"Sum", 1, 1, kVariadic, 1, import_variadic<OpKind::add>},
    {"Mean", 1, 1, kVariadic, 1, import_mean},
    {"MatMul", 1, 2, 2, 1, import_matmul},
    {"Gemm", 1, 2, 3, 1, import_gemm},
    {"ReduceSum", 1, 1, 2, 1, import_reduce_sum},
    {"ReduceMean", 1, 1, 2, 1, import_reduce_mean},
    {"ReduceMax", 1, 1, 2, 1, import_reduce_max},
    {"ReduceMin", 1, 1, 2, 1, import_reduce_min},
    {"ReduceSumSquare", 1, 1, 2, 1, import_reduce_sum_square},
    {"ReduceL1", 1, 1, 2, 1, import_reduce_l1},
    {"ReduceL2", 1, 1, 2, 1, import_reduce_l2},
    {"ReduceLogSum", 1, 1, 2, 1, import_reduce_log_sum},
    {"ReduceLogSumExp", 1, 1, 2, 1, import_reduce_log_sum_exp},
    {"ArgMax", 1, 1, 1, 1, import_arg_reduce<OpKind::arg_max>},
    {"ArgMin", 1, 1, 1, 1, import_arg_reduce<OpKind::arg_min>},
    {"CumSum", 11, 2, 2, 1, import_cumsum},
    {"TopK", 1, 1, 2, 2, import_top_k},
    {"Softmax", 1, 1, 1, 1, import_softmax<OpKind::softmax>},
    {"LogSoftmax", 1, 1, 1, 1, import_softmax<OpKind::log_softmax>},
};

}  // namespace

std::span<const OpSpec> math_ops() {
  return kOps;
}

}  // namespace fusebox::onnx_import
