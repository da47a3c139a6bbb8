// attention_output_from_layout_copy (passes/simplify.h): attention_backward reads the forward's
// output O through the inverse of the layout ops that copied it for the output projection, so
// that O itself dies in the forward.
//
// Why: a transformer's attention output O [B, H, T, d] is permuted (and reshaped) into the rows
// [B*T, H*d] the output projection reads, a copy the projection's weight gradient keeps for the
// backward; attention_backward kept O too: the same bytes twice, 12 x 18.5 MiB of ViT-B/16's
// training peak (batch 64, bf16). The inverse chain (reshape back, transpose by the inverse
// permutation) is an index map onto the rows, which the executable plans as a strided view
// (executable/layout_views.h): attention reads any strides with a contiguous last dim.
#include <vector>

#include "fusebox/passes/simplify.h"
#include "passes/fusion/fusion_rewrite.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

using fusion::Readers;

constexpr size_t kOutput = 4;  // attention_backward's input O (passes/autodiff/vjp_norm.cpp)

// The layout copy of O that attention_backward `back` can read instead: the chain of
// transposes and reshapes, each its predecessor's only reader (O's besides `back`), from O to
// the first value a node other than a layout op reads. Empty where there is none.
std::vector<NodeId> layout_chain(const Graph& g, const Readers& r, const Node& back) {
  const ValueId o = back.inputs[kOutput];
  const NodeId producer = g.value(o).producer;
  if (producer < 0 || g.node(producer).op != OpKind::attention || r.outputs.count(o)) return {};
  std::vector<NodeId> chain;
  ValueId at = o;
  for (;;) {
    std::vector<NodeId> others;
    for (NodeId reader : r.of[size_t(at)])
      if (at != o || reader != back.id) others.push_back(reader);
    if (others.size() != 1) break;
    const Node& n = g.node(others[0]);
    if (n.id > back.id || (n.op != OpKind::transpose && n.op != OpKind::reshape) ||
        n.outputs.size() != 1 || r.outputs.count(n.outputs[0]))
      break;
    chain.push_back(n.id);
    at = n.outputs[0];
  }
  return chain;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[size_t(perm[i])] = int64_t(i);
  return inv;
}

}  // namespace

size_t attention_output_from_layout_copy(Graph& g, FusionLog* /*log*/) {
  const Readers readers(g);
  std::vector<std::vector<NodeId>> chain_of(g.nodes().size());  // by attention_backward
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::attention_backward || n.inputs.size() <= kOutput) continue;
    std::vector<NodeId> chain = layout_chain(g, readers, n);
    if (chain.empty()) continue;
    chain_of[size_t(n.id)] = std::move(chain);
    ++count;
  }
  if (count == 0) return 0;
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    const std::vector<NodeId>& chain = chain_of[size_t(n.id)];
    if (chain.empty()) {
      rw.copy(n);
      continue;
    }
    // From the chain's last value back to O's shape, each op undone in reverse.
    ValueId v = rw.mapped(g.node(chain.back()).outputs[0]);
    const std::string base = g.value(n.inputs[kOutput]).name + "/from_layout_copy";
    for (size_t i = chain.size(); i-- > 0;) {
      const Node& step = g.node(chain[i]);
      const Shape& before = g.value(step.inputs[0]).type.shape;
      const std::string name = rw.fresh_name(base);
      if (step.op == OpKind::transpose) {
        const auto& perm = std::get<TransposeAttrs>(step.attrs).perm;
        v = rw.graph().add_node(OpKind::transpose, TransposeAttrs{inverse(perm)}, {v},
                                name + "/transpose", {name})[0];
      } else {
        v = rw.graph().add_node(OpKind::reshape, ReshapeAttrs{before, /*allow_zero=*/true}, {v},
                                name + "/reshape", {name})[0];
      }
    }
    std::vector<ValueId> inputs;
    for (ValueId in : n.inputs) inputs.push_back(rw.mapped(in));
    inputs[kOutput] = v;
    rw.emit(n, n.op, n.attrs, std::move(inputs), rw.output_names(n));
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
