// concat_slice_gradients (passes/simplify.h): walks the adds from the last; an add whose
// operands, through adds read only inside the tree, are all slice_backward nodes of one
// input that tile one axis becomes the concat of their gradients; the tree's nodes go.
#include <algorithm>
#include <string>
#include <vector>

#include "fusebox/passes/simplify.h"
#include "passes/fusion/fusion_rewrite.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

using fusion::Readers;

// One slice_backward's place: the gradient it scatters, and the range of `axis` it fills.
struct Piece {
  ValueId dy = kNoValue;
  int64_t start = 0, end = 0;
};

struct Tree {
  std::vector<NodeId> nodes;  // the adds and the slice_backward nodes
  std::vector<Piece> pieces;
  int64_t axis = -1;
  Shape shape;  // the sliced input's
};

// The one axis a normalised slice takes part of (every other listed axis whole, step 1);
// -1 where there is none such.
int64_t partial_axis(const SliceAttrs& s, const Shape& shape, int64_t* start, int64_t* end) {
  int64_t axis = -1;
  for (size_t i = 0; i < s.axes.size(); ++i) {
    const int64_t a = s.axes[i] < 0 ? s.axes[i] + int64_t(shape.size()) : s.axes[i];
    const int64_t step = i < s.steps.size() ? s.steps[i] : 1;
    if (a < 0 || a >= int64_t(shape.size()) || step != 1) return -1;
    if (s.starts[i] == 0 && s.ends[i] >= shape[size_t(a)]) continue;  // the whole axis
    if (axis >= 0) return -1;
    axis = a;
    *start = s.starts[i];
    *end = std::min(s.ends[i], shape[size_t(a)]);
  }
  return axis;
}

// Grows `t` from value v (an operand of a node of the tree): false where v is neither an add
// of the tree nor a slice_backward only the tree reads.
bool grow(const Graph& g, const Readers& r, NodeId reader, ValueId v, Tree& t) {
  const NodeId p = g.value(v).producer;
  if (p < 0 || r.only_reader(v) != reader) return false;
  const Node& n = g.node(p);
  if (n.op == OpKind::add) {
    t.nodes.push_back(p);
    return grow(g, r, p, n.inputs[0], t) && grow(g, r, p, n.inputs[1], t);
  }
  if (n.op != OpKind::slice_backward) return false;
  const auto& a = std::get<SliceBackwardAttrs>(n.attrs);
  Piece piece{n.inputs[0]};
  const int64_t axis = partial_axis(a.slice, a.input_shape, &piece.start, &piece.end);
  if (axis < 0 || (t.axis >= 0 && (axis != t.axis || a.input_shape != t.shape))) return false;
  t.axis = axis;
  t.shape = a.input_shape;
  t.nodes.push_back(p);
  t.pieces.push_back(piece);
  return true;
}

// Whether the pieces, in order of start, fill [0, extent) once each.
bool tiles(std::vector<Piece>& pieces, int64_t extent) {
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.start < b.start; });
  int64_t at = 0;
  for (const Piece& p : pieces) {
    if (p.start != at || p.end <= p.start) return false;
    at = p.end;
  }
  return at == extent;
}

}  // namespace

size_t concat_slice_gradients(Graph& g, FusionLog* /*log*/) {
  const Readers readers(g);
  std::vector<bool> taken(g.nodes().size(), false);
  std::vector<Tree> root_of(g.nodes().size());  // by the root add's id
  size_t count = 0;
  for (size_t k = g.nodes().size(); k-- > 0;) {
    const Node& n = g.node(NodeId(k));
    if (n.op != OpKind::add || taken[k] || n.inputs.size() != 2) continue;
    Tree t;
    if (!grow(g, readers, n.id, n.inputs[0], t) || !grow(g, readers, n.id, n.inputs[1], t) ||
        t.pieces.size() < 2 || g.value(n.outputs[0]).type.shape != t.shape ||
        !tiles(t.pieces, t.shape[size_t(t.axis)]))
      continue;
    for (NodeId m : t.nodes) taken[size_t(m)] = true;
    taken[k] = true;
    root_of[k] = std::move(t);
    ++count;
  }
  if (count == 0) return 0;
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    if (!taken[size_t(n.id)]) {
      rw.copy(n);
      continue;
    }
    const Tree& t = root_of[size_t(n.id)];
    if (t.pieces.empty()) continue;  // a node inside a tree: its root emits the concat
    std::vector<ValueId> parts;
    for (const Piece& p : t.pieces) parts.push_back(rw.mapped(p.dy));
    rw.emit(n, OpKind::concat, ConcatAttrs{t.axis}, std::move(parts), rw.output_names(n));
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
