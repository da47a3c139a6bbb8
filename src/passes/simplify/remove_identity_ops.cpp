// remove_identity_ops (passes/simplify.h): one walk over the nodes, copying each into the
// rebuilt graph unless it is an identity, whose output then maps to its input's value.
#include <algorithm>

#include "fusebox/ir/op_groups.h"
#include "fusebox/passes/simplify.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {

bool is_identity_op(const Graph& g, const Node& n) {
  if (n.inputs.empty() || n.inputs[0] == kNoValue || n.outputs.size() != 1) return false;
  const TensorType& in = g.value(n.inputs[0]).type;
  const TensorType& out = g.value(n.outputs[0]).type;
  if (in.dtype != out.dtype || in.shape != out.shape) return false;
  if (is_reshape_family(n.op)) return true;
  switch (n.op) {
    case OpKind::identity:
    case OpKind::expand:
    case OpKind::cast:
      return true;
    case OpKind::concat:
      return n.inputs.size() == 1;
    case OpKind::pad: {
      const auto& pads = std::get<PadAttrs>(n.attrs).pads;
      return std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; });
    }
    case OpKind::slice: {
      // The same extents in every dim: with steps of 1 that is every element in order (a
      // step of -1 would reverse them).
      const auto& steps = std::get<SliceAttrs>(n.attrs).steps;
      return std::all_of(steps.begin(), steps.end(), [](int64_t s) { return s == 1; });
    }
    case OpKind::transpose: {
      const auto& perm = std::get<TransposeAttrs>(n.attrs).perm;
      for (size_t i = 0; i < perm.size(); ++i)
        if (perm[i] != int64_t(i)) return false;
      return true;
    }
    default:
      return false;
  }
}

size_t remove_identity_ops(Graph& g, FusionLog* /*log*/) {
  std::vector<bool> graph_output(g.values().size(), false);
  for (ValueId v : g.outputs()) graph_output[size_t(v)] = true;
  std::vector<bool> remove(g.nodes().size(), false);
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (!is_identity_op(g, n) || graph_output[size_t(n.outputs[0])]) continue;
    remove[size_t(n.id)] = true;
    ++count;
  }
  if (count == 0) return 0;
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    if (remove[size_t(n.id)])
      rw.map(n.outputs[0], rw.mapped(n.inputs[0]));
    else
      rw.copy(n);
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
