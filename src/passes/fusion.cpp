// The batch-norm fusions (passes/fusion.h): find what each batch norm takes over, then
// rebuild the graph node by node (Graph only appends), each fused batch norm emitted where
// the last node it replaces was, with that node's output value (and name).
#include "fusebox/passes/fusion.h"

#include <set>
#include <string>
#include <vector>

namespace fusebox {
namespace {

// What one batch norm takes over: the nodes that go (an add, a relu), the residual it
// then reads, and the value it writes instead of its y (the last node's output).
struct Takeover {
  std::vector<NodeId> replaced;  // in node order; the last is where the fused node goes
  ValueId residual = kNoValue;
  ValueId writes = kNoValue;
  bool relu = false;
};

struct Readers {
  std::vector<std::vector<NodeId>> of;  // by value
  std::set<ValueId> outputs;

  explicit Readers(const Graph& g)
      : of(g.values().size()), outputs(g.outputs().begin(), g.outputs().end()) {
    for (const Node& n : g.nodes())
      for (ValueId v : n.inputs)
        if (v != kNoValue) of[size_t(v)].push_back(n.id);
  }
  // The one node reading v, when v is read by exactly one node and is not a graph output.
  NodeId only_reader(ValueId v) const {
    return of[size_t(v)].size() == 1 && !outputs.count(v) ? of[size_t(v)][0] : NodeId(-1);
  }
};

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

// Rebuilds g with the takeovers (by batch norm node id; empty replaced: none).
void rebuild(Graph& g, const std::vector<Takeover>& takeover) {
  std::vector<NodeId> fused_at(g.nodes().size(), -1);  // replaced node -> its batch norm
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
  for (const auto& [v, t] : g.constants()) map[size_t(v)] = out.add_constant(g.value(v).name, t);
  auto copy = [&](const Node& n, const Takeover* t) {
    std::vector<ValueId> inputs;
    for (ValueId v : n.inputs) inputs.push_back(v == kNoValue ? kNoValue : map[size_t(v)]);
    std::vector<std::string> names;
    for (ValueId v : n.outputs) names.push_back(g.value(v).name);
    Attrs attrs = n.attrs;
    if (t) {
      auto& a = std::get<BatchNormAttrs>(attrs);
      a.relu = t->relu;
      if (t->residual != kNoValue) {
        inputs.resize(6, kNoValue);
        inputs[5] = map[size_t(t->residual)];
      }
      names[0] = g.value(t->writes).name;
    }
    const std::vector<ValueId> outs =
        out.add_node(n.op, std::move(attrs), std::move(inputs), n.name, names);
    for (size_t i = 0; i < outs.size(); ++i) map[size_t(n.outputs[i])] = outs[i];
    if (t) {
      map[size_t(t->writes)] = outs[0];
      map[size_t(n.outputs[0])] = kNoValue;  // read only by the replaced nodes, now gone
    }
  };
  for (const Node& n : g.nodes()) {
    if (moved[size_t(n.id)]) continue;  // emitted at its last replaced node
    const NodeId b = fused_at[size_t(n.id)];
    if (b < 0) {
      copy(n, nullptr);
    } else if (takeover[size_t(b)].replaced.back() == n.id) {
      copy(g.node(b), &takeover[size_t(b)]);
    }
  }
  for (ValueId v : g.outputs()) out.mark_output(map[size_t(v)]);
  g = std::move(out);
}

}  // namespace

size_t fuse_batch_norm_relu(Graph& g) {
  const Readers r(g);
  std::vector<Takeover> takeover(g.nodes().size());
  size_t count = 0;
  for (const Node& bn : g.nodes()) {
    if (!plain_batch_norm(bn)) continue;
    const NodeId relu = r.only_reader(bn.outputs.at(0));
    if (relu < 0 || g.node(relu).op != OpKind::relu) continue;
    if (!may_move(r, bn, relu)) continue;
    takeover[size_t(bn.id)] = {{relu}, kNoValue, g.node(relu).outputs.at(0), true};
    ++count;
  }
  if (count > 0) rebuild(g, takeover);
  return count;
}

size_t fuse_batch_norm_residual(Graph& g) {
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
    Takeover t{{add}, other, a.outputs.at(0), false};
    if (const NodeId relu = r.only_reader(a.outputs.at(0));
        relu >= 0 && g.node(relu).op == OpKind::relu) {
      t.replaced.push_back(relu);
      t.writes = g.node(relu).outputs.at(0);
      t.relu = true;
    }
    if (!may_move(r, bn, t.replaced.back())) continue;
    taken[size_t(add)] = true;
    takeover[size_t(bn.id)] = std::move(t);
    ++count;
  }
  if (count > 0) rebuild(g, takeover);
  return count;
}

}  // namespace fusebox
