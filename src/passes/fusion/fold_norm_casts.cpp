// fold_norm_casts (passes/fusion.h): the casts around an f32 layer_norm / rms_norm taken into
// the norm's mixed form (ir/ops.h NormAttrs), in one rebuild of the graph.
#include <set>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
namespace {

using fusion::op_text;
using fusion::Readers;

// What one norm takes.
struct Fold {
  NodeId input_cast = -1;            // the widening cast x comes from (its input is read instead)
  bool input_cast_goes = false;      // the norm was its only reader: the cast goes too
  std::vector<NodeId> output_casts;  // the narrowing casts of y, all to one dtype, which go
  std::optional<DType> y_dtype;
};

// An f32 norm in its plain form: f32 x and y, scale and bias f32 or absent.
bool plain_f32_norm(const Graph& g, const Node& n) {
  if (n.op != OpKind::layer_norm && n.op != OpKind::rms_norm) return false;
  if (std::get<NormAttrs>(n.attrs).y_dtype) return false;
  for (ValueId v : n.inputs)
    if (v != kNoValue && g.value(v).type.dtype != DType::f32) return false;
  return g.value(n.outputs[0]).type.dtype == DType::f32;
}

Fold fold_of(const Graph& g, const Readers& r, const Node& n) {
  Fold f;
  const ValueId x = n.inputs[0];
  const NodeId p = g.value(x).producer;
  // A widening cast is exact: the norm reads its input and widens it in registers.
  if (p >= 0 && g.node(p).op == OpKind::cast &&
      is_low_float(g.value(g.node(p).inputs[0]).type.dtype)) {
    f.input_cast = p;
    f.input_cast_goes = r.only_reader(x) == n.id;
  }
  // y rounded by casts to one low dtype, and read by nothing else: the norm writes that dtype
  // (the same f32 value rounded once, as the cast rounds it).
  const ValueId y = n.outputs[0];
  const std::vector<NodeId>& readers = r.of[size_t(y)];
  if (readers.empty() || r.outputs.count(y)) return f;
  std::optional<DType> to;
  for (NodeId m : readers) {
    const Node& c = g.node(m);
    if (c.op != OpKind::cast || r.outputs.count(c.outputs[0])) return f;
    const DType d = g.value(c.outputs[0]).type.dtype;
    if (!is_low_float(d) || (to && *to != d)) return f;
    to = d;
  }
  // One low dtype per norm: x of f16 and y of bf16 (or the reverse) has no kernel.
  if (f.input_cast >= 0 && g.value(g.node(f.input_cast).inputs[0]).type.dtype != *to) return f;
  f.output_casts = readers;
  f.y_dtype = to;
  return f;
}

}  // namespace

size_t fold_norm_casts(Graph& g, FusionLog* log) {
  const Readers r(g);
  std::vector<Fold> folds(g.nodes().size());
  std::vector<bool> folded(g.nodes().size(), false);
  std::vector<NodeId> dropped_cast_of(g.nodes().size(), -1);  // cast -> its norm
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (!plain_f32_norm(g, n)) continue;
    Fold f = fold_of(g, r, n);
    if (f.input_cast < 0 && !f.y_dtype) continue;
    if (f.input_cast_goes) dropped_cast_of[size_t(f.input_cast)] = n.id;
    for (NodeId c : f.output_casts) dropped_cast_of[size_t(c)] = n.id;
    folded[size_t(n.id)] = true;
    folds[size_t(n.id)] = std::move(f);
    ++count;
  }
  if (count == 0) return 0;

  GraphRewriter rw(g);
  for (const Node& m : g.nodes()) {
    const NodeId norm = dropped_cast_of[size_t(m.id)];
    if (norm >= 0) {
      // An output cast reads the norm's y, emitted before it: its readers read that y now.
      // An input cast is read by nothing left (its norm reads the cast's input).
      if (m.inputs[0] == g.node(norm).outputs[0])
        rw.map(m.outputs[0], rw.mapped(g.node(norm).outputs[0]));
      continue;
    }
    if (!folded[size_t(m.id)]) {
      rw.copy(m);
      continue;
    }
    const Fold& f = folds[size_t(m.id)];
    // x: the widening cast's input where one folds (the cast itself may be gone).
    std::vector<ValueId> inputs;
    std::vector<std::string> ops;
    for (size_t i = 0; i < m.inputs.size(); ++i)
      inputs.push_back(i == 0 && f.input_cast >= 0 ? rw.mapped(g.node(f.input_cast).inputs[0])
                                                   : rw.mapped(m.inputs[i]));
    if (f.input_cast >= 0) ops.push_back(op_text(g.node(f.input_cast)));
    ops.push_back(op_text(m));
    for (NodeId c : f.output_casts) ops.push_back(op_text(g.node(c)));
    NormAttrs attrs = std::get<NormAttrs>(m.attrs);
    // Set even where y stays f32: without it y would take x's (now narrower) dtype.
    attrs.y_dtype = f.y_dtype.value_or(DType::f32);
    rw.emit(m, m.op, attrs, std::move(inputs), rw.output_names(m));
    if (log) log->add(m.name, ops);
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
