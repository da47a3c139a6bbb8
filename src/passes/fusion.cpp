// The batch-norm fusions (passes/fusion.h): find what each batch norm takes over, then
// rebuild the graph (passes/fusion_rewrite.h, implemented here).
#include "fusebox/passes/fusion.h"

#include "fusion_rewrite.h"

#include <set>
#include <string>
#include <vector>

namespace fusebox {

namespace fusion {

void rebuild(Graph& g, const std::vector<Takeover>& takeover) {
  std::vector<NodeId> fused_at(g.nodes().size(), -1);  // replaced node -> its fused node
  std::vector<bool> moved(g.nodes().size(), false);    // emitted at its last replaced node
  for (size_t b = 0; b < takeover.size(); ++b) {
    if (takeover[b].replaced.empty()) continue;
    for (NodeId n : takeover[b].replaced) fused_at[size_t(n)] = NodeId(b);
    moved[b] = true;
  }
  Graph out(g.name());
  std::vector<ValueId> map(g.values().size(), kNoValue);
  for (ValueId v : g.inputs()) {
    const Value& value = g.value(v);
    map[size_t(v)] = out.add_input(value.name, value.type.dtype, value.type.shape);
  }
  // Constants on first use (in node order, then outputs): the unread ones go.
  auto mapped = [&](ValueId v) {
    if (v == kNoValue) return kNoValue;
    ValueId& m = map[size_t(v)];
    if (m == kNoValue && g.is_constant(v))
      m = out.add_constant(g.value(v).name, g.constants().at(v));
    return m;
  };
  auto copy = [&](const Node& n, const Takeover* t) {
    // The takeover's inputs replace the node's before any is mapped: a replaced constant
    // (the unfolded weight) is never added to the new graph.
    std::vector<ValueId> inputs = n.inputs;
    std::vector<std::string> names;
    for (ValueId v : n.outputs) names.push_back(g.value(v).name);
    Attrs attrs = n.attrs;
    if (t) {
      attrs = t->attrs;
      for (const auto& [slot, v] : t->inputs) {
        if (inputs.size() <= slot) inputs.resize(slot + 1, kNoValue);
        inputs[slot] = v;
      }
      names[0] = g.value(t->writes).name;
    }
    for (ValueId& v : inputs) v = mapped(v);
    const std::vector<ValueId> outs = out.add_node(t && t->op ? *t->op : n.op, std::move(attrs),
                                                   std::move(inputs), n.name, names);
    // A fused node may have outputs the node it replaces had not (attention's lse): those
    // are new values, read by nothing of g.
    for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i)
      map[size_t(n.outputs[i])] = outs[i];
    if (t && t->writes != n.outputs[0]) {
      map[size_t(t->writes)] = outs[0];
      map[size_t(n.outputs[0])] = kNoValue;  // read only by the replaced nodes, now gone
    }
  };
  for (const Node& n : g.nodes()) {
    const NodeId b = fused_at[size_t(n.id)];
    if (moved[size_t(n.id)] && b != n.id) continue;  // emitted at its last replaced node
    if (b < 0) {
      copy(n, nullptr);
    } else if (takeover[size_t(b)].replaced.back() == n.id) {
      copy(g.node(b), &takeover[size_t(b)]);
    }
  }
  for (ValueId v : g.outputs()) out.mark_output(mapped(v));
  g = std::move(out);
}

void rebuild_expanding(Graph& g, const Expansion& expand) {
  Graph out(g.name());
  std::vector<ValueId> map(g.values().size(), kNoValue);
  for (ValueId v : g.inputs()) {
    const Value& value = g.value(v);
    map[size_t(v)] = out.add_input(value.name, value.type.dtype, value.type.shape);
  }
  const std::function<ValueId(ValueId)> mapped = [&](ValueId v) {
    if (v == kNoValue) return kNoValue;
    ValueId& m = map[size_t(v)];
    if (m == kNoValue && g.is_constant(v))
      m = out.add_constant(g.value(v).name, g.constants().at(v));
    return m;
  };
  for (const Node& n : g.nodes()) {
    std::optional<std::vector<ValueId>> outs = expand(n, out, mapped);
    if (!outs) {
      std::vector<ValueId> inputs = n.inputs;
      std::vector<std::string> names;
      for (ValueId& v : inputs) v = mapped(v);
      for (ValueId v : n.outputs) names.push_back(g.value(v).name);
      outs = out.add_node(n.op, n.attrs, std::move(inputs), n.name, names);
    }
    for (size_t i = 0; i < outs->size() && i < n.outputs.size(); ++i)
      map[size_t(n.outputs[i])] = (*outs)[i];
  }
  for (ValueId v : g.outputs()) out.mark_output(mapped(v));
  g = std::move(out);
}

void Chain::take(const Node& n) {
  t.replaced.push_back(n.id);
  t.writes = n.outputs.at(0);
  ops.push_back(op_text(n));
}

std::string op_text(const Node& n) {
  return cat(op_name(n.op), " '", n.name, "'");
}

FusedActivation activation_of(const Node& n) {
  FusedActivation a;
  switch (n.op) {
    case OpKind::relu:
      a.kind = Activation::relu;
      break;
    case OpKind::gelu:
      a.kind = std::get<GeluAttrs>(n.attrs).tanh_approximation ? Activation::gelu_tanh
                                                               : Activation::gelu;
      break;
    case OpKind::silu:
      a.kind = Activation::silu;
      break;
    case OpKind::sigmoid:
      a.kind = Activation::sigmoid;
      break;
    case OpKind::tanh:
      a.kind = Activation::tanh;
      break;
    case OpKind::clip: {
      const auto& c = std::get<ClipAttrs>(n.attrs);
      a.kind = Activation::clip;
      a.min = c.min;
      a.max = c.max;
      break;
    }
    default:
      break;
  }
  return a;
}

}  // namespace fusion

namespace {

using fusion::op_text;
using fusion::Readers;
using fusion::Takeover;

// A batch norm that may take more over: no fused epilogue yet.
bool plain_batch_norm(const Node& n) {
  if (n.op != OpKind::batch_norm) return false;
  const auto& a = std::get<BatchNormAttrs>(n.attrs);
  return !a.relu && (n.inputs.size() < 6 || n.inputs[5] == kNoValue);
}

// Moving a batch norm later, to its last replaced node, is safe when no node before then
// reads its statistics outputs (y's one reader is replaced): before autodiff only graph
// outputs read them.
bool may_move(const Readers& r, const Node& bn, NodeId to) {
  for (size_t i = 1; i < bn.outputs.size(); ++i)
    for (NodeId reader : r.of[size_t(bn.outputs[i])])
      if (reader < to) return false;
  return true;
}

}  // namespace

size_t fuse_batch_norm_relu(Graph& g, FusionLog* log) {
  const Readers r(g);
  std::vector<Takeover> takeover(g.nodes().size());
  size_t count = 0;
  for (const Node& bn : g.nodes()) {
    if (!plain_batch_norm(bn)) continue;
    const NodeId relu = r.only_reader(bn.outputs.at(0));
    if (relu < 0 || g.node(relu).op != OpKind::relu) continue;
    if (!may_move(r, bn, relu)) continue;
    BatchNormAttrs attrs = std::get<BatchNormAttrs>(bn.attrs);
    attrs.relu = true;
    takeover[size_t(bn.id)] = {{relu}, g.node(relu).outputs.at(0), attrs, {}};
    if (log) log->add(bn.name, {op_text(bn), op_text(g.node(relu))});
    ++count;
  }
  if (count > 0) fusion::rebuild(g, takeover);
  return count;
}

size_t fuse_batch_norm_residual(Graph& g, FusionLog* log) {
  const Readers r(g);
  std::vector<Takeover> takeover(g.nodes().size());
  std::vector<bool> taken(g.nodes().size(), false);  // adds already taken by a batch norm
  size_t count = 0;
  for (const Node& bn : g.nodes()) {
    if (!plain_batch_norm(bn)) continue;
    const ValueId y = bn.outputs.at(0);
    const NodeId add = r.only_reader(y);
    if (add < 0 || taken[size_t(add)] || g.node(add).op != OpKind::add) continue;
    const Node& a = g.node(add);
    // The residual: the add's other operand, of y's type exactly (no broadcasting), and not
    // y itself (y + y).
    const ValueId other = a.inputs.at(0) == y ? a.inputs.at(1) : a.inputs.at(0);
    if (other == y || g.value(other).type.shape != g.value(y).type.shape ||
        g.value(other).type.dtype != g.value(y).type.dtype)
      continue;
    Takeover t{{add}, a.outputs.at(0), bn.attrs, {{5, other}}};
    if (const NodeId relu = r.only_reader(a.outputs.at(0));
        relu >= 0 && g.node(relu).op == OpKind::relu) {
      t.replaced.push_back(relu);
      t.writes = g.node(relu).outputs.at(0);
      std::get<BatchNormAttrs>(t.attrs).relu = true;
    }
    if (!may_move(r, bn, t.replaced.back())) continue;
    if (log) {
      std::vector<std::string> ops = {op_text(bn)};
      for (NodeId m : t.replaced) ops.push_back(op_text(g.node(m)));
      log->add(bn.name, ops);
    }
    taken[size_t(add)] = true;
    takeover[size_t(bn.id)] = std::move(t);
    ++count;
  }
  if (count > 0) fusion::rebuild(g, takeover);
  return count;
}

}  // namespace fusebox
