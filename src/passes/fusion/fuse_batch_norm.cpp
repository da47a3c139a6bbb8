// The batch-norm fusions (passes/fusion.h): find what each batch norm takes over, then
// rebuild the graph (fusion_rewrite.h).
#include <string>
#include <vector>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
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
