// fuse_attention (passes/fusion.h): scaled dot-product attention spelled out as ops becomes
// one attention node (ir/ops.h), which the CUDA backend runs as cuDNN's fused flash
// attention: the [.., Tq, Tk] scores and probabilities never reach memory.
//
// The pattern, every value in it read only by the next node and no graph output:
//   scores = matmul(q', k')             q' = q or q * c;  k' = transpose(k) (last two dims
//                                        swapped), or that times c, or transpose(k * c); float
//                                        casts around each scale (scaled in f32 between casts)
//   p      = softmax(scores [* c | / c], last axis)
//   y      = matmul(p, v)
// with float casts anywhere between the scores and the last matmul (mixed precision runs the
// softmax in f32) and c constant scalars, whose product is the attention's scale. Between the
// scores and the softmax there may also be a causal mask in Hugging Face's form,
// where(tril, scores, fill): tril a known bool [.., Tq, Tk] (leading dims 1) holding
// j <= i, fill a known scalar <= -65504 (finfo.min of f16, bf16 or f32, or -inf), so that
// exp(fill - max) is 0 and the masked keys drop out as the causal attention drops them. And
// there may be one add of a bias (an additive mask: padding, relative position), any float
// value that broadcasts to the scores, as long as no scale comes after it (the attention adds
// its bias after the scale). This covers
// the zoo's ViT (scale after the product) and PyTorch's exported scaled_dot_product_attention
// (sqrt(scale) on q and on k^T). q, k, v and y must share one dtype, bf16 or f16: what cuDNN's
// fused attention takes. An f32 chain stays as it is: its products run on cuBLASLt (TF32),
// far faster than a fused kernel on CUDA cores would. In training graphs the node also
// outputs lse for its gradient rule (passes/autodiff/vjp_norm.cpp). A transpose on the scores'
// right operand that also splits the heads (perm [0, 2, 3, 1] from k [B, T, H, d], as exporters
// fold permute + transpose) is first split into the head split and the swap.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
namespace {

using fusion::known_tensor;
using fusion::op_text;
using fusion::Readers;
using fusion::Takeover;

// The value of a known scalar (one float element).
std::optional<double> constant_scalar(const Graph& g, ValueId v) {
  const Tensor* t = known_tensor(g, v);
  if (t == nullptr || t->numel() != 1 || !is_floating(t->dtype())) return std::nullopt;
  return t->get(0);
}

// A known scalar, or one behind a float cast: training graphs keep mixed precision's cast of
// an f32 initializer (an imported model's scale, a mask's fill) to the compute dtype instead
// of folding it, as they must for the initializers that become parameters. The value is the
// cast's (what the chain computes with).
std::optional<double> scalar_through_cast(const Graph& g, ValueId v) {
  if (std::optional<double> c = constant_scalar(g, v)) return c;
  const NodeId p = g.value(v).producer;
  if (p < 0 || g.node(p).op != OpKind::cast || !is_floating(g.value(v).type.dtype))
    return std::nullopt;
  const Tensor* t = known_tensor(g, g.node(p).inputs[0]);
  if (t == nullptr || t->numel() != 1 || !is_floating(t->dtype())) return std::nullopt;
  return t->cast(g.value(v).type.dtype).get(0);
}

// A known bool [1.., tq, tk] that keeps exactly the keys j <= i of query i (top-left aligned).
bool is_causal_mask(const Graph& g, ValueId v, int64_t tq, int64_t tk) {
  const Tensor* m = known_tensor(g, v);
  if (m == nullptr || m->dtype() != DType::boolean || m->rank() < 2) return false;
  const Shape& s = m->shape();
  for (size_t d = 0; d + 2 < s.size(); ++d)
    if (s[d] != 1) return false;
  if (s[s.size() - 2] != tq || s[s.size() - 1] != tk) return false;
  const bool* keep = m->data<bool>();
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j)
      if (keep[i * tk + j] != (j <= i)) return false;
  return true;
}

// mul(x, c) or mul(c, x) with c a constant scalar: x and c; else nothing.
std::optional<std::pair<ValueId, double>> scaled_by_constant(const Graph& g, const Node& n) {
  if (n.op != OpKind::mul && n.op != OpKind::div) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    if (n.op == OpKind::div && side == 0) continue;  // c / x is no scale
    const std::optional<double> c = scalar_through_cast(g, n.inputs[size_t(side)]);
    if (!c || *c == 0 || !std::isfinite(*c)) continue;
    return std::make_pair(n.inputs[size_t(1 - side)], n.op == OpKind::div ? 1.0 / *c : *c);
  }
  return std::nullopt;
}

bool swaps_last_two(const Node& n, size_t rank) {
  if (n.op != OpKind::transpose) return false;
  const auto& perm = std::get<TransposeAttrs>(n.attrs).perm;
  if (perm.size() != rank || rank < 2) return false;
  for (size_t d = 0; d + 2 < rank; ++d)
    if (perm[d] != int64_t(d)) return false;
  return perm[rank - 2] == int64_t(rank - 1) && perm[rank - 1] == int64_t(rank - 2);
}

// An operand of a product, walked up through float casts and constant scales, each read only
// by the next node: the topmost value of the operand's own dtype reached, and the nodes and
// scales passed to get there.
struct Operand {
  ValueId value;
  double scale = 1.0;
  std::vector<NodeId> nodes;
};

Operand walk_operand(const Graph& g, const Readers& r, ValueId v) {
  const DType io = g.value(v).type.dtype;
  Operand best{v, 1.0, {}}, at = best;
  for (;;) {
    const NodeId p = g.value(at.value).producer;
    if (p < 0 || r.only_reader(at.value) < 0) break;
    const Node& w = g.node(p);
    if (w.op == OpKind::cast && is_floating(g.value(w.inputs[0]).type.dtype)) {
      at.nodes.push_back(w.id), at.value = w.inputs[0];
    } else if (auto s = scaled_by_constant(g, w)) {
      at.nodes.push_back(w.id), at.value = s->first, at.scale *= s->second;
    } else {
      break;
    }
    if (g.value(at.value).type.dtype == io) best = at;
  }
  return best;
}

// Matches the pattern at a softmax; fills `t` and the scale. Nodes are the graph's.
class Matcher {
 public:
  Matcher(const Graph& g, const Readers& r) : g_(g), r_(r) {}

  bool match(const Node& softmax, Takeover& t, AttentionAttrs& attrs,
             std::vector<std::string>& ops) {
    const TensorType& s_type = g_.value(softmax.inputs[0]).type;
    const size_t rank = s_type.shape.size();
    if (rank < 3 || rank > 4 || std::get<SoftmaxAttrs>(softmax.attrs).axis != int64_t(rank) - 1)
      return false;
    replaced_.clear();
    double scale = 1.0;
    bool causal = false, scaled_below = false;
    ValueId bias = kNoValue;
    const int64_t queries = s_type.shape[rank - 2], keys = s_type.shape[rank - 1];
    // Up from the softmax: casts and scales, to the scores matmul.
    ValueId v = softmax.inputs[0];
    const Node* scores = nullptr;
    for (;;) {
      const Node* w = producer(v);
      if (w == nullptr || r_.only_reader(v) < 0) return false;
      if (w->op == OpKind::cast && is_floating(g_.value(w->inputs[0]).type.dtype)) {
        replaced_.push_back(w->id), v = w->inputs[0];
      } else if (auto s = scaled_by_constant(g_, *w)) {
        replaced_.push_back(w->id), v = s->first, scale *= s->second, scaled_below = true;
      } else if (w->op == OpKind::add && bias == kNoValue && !scaled_below) {
        // scores + bias (a mask): the scores side continues the chain.
        const int side = chain_side(*w);
        if (side < 0) return false;
        bias = w->inputs[size_t(1 - side)];
        const TensorType& b = g_.value(bias).type;
        if (!is_floating(b.dtype) || b.shape.size() > rank) return false;
        replaced_.push_back(w->id), v = w->inputs[size_t(side)];
      } else if (w->op == OpKind::where && !causal &&
                 is_causal_mask(g_, w->inputs[0], queries, keys) &&
                 g_.value(w->outputs[0]).type.shape == g_.value(w->inputs[1]).type.shape) {
        // The cast's rounding cannot move a fill <= -65504 above it (-inf at worst).
        const std::optional<double> fill = scalar_through_cast(g_, w->inputs[2]);
        if (!fill || !(*fill <= -65504.0)) return false;
        replaced_.push_back(w->id), v = w->inputs[1], causal = true;
      } else if (w->op == OpKind::matmul) {
        scores = w;
        break;
      } else {
        return false;
      }
    }
    if (r_.only_reader(scores->outputs[0]) < 0) return false;
    replaced_.push_back(scores->id);
    // The scores' operands: q [* c] and k^T [* c] (the scale on either side of the transpose),
    // float casts around the scales (mixed precision scaling in f32 between two casts).
    const Operand qw = walk_operand(g_, r_, scores->inputs[0]);
    const Operand ktw = walk_operand(g_, r_, scores->inputs[1]);
    const Node* transpose = producer(ktw.value);
    if (transpose == nullptr || r_.only_reader(ktw.value) < 0 || !swaps_last_two(*transpose, rank))
      return false;
    const Operand kw = walk_operand(g_, r_, transpose->inputs[0]);
    for (const Operand* o : {&qw, &ktw, &kw}) {
      replaced_.insert(replaced_.end(), o->nodes.begin(), o->nodes.end());
      scale *= o->scale;
    }
    replaced_.push_back(transpose->id);
    const ValueId q = qw.value, k = kw.value;
    // Down from the softmax: casts, then the product with v.
    replaced_.push_back(softmax.id);
    v = softmax.outputs[0];
    const Node* product = nullptr;
    for (;;) {
      const NodeId next = r_.only_reader(v);
      if (next < 0) return false;
      const Node& w = g_.node(next);
      if (w.op == OpKind::cast && is_floating(g_.value(w.outputs[0]).type.dtype)) {
        replaced_.push_back(w.id), v = w.outputs[0];
      } else if (w.op == OpKind::matmul && w.inputs[0] == v) {
        product = &w;
        break;
      } else {
        return false;
      }
    }
    replaced_.push_back(product->id);
    const ValueId values = product->inputs[1];
    // One float dtype and the shapes attention takes: [.., T, d] with the leading dims shared
    // (no broadcasting), y's dtype q's.
    const TensorType &tq = g_.value(q).type, &tk = g_.value(k).type, &tv = g_.value(values).type,
                     &ty = g_.value(product->outputs[0]).type;
    if ((tq.dtype != DType::bf16 && tq.dtype != DType::f16) || tk.dtype != tq.dtype ||
        tv.dtype != tq.dtype || ty.dtype != tq.dtype || tq.shape.size() != rank ||
        tk.shape.size() != rank || tv.shape.size() != rank)
      return false;
    for (size_t d = 0; d + 2 < rank; ++d)
      if (tk.shape[d] != tq.shape[d] || tv.shape[d] != tq.shape[d]) return false;
    if (tk.shape[rank - 1] != tq.shape[rank - 1] || tv.shape[rank - 2] != tk.shape[rank - 2])
      return false;

    std::sort(replaced_.begin(), replaced_.end());
    std::vector<std::pair<size_t, ValueId>> inputs = {{0, q}, {1, k}, {2, values}};
    if (bias != kNoValue) inputs.push_back({3, bias});
    t = Takeover{replaced_, product->outputs[0], {}, std::move(inputs), OpKind::attention};
    attrs = AttentionAttrs{scale, causal};
    ops.clear();
    for (NodeId n : replaced_) ops.push_back(op_text(g_.node(n)));
    return true;
  }

  // The scores matmul: the node the takeover belongs to.
  NodeId anchor() const {
    for (NodeId n : replaced_)
      if (g_.node(n).op == OpKind::matmul) return n;
    return -1;
  }

 private:
  // Which operand of the add `w` carries the scores (its output's shape, read only by the add,
  // made by a node the chain can hold); the other is the bias. -1 when neither; 0 when both.
  int chain_side(const Node& w) const {
    const Shape& out = g_.value(w.outputs[0]).type.shape;
    for (int side = 0; side < 2; ++side) {
      const ValueId v = w.inputs[size_t(side)];
      const Node* p = producer(v);
      if (p == nullptr || r_.only_reader(v) < 0 || g_.value(v).type.shape != out) continue;
      if (p->op == OpKind::matmul || p->op == OpKind::cast || p->op == OpKind::where ||
          scaled_by_constant(g_, *p))
        return side;
    }
    return -1;
  }

  const Node* producer(ValueId v) const {
    const NodeId n = g_.value(v).producer;
    return n >= 0 ? &g_.node(n) : nullptr;
  }

  const Graph& g_;
  const Readers& r_;
  std::vector<NodeId> replaced_;
};

// Whether `v` reaches a softmax along single readers through what may lie between the scores
// and the softmax (casts, scales, a mask's add or where).
bool leads_to_softmax(const Graph& g, const Readers& r, ValueId v) {
  for (int step = 0; step < 8; ++step) {
    const NodeId next = r.only_reader(v);
    if (next < 0) return false;
    const Node& n = g.node(next);
    if (n.op == OpKind::softmax) return true;
    if (n.op != OpKind::cast && n.op != OpKind::mul && n.op != OpKind::div && n.op != OpKind::add &&
        n.op != OpKind::where)
      return false;
    v = n.outputs[0];
  }
  return false;
}

// Exporters fold the head split and k's transpose into one Transpose (permute(0, 2, 1, 3) then
// transpose(-1, -2) is perm [0, 2, 3, 1]: Hugging Face's BERT). On the scores' right operand
// such a transpose becomes the head split alone, then a swap of the last two dims, which the
// pattern takes; the head split's output is the attention's k. Returns the number split;
// `unsplit` gets g as it was when there is any.
size_t split_key_transposes(Graph& g, std::optional<Graph>& unsplit) {
  const Readers r(g);
  std::vector<std::vector<int64_t>> split(g.nodes().size());  // by transpose: the head split
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::matmul || !leads_to_softmax(g, r, n.outputs[0])) continue;
    // The transpose where the matcher will look for it: above k^T's casts and scales.
    const ValueId kt = walk_operand(g, r, n.inputs[1]).value;
    const NodeId p = g.value(kt).producer;
    const Node* t = p >= 0 && r.only_reader(kt) >= 0 && g.node(p).op == OpKind::transpose
                        ? &g.node(p)
                        : nullptr;
    if (t == nullptr) continue;
    std::vector<int64_t> perm = std::get<TransposeAttrs>(t->attrs).perm;
    const size_t rank = perm.size();
    if (rank < 3 || swaps_last_two(*t, rank)) continue;
    std::swap(perm[rank - 2], perm[rank - 1]);
    split[size_t(t->id)] = perm;
    ++count;
  }
  if (count == 0) return 0;
  unsplit = g;
  fusion::rebuild_expanding(
      g, [&](const Node& n, GraphRewriter& rw) -> std::optional<std::vector<ValueId>> {
        const std::vector<int64_t>& heads = split[size_t(n.id)];
        if (heads.empty()) return std::nullopt;
        Graph& out = rw.graph();
        const std::string& name = g.value(n.outputs[0]).name;
        const ValueId k =
            out.add_node(OpKind::transpose, TransposeAttrs{heads}, {rw.mapped(n.inputs[0])},
                         n.name + "/heads", {name + "/heads"})[0];
        std::vector<int64_t> swap(heads.size());
        for (size_t d = 0; d < swap.size(); ++d) swap[d] = int64_t(d);
        std::swap(swap[swap.size() - 2], swap[swap.size() - 1]);
        return out.add_node(OpKind::transpose, TransposeAttrs{swap}, {k}, n.name, {name});
      });
  return count;
}

}  // namespace

size_t fuse_attention(Graph& g, FusionLog* log, bool training) {
  // The split is undone when nothing fuses (a graph without attention is left as it was); a
  // split transpose whose chain does not fuse while others do stays split.
  std::optional<Graph> unsplit;
  split_key_transposes(g, unsplit);
  const Readers r(g);
  std::vector<Takeover> takeover(g.nodes().size());
  size_t count = 0;
  Matcher m(g, r);
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::softmax) continue;
    Takeover t;
    AttentionAttrs attrs;
    std::vector<std::string> ops;
    if (!m.match(n, t, attrs, ops)) continue;
    const NodeId anchor = m.anchor();
    attrs.with_lse = training;
    t.attrs = attrs;
    if (log) log->add(g.node(anchor).name, ops);
    takeover[size_t(anchor)] = std::move(t);
    ++count;
  }
  if (count > 0)
    fusion::rebuild(g, takeover);
  else if (unsplit)
    g = std::move(*unsplit);
  return count;
}

}  // namespace fusebox
