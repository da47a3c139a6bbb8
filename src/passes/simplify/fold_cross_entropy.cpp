// fold_cross_entropy (passes/simplify.h): for each cross_entropy whose log_prob nothing reads,
// walk up its logits through the ops it can read through (a widening cast, the transpose that
// moved the class axis from last to 1, reshapes that keep rows, a leading column slice), then
// emit the lse_stash form reading what the walk reached; the walked nodes only the walk read
// are dropped.
#include <string>
#include <vector>

#include "fusebox/passes/simplify.h"
#include "passes/fusion/fusion_rewrite.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

using fusion::Readers;

// What the walk found for one cross_entropy.
struct Fold {
  ValueId logits = kNoValue;  // the value the new node reads (before `rows`)
  bool rows = false;          // read as [M, C]: logits and labels flattened to rows
  std::optional<int64_t> classes;
  std::vector<NodeId> walked;  // from the cross_entropy up
};

// The permutation [0, r-1, 1, ..., r-2]: the last axis moved to 1 (a decoder's [N, T, V] logits
// as SoftmaxCrossEntropyLoss's [N, V, T]).
bool moves_last_to_one(const std::vector<int64_t>& perm) {
  const int64_t r = int64_t(perm.size());
  if (r < 3 || perm[0] != 0 || perm[1] != r - 1) return false;
  for (int64_t i = 2; i < r; ++i)
    if (perm[size_t(i)] != i - 1) return false;
  return true;
}

// A slice of the first `classes` of the last axis of a value whose last dim is larger.
std::optional<int64_t> leading_columns(const Graph& g, const Node& s) {
  const auto& a = std::get<SliceAttrs>(s.attrs);
  const Shape& in = g.value(s.inputs[0]).type.shape;
  const int64_t rank = int64_t(in.size());
  if (a.axes.size() != 1 || rank < 2 || (a.axes[0] != rank - 1 && a.axes[0] != -1)) return {};
  if (a.starts[0] != 0 || (!a.steps.empty() && a.steps[0] != 1)) return {};
  const int64_t kept = g.value(s.outputs[0]).type.shape.back();
  if (kept >= in.back()) return {};
  return kept;
}

Fold walk(const Graph& g, const Node& ce) {
  Fold f;
  ValueId v = ce.inputs[0];
  const int64_t rank = int64_t(g.value(v).type.shape.size());
  f.rows = rank == 2;  // the class axis is the last already
  bool cast = false, transpose = false;
  for (;;) {
    const NodeId p = g.value(v).producer;
    if (p < 0) break;
    const Node& n = g.node(p);
    const TensorType& in = g.value(n.inputs[0]).type;
    if (n.op == OpKind::cast && !cast && is_low_float(in.dtype) &&
        g.value(v).type.dtype == DType::f32) {
      cast = true;
    } else if (n.op == OpKind::transpose && !transpose && !f.rows &&
               moves_last_to_one(std::get<TransposeAttrs>(n.attrs).perm)) {
      transpose = f.rows = true;
    } else if (n.op == OpKind::reshape && f.rows && !f.classes && !in.shape.empty() &&
               in.shape.back() == g.value(v).type.shape.back()) {
      // Rows stay rows: both shapes end in the class axis.
    } else if (n.op == OpKind::slice && f.rows && !f.classes) {
      f.classes = leading_columns(g, n);
      if (!f.classes) break;
    } else {
      break;
    }
    f.walked.push_back(p);
    v = n.inputs[0];
  }
  f.logits = v;
  return f;
}

}  // namespace

size_t fold_cross_entropy(Graph& g, FusionLog* /*log*/) {
  const Readers readers(g);
  std::vector<Fold> folds(g.nodes().size());
  std::vector<bool> dropped(g.nodes().size(), false);
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::cross_entropy || std::get<CrossEntropyAttrs>(n.attrs).lse_stash) continue;
    if (n.outputs.size() > 1 &&
        (!readers.of[size_t(n.outputs[1])].empty() || readers.outputs.count(n.outputs[1])))
      continue;  // log_prob is read
    Fold f = walk(g, n);
    // The walked nodes that only the walk reads go (from the cross_entropy up, while each is
    // read by the one below it alone).
    NodeId below = n.id;
    for (NodeId p : f.walked) {
      if (readers.only_reader(g.node(p).outputs[0]) != below) break;
      dropped[size_t(p)] = true;
      below = p;
    }
    folds[size_t(n.id)] = std::move(f);
    ++count;
  }
  if (count == 0) return 0;

  GraphRewriter rw(g);
  Graph& out = rw.graph();
  for (const Node& n : g.nodes()) {
    if (dropped[size_t(n.id)]) continue;
    if (n.op != OpKind::cross_entropy || folds[size_t(n.id)].logits == kNoValue) {
      rw.copy(n);
      continue;
    }
    const Fold& f = folds[size_t(n.id)];
    CrossEntropyAttrs attrs = std::get<CrossEntropyAttrs>(n.attrs);
    attrs.lse_stash = true;
    attrs.classes = f.classes;
    const TensorType& x = g.value(f.logits).type;
    const Shape& labels_shape = g.value(n.inputs[1]).type.shape;
    const TensorType& loss = g.value(n.outputs[0]).type;
    const std::string& loss_name = g.value(n.outputs[0]).name;
    ValueId logits = rw.mapped(f.logits), labels = rw.mapped(n.inputs[1]);
    const int64_t m = numel(labels_shape);
    if (f.rows && x.shape.size() != 2)
      logits = out.add_node(OpKind::reshape, ReshapeAttrs{{m, x.shape.back()}}, {logits},
                            n.name + "/rows", {rw.fresh_name(loss_name + "/logits_rows")})[0];
    if (f.rows && labels_shape.size() != 1)
      labels = out.add_node(OpKind::reshape, ReshapeAttrs{{m}}, {labels}, n.name + "/label_rows",
                            {rw.fresh_name(loss_name + "/label_rows")})[0];
    std::vector<ValueId> inputs{logits, labels};
    const DType stat = stash_dtype(x.dtype);
    if (n.inputs.size() > 2 && n.inputs[2] != kNoValue) {
      ValueId w = rw.mapped(n.inputs[2]);
      if (g.value(n.inputs[2]).type.dtype != stat)
        w = out.add_node(OpKind::cast, CastAttrs{stat}, {w}, n.name + "/weight_cast",
                         {rw.fresh_name(loss_name + "/weight")})[0];
      inputs.push_back(w);
    }
    const bool reshaped = f.rows && attrs.reduction == Reduction::none && labels_shape.size() != 1;
    const bool recast = loss.dtype != stat;
    const std::string direct_name =
        reshaped || recast ? rw.fresh_name(loss_name + "/rows") : loss_name;
    const std::vector<ValueId> ce = out.add_node(OpKind::cross_entropy, attrs, inputs, n.name,
                                                 {direct_name, rw.fresh_name(loss_name + "/lse")});
    ValueId y = ce[0];
    if (reshaped)
      y = out.add_node(OpKind::reshape, ReshapeAttrs{labels_shape}, {y}, n.name + "/loss_shape",
                       {recast ? rw.fresh_name(loss_name + "/unrows") : loss_name})[0];
    if (recast)
      y = out.add_node(OpKind::cast, CastAttrs{loss.dtype}, {y}, n.name + "/loss_cast",
                       {loss_name})[0];
    rw.map(n.outputs[0], y);
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
