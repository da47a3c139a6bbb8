// hoist_narrowing_casts (passes/simplify.h): rounds of one rebuild each, every round moving
// each narrowing cast above the one data-movement op it reads, until none moves.
#include <vector>

#include "fusebox/ir/op_groups.h"
#include "fusebox/passes/simplify.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

// An op that only moves or repeats its one input's elements: casting before it gives the
// same values (each output element is some input element, cast alike).
bool moves_elements(const Node& n) {
  if (n.inputs.size() != 1 || n.outputs.size() != 1) return false;
  return is_reshape_family(n.op) || n.op == OpKind::transpose || n.op == OpKind::slice ||
         n.op == OpKind::expand;
}

bool narrowing(DType from, DType to) {
  return is_floating(from) && is_floating(to) && dtype_size(to) < dtype_size(from);
}

// One round: the casts to move (by the mover's id: the cast reading its only output).
size_t hoist_round(Graph& g) {
  std::vector<int> readers(g.values().size(), 0);
  std::vector<bool> output(g.values().size(), false);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs)
      if (v != kNoValue) ++readers[size_t(v)];
  for (ValueId v : g.outputs()) output[size_t(v)] = true;
  std::vector<NodeId> cast_of(g.nodes().size(), -1);  // mover -> the cast taking its place
  std::vector<bool> moved(g.nodes().size(), false);   // casts that move
  size_t count = 0;
  for (const Node& c : g.nodes()) {
    if (c.op != OpKind::cast) continue;
    const ValueId v = c.inputs[0];
    const NodeId p = g.value(v).producer;
    if (p < 0 || !moves_elements(g.node(p)) || readers[size_t(v)] != 1 || output[size_t(v)])
      continue;
    if (!narrowing(g.value(v).type.dtype, g.value(c.outputs[0]).type.dtype)) continue;
    cast_of[size_t(p)] = c.id;
    moved[size_t(c.id)] = true;
    ++count;
  }
  if (count == 0) return 0;
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    if (moved[size_t(n.id)]) continue;  // emitted in its mover's place
    const NodeId c = cast_of[size_t(n.id)];
    if (c < 0) {
      rw.copy(n);
      continue;
    }
    // cast(mover(x)) -> mover(cast(x)): the cast keeps its name, its value is x's name with
    // the dtype; the mover's output takes the cast's value name (what its readers read).
    const Node& cast = g.node(c);
    const ValueId x = rw.mapped(n.inputs[0]);
    const DType to = g.value(cast.outputs[0]).type.dtype;
    const std::string narrow_name =
        rw.fresh_name(cat(rw.graph().value(x).name, ":", dtype_name(to)));
    const ValueId narrow =
        rw.graph().add_node(OpKind::cast, cast.attrs, {x}, cast.name, {narrow_name})[0];
    const ValueId y =
        rw.graph().add_node(n.op, n.attrs, {narrow}, n.name, {g.value(cast.outputs[0]).name})[0];
    rw.map(n.outputs[0], kNoValue);  // read by the cast alone
    rw.map(cast.outputs[0], y);
  }
  g = rw.finish();
  return count;
}

}  // namespace

size_t hoist_narrowing_casts(Graph& g, FusionLog* /*log*/) {
  size_t total = 0;
  // Each round moves a cast one op up; a chain of k movers takes k rounds. Bounded by the
  // node count: a cast cannot move above more ops than there are.
  for (size_t round = 0; round <= g.nodes().size(); ++round) {
    const size_t moved = hoist_round(g);
    if (moved == 0) break;
    total += moved;
  }
  return total;
}

}  // namespace fusebox
