// fold_gemm_transposes (passes/simplify.h): one walk; a gemm operand made by a 2-D transpose that
// only the gemm reads becomes the transpose's input with the gemm's flag flipped.
#include <vector>

#include "fusebox/passes/simplify.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

// The transpose node making operand `v` of a gemm when it swaps a 2-D value and the gemm alone
// reads it (and it is not a graph output); -1 otherwise.
NodeId folded_transpose(const Graph& g, ValueId v, const std::vector<int>& readers,
                        const std::vector<bool>& output) {
  const NodeId p = g.value(v).producer;
  if (p < 0 || readers[size_t(v)] != 1 || output[size_t(v)]) return -1;
  const Node& t = g.node(p);
  if (t.op != OpKind::transpose) return -1;
  const auto& perm = std::get<TransposeAttrs>(t.attrs).perm;
  return perm == std::vector<int64_t>{1, 0} ? p : -1;
}

}  // namespace

size_t fold_gemm_transposes(Graph& g, FusionLog* /*log*/) {
  std::vector<int> readers(g.values().size(), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs)
      if (v != kNoValue) ++readers[size_t(v)];
  std::vector<bool> output(g.values().size(), false);
  for (ValueId v : g.outputs()) output[size_t(v)] = true;
  std::vector<bool> folded(g.nodes().size(), false);
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::gemm) continue;
    for (size_t i = 0; i < 2 && i < n.inputs.size(); ++i) {
      const NodeId t = folded_transpose(g, n.inputs[i], readers, output);
      if (t >= 0) folded[size_t(t)] = true, ++count;
    }
  }
  if (count == 0) return 0;
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    if (folded[size_t(n.id)]) continue;  // its reader reads its input
    if (n.op != OpKind::gemm) {
      rw.copy(n);
      continue;
    }
    GemmAttrs attrs = std::get<GemmAttrs>(n.attrs);
    std::vector<ValueId> inputs;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      const NodeId p = v == kNoValue ? -1 : g.value(v).producer;
      if (i < 2 && p >= 0 && folded[size_t(p)]) {
        inputs.push_back(rw.mapped(g.node(p).inputs[0]));
        bool& flag = i == 0 ? attrs.trans_a : attrs.trans_b;
        flag = !flag;
      } else {
        inputs.push_back(rw.mapped(v));
      }
    }
    rw.emit(n, n.op, attrs, inputs, rw.output_names(n));
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
