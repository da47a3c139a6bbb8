// fold_gradient_sums (passes/fusion.h): the add that sums two gradient contributions, read
// only by a batch_norm_backward as its dy, becomes that node's dy and dy_addend (ir/ops.h):
//
//   s = add(a, b); batch_norm_backward(s, x, ...)   ->   batch_norm_backward(a, x, ..., b)
//
// The node keeps its place (after the add, so a and b are there before it) and its outputs.
#include <vector>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
namespace {

constexpr size_t kAddendInput = 7;  // batch_norm_backward's dy_addend (ir/ops.h)

bool has_addend(const Node& n) {
  return n.inputs.size() > kAddendInput && n.inputs[kAddendInput] != kNoValue;
}

// The add a batch_norm_backward's dy comes from, when it folds: an add of two values of dy's
// type (no broadcasting, no promotion), read by nothing else.
const Node* foldable_sum(const Graph& g, const fusion::Readers& r, const Node& n) {
  if (n.op != OpKind::batch_norm_backward || has_addend(n)) return nullptr;
  const ValueId dy = n.inputs[0];
  const NodeId p = g.value(dy).producer;
  if (p < 0 || r.only_reader(dy) != n.id) return nullptr;
  const Node& add = g.node(p);
  if (add.op != OpKind::add) return nullptr;
  const TensorType& type = g.value(dy).type;
  for (ValueId v : add.inputs)
    if (g.value(v).type != type) return nullptr;
  return &add;
}

}  // namespace

size_t fold_gradient_sums(Graph& g, FusionLog* log) {
  const fusion::Readers r(g);
  std::vector<NodeId> sum_of(g.nodes().size(), -1);   // batch_norm_backward -> its add
  std::vector<bool> folded(g.nodes().size(), false);  // an add taken into its reader
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    const Node* add = foldable_sum(g, r, n);
    if (!add) continue;
    sum_of[size_t(n.id)] = add->id;
    folded[size_t(add->id)] = true;
    ++count;
  }
  if (count == 0) return 0;

  fusion::rebuild_expanding(
      g, [&](const Node& n, GraphRewriter& rw) -> std::optional<std::vector<ValueId>> {
        if (folded[size_t(n.id)]) return std::vector<ValueId>{kNoValue};  // read by n alone
        const NodeId sum = sum_of[size_t(n.id)];
        if (sum < 0) return std::nullopt;
        const Node& add = g.node(sum);
        std::vector<ValueId> inputs(kAddendInput + 1, kNoValue);
        for (size_t i = 1; i < n.inputs.size(); ++i) inputs[i] = rw.mapped(n.inputs[i]);
        inputs[0] = rw.mapped(add.inputs[0]);
        inputs[kAddendInput] = rw.mapped(add.inputs[1]);
        if (log) log->add(n.name, {fusion::op_text(add), fusion::op_text(n)});
        return rw.emit(n, n.op, n.attrs, std::move(inputs), rw.output_names(n));
      });
  return count;
}

}  // namespace fusebox
