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
  // Constants on first use (in node order, then outputs): the unread ones go.
  GraphRewriter r(g);
  auto fused = [&](const Node& n, const Takeover& t) {
    // The takeover's inputs replace the node's before any is mapped: a replaced constant
    // (the unfolded weight) is never added to the new graph.
    std::vector<ValueId> inputs = n.inputs;
    for (const auto& [slot, v] : t.inputs) {
      if (inputs.size() <= slot) inputs.resize(slot + 1, kNoValue);
      inputs[slot] = v;
    }
    for (ValueId& v : inputs) v = r.mapped(v);
    std::vector<std::string> names = r.output_names(n);
    names[0] = g.value(t.writes).name;
    // A fused node may have outputs the node it replaces had not (attention's lse): those
    // are new values, read by nothing of g.
    const std::vector<ValueId> outs =
        r.emit(n, t.op ? *t.op : n.op, t.attrs, std::move(inputs), names);
    if (t.writes != n.outputs[0]) {
      r.map(t.writes, outs[0]);
      r.map(n.outputs[0], kNoValue);  // read only by the replaced nodes, now gone
    }
  };
  for (const Node& n : g.nodes()) {
    const NodeId b = fused_at[size_t(n.id)];
    if (moved[size_t(n.id)] && b != n.id) continue;  // emitted at its last replaced node
    if (b < 0) {
      r.copy(n);
    } else if (takeover[size_t(b)].replaced.back() == n.id) {
      fused(g.node(b), takeover[size_t(b)]);
    }
  }
  g = r.finish();
}

void rebuild_expanding(Graph& g, const Expansion& expand) {
  GraphRewriter r(g);
  for (const Node& n : g.nodes()) {
    const std::optional<std::vector<ValueId>> outs = expand(n, r);
    if (!outs) {
      r.copy(n);
      continue;
    }
    for (size_t i = 0; i < outs->size() && i < n.outputs.size(); ++i)
      r.map(n.outputs[i], (*outs)[i]);
  }
  g = r.finish();
}

void Chain::take(const Node& n) {
  t.replaced.push_back(n.id);
  t.writes = n.outputs.at(0);
  ops.push_back(op_text(n));
}

std::string op_text(const Node& n) {
  return cat(op_name(n.op), " '", n.name, "'");
}

const Tensor* known_tensor(const Graph& g, ValueId v) {
  if (g.is_constant(v)) return &g.constants().at(v);
  if (const NodeId p = g.value(v).producer; p >= 0 && g.node(p).op == OpKind::constant)
    return &std::get<ConstantAttrs>(g.node(p).attrs).value;
  return nullptr;
}

}  // namespace fusion

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

}  // namespace fusebox
