// fold_gradient_sums (passes/fusion.h): the add that sums two gradient contributions into a
// batch_norm_backward's dy becomes that node's dy and dy_addend (ir/ops.h):
//
//   s = add(a, b); batch_norm_backward(s, x, ...)   ->   batch_norm_backward(a, x, ..., b)
//
// where the node is the sum's only reader; or, for a node without a relu (which uses the sum as
// it is), where the sum's other readers come after the node: it then writes the sum as its
// dy_output, which they read instead (a residual batch norm's gradient at its block output,
// passed on to the residual). The node keeps its place (after the add, so a and b are there
// before it) and its outputs.
#include <algorithm>
#include <vector>

#include "fusebox/passes/fuse_pointwise.h"
#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
namespace {

constexpr size_t kAddendInput = 7;  // batch_norm_backward's dy_addend (ir/ops.h)

bool has_addend(const Node& n) {
  return n.inputs.size() > kAddendInput && n.inputs[kAddendInput] != kNoValue;
}

// How a batch_norm_backward's dy folds.
enum class Fold {
  none,
  only_reader,  // the sum is read by the node alone
  write_sum,    // the node writes the sum (dy_output) for the readers after it
};

// Whether the add a batch_norm_backward's dy comes from folds: an add of two values of dy's
// type (no broadcasting, no promotion), neither made by an elementwise op, not a graph output.
Fold fold_of(const Graph& g, const fusion::Readers& r, const Node& n) {
  if (n.op != OpKind::batch_norm_backward || has_addend(n)) return Fold::none;
  const ValueId dy = n.inputs[0];
  const NodeId p = g.value(dy).producer;
  if (p < 0 || g.node(p).op != OpKind::add || r.outputs.count(dy)) return Fold::none;
  const TensorType& type = g.value(dy).type;
  for (ValueId v : g.node(p).inputs) {
    if (g.value(v).type != type) return Fold::none;
    // A term an elementwise op makes: fuse_pointwise_chains computes the sum in that op's
    // kernel (silu's gradient: dy * s + dy * x * s * (1 - s), one kernel writing one tensor);
    // folded, both terms would be written and read.
    const NodeId term = g.value(v).producer;
    if (term >= 0 && is_pointwise_member(g, g.node(term))) return Fold::none;
  }
  const std::vector<NodeId>& readers = r.of[size_t(dy)];
  if (readers.size() == 1) return Fold::only_reader;
  const auto& attrs = std::get<BatchNormAttrs>(n.attrs);
  if (attrs.relu || attrs.dy_output) return Fold::none;  // its dy_used is not the sum
  const bool later = std::all_of(readers.begin(), readers.end(), [&](NodeId m) {
    return m > n.id || (m == n.id && std::count(n.inputs.begin(), n.inputs.end(), dy) == 1);
  });
  return later ? Fold::write_sum : Fold::none;
}

}  // namespace

size_t fold_gradient_sums(Graph& g, FusionLog* log) {
  const fusion::Readers r(g);
  std::vector<Fold> fold(g.nodes().size(), Fold::none);  // by batch_norm_backward
  std::vector<bool> folded(g.nodes().size(), false);     // an add taken into its reader
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    fold[size_t(n.id)] = fold_of(g, r, n);
    if (fold[size_t(n.id)] == Fold::none) continue;
    folded[size_t(g.value(n.inputs[0]).producer)] = true;
    ++count;
  }
  if (count == 0) return 0;

  fusion::rebuild_expanding(
      g, [&](const Node& n, GraphRewriter& rw) -> std::optional<std::vector<ValueId>> {
        if (folded[size_t(n.id)]) return std::vector<ValueId>{kNoValue};  // mapped at its reader
        const Fold how = fold[size_t(n.id)];
        if (how == Fold::none) return std::nullopt;
        const Node& add = g.node(g.value(n.inputs[0]).producer);
        std::vector<ValueId> inputs(kAddendInput + 1, kNoValue);
        for (size_t i = 1; i < n.inputs.size(); ++i) inputs[i] = rw.mapped(n.inputs[i]);
        inputs[0] = rw.mapped(add.inputs[0]);
        inputs[kAddendInput] = rw.mapped(add.inputs[1]);
        auto attrs = std::get<BatchNormAttrs>(n.attrs);
        std::vector<std::string> names = rw.output_names(n);
        if (how == Fold::write_sum) {
          attrs.dy_output = true;
          names.push_back(g.value(add.outputs[0]).name);
        }
        if (log) log->add(n.name, {fusion::op_text(add), fusion::op_text(n)});
        const std::vector<ValueId> outs =
            rw.emit(n, n.op, attrs, std::move(inputs), std::move(names));
        if (how == Fold::write_sum) rw.map(add.outputs[0], outs.at(3));
        return outs;
      });
  return count;
}

}  // namespace fusebox
