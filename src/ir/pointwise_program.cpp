// fused_pointwise's program: checks, value dtypes, text (ir/pointwise_program.h), and the
// node's inference.
#include "fusebox/ir/pointwise_program.h"

#include <cmath>

#include "fusebox/ir/op_groups.h"
#include "fusebox/ir/op_info.h"
#include "infer_common.h"

namespace fusebox {

bool is_pointwise_program_op(OpKind op) {
  const OpFamily family = op_info(op).family;
  return family == OpFamily::unary || family == OpFamily::binary || op == OpKind::cast ||
         op == OpKind::unary_backward;
}

bool is_program_derivative(OpKind op) {
  switch (op) {
    case OpKind::relu:
    case OpKind::leaky_relu:
    case OpKind::gelu:
    case OpKind::silu:
    case OpKind::sigmoid:
    case OpKind::tanh:
      return true;
    default:
      return false;
  }
}

bool is_pointwise_instr_node(const Node& n) {
  if (!is_pointwise_program_op(n.op)) return false;
  const auto* a = std::get_if<UnaryBackwardAttrs>(&n.attrs);
  return n.op != OpKind::unary_backward || (a && is_program_derivative(a->op));
}

int pointwise_arity(OpKind op) {
  return op_info(op).family == OpFamily::binary || op == OpKind::unary_backward ? 2 : 1;
}

std::string pointwise_operand_name(const PointwiseProgram& p, int32_t index) {
  return index < p.inputs ? cat("in", index) : cat("t", index - p.inputs);
}

std::vector<DType> check_pointwise_program(const PointwiseProgram& p, std::span<const DType> inputs,
                                           const std::string& where) {
  const auto k = int32_t(inputs.size());
  auto fail = [&](size_t i, const std::string& what) {
    throw Error(where, cat("program instruction t", i, " (", op_name(p.instrs[i].op), "): ", what));
  };
  FUSEBOX_CHECK(p.inputs == k, where, "the program reads ", p.inputs, " inputs but the node has ",
                k);
  FUSEBOX_CHECK(!p.instrs.empty(), where, "the program has no instructions");
  std::vector<DType> dtypes(inputs.begin(), inputs.end());
  for (int32_t i = 0; i < k; ++i) {
    FUSEBOX_CHECK(is_floating(inputs[size_t(i)]), where, "input ", i, " is ",
                  dtype_name(inputs[size_t(i)]), ": a program computes on float tensors only");
  }
  std::vector<bool> read(size_t(k) + p.instrs.size(), false);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const PointwiseInstr& ins = p.instrs[i];
    if (!is_pointwise_program_op(ins.op))
      fail(i, "not a unary or binary pointwise op, cast or unary_backward");
    if (ins.op == OpKind::unary_backward && !is_program_derivative(ins.of))
      fail(i, cat("the derivative of ", op_name(ins.of), " is not a program instruction"));
    const int arity = pointwise_arity(ins.op);
    if (int(ins.operands.size()) != arity)
      fail(i,
           cat("takes ", arity, " operand", arity == 1 ? "" : "s", ", got ", ins.operands.size()));
    for (int32_t a : ins.operands) {
      if (a < 0 || a >= k + int32_t(i))
        fail(i, cat("operand ", a, " is neither an input (0..", k - 1,
                    ") nor an earlier instruction"));
      read[size_t(a)] = true;
    }
    const DType first = dtypes[size_t(ins.operands[0])];
    DType result = first;
    if (ins.op == OpKind::cast) {
      if (!is_floating(ins.to))
        fail(i, cat("casts to ", dtype_name(ins.to), ", not a float dtype"));
      result = ins.to;
    } else if (arity == 2 && ins.op != OpKind::pow && dtypes[size_t(ins.operands[1])] != first) {
      fail(i, cat("operands ", pointwise_operand_name(p, ins.operands[0]), " (", dtype_name(first),
                  ") and ", pointwise_operand_name(p, ins.operands[1]), " (",
                  dtype_name(dtypes[size_t(ins.operands[1])]), ") have different dtypes"));
    }
    const OpKind formula = ins.op == OpKind::unary_backward ? ins.of : ins.op;
    if (formula == OpKind::leaky_relu && !std::isfinite(ins.alpha))
      fail(i, cat("alpha ", ins.alpha, " must be finite"));
    if (ins.op == OpKind::clip && (std::isnan(ins.min) || std::isnan(ins.max) || ins.min > ins.max))
      fail(i, cat("clip bounds [", ins.min, ", ", ins.max, "] must be ordered and not NaN"));
    dtypes.push_back(result);
  }
  for (size_t v = 0; v + 1 < read.size(); ++v) {
    FUSEBOX_CHECK(read[v], where, "the program never reads ", pointwise_operand_name(p, int32_t(v)),
                  v < size_t(k) ? " (an input)" : " (only the last instruction's value is y)");
  }
  return dtypes;
}

PointwiseInstr pointwise_instr(const Node& n, std::vector<int32_t> operands) {
  PointwiseInstr ins;
  ins.op = n.op;
  ins.operands = std::move(operands);
  if (const auto* a = std::get_if<LeakyReluAttrs>(&n.attrs)) ins.alpha = a->alpha;
  if (const auto* a = std::get_if<GeluAttrs>(&n.attrs))
    ins.tanh_approximation = a->tanh_approximation;
  if (const auto* a = std::get_if<ClipAttrs>(&n.attrs)) {
    ins.min = a->min;
    ins.max = a->max;
  }
  if (const auto* a = std::get_if<CastAttrs>(&n.attrs)) ins.to = a->to;
  if (const auto* a = std::get_if<UnaryBackwardAttrs>(&n.attrs)) {
    ins.of = a->op;
    ins.alpha = a->alpha;
    ins.tanh_approximation = a->tanh_approximation;
    ins.min = a->min;
    ins.max = a->max;
  }
  return ins;
}

Attrs pointwise_instr_attrs(const PointwiseInstr& ins) {
  switch (ins.op) {
    case OpKind::leaky_relu:
      return LeakyReluAttrs{ins.alpha};
    case OpKind::gelu:
      return GeluAttrs{ins.tanh_approximation};
    case OpKind::clip:
      return ClipAttrs{ins.min, ins.max};
    case OpKind::cast:
      return CastAttrs{ins.to};
    case OpKind::unary_backward:
      return UnaryBackwardAttrs{ins.of, ins.alpha, ins.tanh_approximation, ins.min, ins.max};
    default:
      return std::monostate{};
  }
}

std::string pointwise_program_text(const PointwiseProgram& p) {
  std::string out;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const PointwiseInstr& ins = p.instrs[i];
    out += cat(i ? "; " : "", "t", i, "=", op_name(ins.op), "(");
    for (size_t o = 0; o < ins.operands.size(); ++o)
      out += cat(o ? "," : "", pointwise_operand_name(p, ins.operands[o]));
    const OpKind formula = ins.op == OpKind::unary_backward ? ins.of : ins.op;
    if (ins.op == OpKind::unary_backward) out += cat(",of=", op_name(ins.of));
    if (formula == OpKind::leaky_relu) out += cat(",alpha=", ins.alpha);
    if (formula == OpKind::gelu && ins.tanh_approximation) out += ",approximate=tanh";
    if (formula == OpKind::clip) out += cat(",min=", ins.min, ",max=", ins.max);
    if (ins.op == OpKind::cast) out += cat(",to=", dtype_name(ins.to));
    out += ")";
  }
  return out;
}

namespace infer {

// fused_pointwise: the program checked against the inputs' dtypes; y has the last
// instruction's dtype and the broadcast of every input's shape (ir/ops.h).
Types infer_fused_pointwise(Context& c) {
  const PointwiseProgram& p = c.attrs<PointwiseProgram>();
  std::vector<DType> dtypes;
  for (int i = 0; i < c.count(); ++i) {
    c.expect_float(i);
    dtypes.push_back(c.dtype(i));
  }
  const std::vector<DType> values = check_pointwise_program(p, dtypes, node_label(c.node()));
  Shape shape = c.shape(0);
  for (int i = 1; i < c.count(); ++i) {
    Shape next;
    FUSEBOX_INFER_CHECK(c, broadcast_shapes(shape, c.shape(i), &next), c.shaped(i),
                        " does not broadcast with the other inputs (so far ", shape_str(shape),
                        ")");
    shape = std::move(next);
  }
  return {{values.back(), shape}};
}

}  // namespace infer

}  // namespace fusebox
