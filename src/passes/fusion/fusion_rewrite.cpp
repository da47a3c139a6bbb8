// The shared rewrite of the fusion passes (fusion_rewrite.h): rebuilding a graph with the
// takeovers or expansions the passes found, and the op texts the FusionLog records.
#include "fusion_rewrite.h"

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

}  // namespace fusebox
