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
// fused attention takes. An f32 chain stays as it is (its products run on cuBLASLt, TF32, far
// faster than a fused kernel on CUDA cores would), unless asked (`f32`: the CPU's oneDNN
// attention kernel takes f32). In training graphs the node also
// outputs lse for its gradient rule (passes/autodiff/vjp_norm.cpp). A transpose on the scores'
// right operand that also splits the heads (perm [0, 2, 3, 1] from k [B, T, H, d], as exporters
// fold permute + transpose) is first split into the head split and the swap; Swin's shifted
// windows (a per-window mask added between two reshapes) first join the windows to the heads
// (merge_window_heads below).
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
  Matcher(const Graph& g, const Readers& r, bool f32) : g_(g), r_(r), f32_(f32) {}

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
    if ((tq.dtype != DType::bf16 && tq.dtype != DType::f16 && !(f32_ && tq.dtype == DType::f32)) ||
        tk.dtype != tq.dtype || tv.dtype != tq.dtype || ty.dtype != tq.dtype ||
        tq.shape.size() != rank || tk.shape.size() != rank || tv.shape.size() != rank)
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
  bool f32_;  // f32 chains fuse too
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

// ---- Swin's shifted windows ------------------------------------------------------------
//
// torchvision's shifted_window_attention batches the windows (B_ = B * nW rows) and adds a
// per-window mask between two reshapes:
//   s = matmul(q', k'^T) [B_, h, N, N] (casts, scales) [+ rel] -> reshape [B, nW, h, N, N]
//     -> + mask [1, nW, 1|h, N, N] -> reshape [B_, h, N, N] -> casts -> softmax -> casts
//     -> matmul(p, v) [B_, h, N, dv]
// No bias broadcasts to the scores as that mask does (it repeats every nW rows of the
// batch), but one does once the windows join the heads: q, k and v read as [B, nW * h, N, d]
// (the same elements in the same order), rel + mask as one bias [1, nW * h, N, N], the
// product read back as [B_, h, N, dv]. The chain then has the form the matcher takes.

// The nodes and values of one windowed chain (node ids of the graph it was matched in).
struct WindowChain {
  ValueId q = kNoValue, k = kNoValue, v = kNoValue;  // the operands, [B_, h, N, d|dv]
  NodeId q_reader = -1, k_reader = -1;               // the chain's nodes reading q and k
  NodeId rel_add = -1, reshape5 = -1, mask_add = -1, reshape4 = -1, product = -1;
  ValueId rel = kNoValue, mask = kNoValue;
  ValueId chain_in = kNoValue;  // what the first add of the chain adds a bias to
  int64_t batch = 0, windows = 0, heads = 0, queries = 0, keys = 0;
};

// `shape` with leading 1s up to `rank`, or nullopt when it has more dims.
std::optional<Shape> padded(const Shape& shape, size_t rank) {
  if (shape.size() > rank) return std::nullopt;
  Shape s(rank - shape.size(), 1);
  s.insert(s.end(), shape.begin(), shape.end());
  return s;
}

// Whether every dim of `s` is 1 or the one of `full` beside it.
bool broadcasts_to(const Shape& s, const Shape& full) {
  if (s.size() != full.size()) return false;
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] != 1 && s[d] != full[d]) return false;
  return true;
}

std::optional<WindowChain> match_window_chain(const Graph& g, const Readers& r,
                                              const Node& softmax) {
  auto producer = [&](ValueId v) -> const Node* {
    const NodeId n = g.value(v).producer;
    return n >= 0 && r.only_reader(v) >= 0 ? &g.node(n) : nullptr;
  };
  const Shape& scores_shape = g.value(softmax.inputs[0]).type.shape;
  if (scores_shape.size() != 4 || std::get<SoftmaxAttrs>(softmax.attrs).axis != 3)
    return std::nullopt;
  WindowChain c;
  // Up from the softmax: casts, then reshape [B, nW, h, N, N] -> [B_, h, N, N].
  ValueId v = softmax.inputs[0];
  const Node* w = producer(v);
  while (w != nullptr && w->op == OpKind::cast && is_floating(g.value(w->inputs[0]).type.dtype))
    w = producer(v = w->inputs[0]);
  if (w == nullptr || w->op != OpKind::reshape) return std::nullopt;
  c.reshape4 = w->id;
  const Node* add5 = producer(w->inputs[0]);
  if (add5 == nullptr || add5->op != OpKind::add || g.value(w->inputs[0]).type.shape.size() != 5)
    return std::nullopt;
  c.mask_add = add5->id;
  const Node* r5 = nullptr;
  for (int side = 0; side < 2 && r5 == nullptr; ++side) {
    const Node* p = producer(add5->inputs[size_t(side)]);
    if (p == nullptr || p->op != OpKind::reshape ||
        g.value(p->outputs[0]).type.shape != g.value(add5->outputs[0]).type.shape)
      continue;
    r5 = p;
    c.mask = add5->inputs[size_t(1 - side)];
  }
  if (r5 == nullptr) return std::nullopt;
  c.reshape5 = r5->id;
  const Shape& s4 = g.value(r5->inputs[0]).type.shape;
  const Shape& s5 = g.value(r5->outputs[0]).type.shape;
  if (s4 != scores_shape || g.value(w->outputs[0]).type.shape != scores_shape ||
      s5[0] * s5[1] != s4[0] || s5[2] != s4[1] || s5[3] != s4[2] || s5[4] != s4[3])
    return std::nullopt;
  c.batch = s5[0], c.windows = s5[1], c.heads = s5[2], c.queries = s5[3], c.keys = s5[4];
  const TensorType& mask_type = g.value(c.mask).type;
  const std::optional<Shape> mask5 = padded(mask_type.shape, 5);
  if (!is_floating(mask_type.dtype) || !mask5 || (*mask5)[0] != 1 || !broadcasts_to(*mask5, s5))
    return std::nullopt;
  // Above the first reshape: the relative-position bias's add (read only by the reshape),
  // then casts and scales up to the scores' product.
  v = r5->inputs[0];
  w = producer(v);
  if (w != nullptr && w->op == OpKind::add) {
    for (int side = 0; side < 2; ++side) {
      const ValueId chain = w->inputs[size_t(side)], bias = w->inputs[size_t(1 - side)];
      const Node* p = producer(chain);
      const std::optional<Shape> bias4 = padded(g.value(bias).type.shape, 4);
      if (p == nullptr || g.value(chain).type.shape != s4 || !bias4 || (*bias4)[0] != 1 ||
          !broadcasts_to(*bias4, s4) || !is_floating(g.value(bias).type.dtype))
        continue;
      c.rel_add = w->id, c.rel = bias, v = chain;
      break;
    }
    if (c.rel_add < 0) return std::nullopt;
    w = producer(v);
  }
  c.chain_in = v;
  for (; w != nullptr; w = producer(v)) {
    if (w->op == OpKind::cast && is_floating(g.value(w->inputs[0]).type.dtype)) {
      v = w->inputs[0];
    } else if (auto scale = scaled_by_constant(g, *w)) {
      v = scale->first;
    } else {
      break;
    }
  }
  if (w == nullptr || w->op != OpKind::matmul) return std::nullopt;
  const Node& scores = *w;
  // The operands: q and k (above k^T's transpose) through casts and scales.
  const Operand qw = walk_operand(g, r, scores.inputs[0]);
  const Operand ktw = walk_operand(g, r, scores.inputs[1]);
  const Node* transpose = producer(ktw.value);
  if (transpose == nullptr || !swaps_last_two(*transpose, 4)) return std::nullopt;
  const Operand kw = walk_operand(g, r, transpose->inputs[0]);
  c.q = qw.value, c.k = kw.value;
  c.q_reader = qw.nodes.empty() ? scores.id : qw.nodes.back();
  c.k_reader = kw.nodes.empty() ? transpose->id : kw.nodes.back();
  // Down from the softmax: casts, then the product with v.
  v = softmax.outputs[0];
  for (;;) {
    const NodeId next = r.only_reader(v);
    if (next < 0) return std::nullopt;
    const Node& n = g.node(next);
    if (n.op == OpKind::cast && is_floating(g.value(n.outputs[0]).type.dtype)) {
      v = n.outputs[0];
    } else if (n.op == OpKind::matmul && n.inputs[0] == v) {
      c.product = n.id;
      c.v = n.inputs[1];
      break;
    } else {
      return std::nullopt;
    }
  }
  const Shape &tq = g.value(c.q).type.shape, &tk = g.value(c.k).type.shape,
              &tv = g.value(c.v).type.shape;
  for (const Shape* s : {&tq, &tk, &tv})
    if (s->size() != 4 || (*s)[0] != s4[0] || (*s)[1] != c.heads) return std::nullopt;
  if (tq[2] != c.queries || tk[2] != c.keys || tv[2] != c.keys) return std::nullopt;
  return c;
}

// rel [.., h|1, N|1, N|1] + mask [1, nW|1, h|1, N|1, N|1] over [1, nW, h, N, N], in `dtype`,
// computed here (both known).
Tensor window_bias(const Tensor* rel, const Tensor& mask, const WindowChain& c, DType dtype) {
  const Shape full = {1, c.windows, c.heads, c.queries, c.keys};
  const Shape m5 = *padded(mask.shape(), 5);
  const Shape r5 = rel ? *padded(*padded(rel->shape(), 4), 5) : Shape(5, 1);
  Tensor out = Tensor::zeros(DType::f64, full);
  double* o = out.data<double>();
  // The flat index in a tensor of `shape` (each dim 1 or full's) of full's element e.
  auto at = [&](const Shape& shape, int64_t e) {
    int64_t index = 0, stride = 1, rest = e;
    std::vector<int64_t> coord(5);
    for (int d = 4; d >= 0; --d) coord[size_t(d)] = rest % full[size_t(d)], rest /= full[size_t(d)];
    for (int d = 4; d >= 0; --d) {
      if (shape[size_t(d)] != 1) index += coord[size_t(d)] * stride;
      stride *= shape[size_t(d)];
    }
    return index;
  };
  for (int64_t e = 0; e < out.numel(); ++e)
    o[e] = mask.get(at(m5, e)) + (rel ? rel->get(at(r5, e)) : 0.0);
  return out.cast(dtype).reshaped({1, c.windows * c.heads, c.queries, c.keys});
}

// Merges the windows of every windowed chain into its heads (see above). Returns the number
// merged; `original` gets g as it was, unless it holds a graph already.
size_t merge_window_heads(Graph& g, std::optional<Graph>& original) {
  const Readers r(g);
  std::vector<WindowChain> chains;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::softmax)
      if (std::optional<WindowChain> c = match_window_chain(g, r, n)) chains.push_back(*c);
  if (chains.empty()) return 0;
  if (!original) original = g;
  enum class Role { none, q_reader, k_reader, rel_add, reshape5, mask_add, reshape4, product };
  std::vector<std::pair<Role, size_t>> role(g.nodes().size(), {Role::none, 0});
  for (size_t i = 0; i < chains.size(); ++i) {
    const WindowChain& c = chains[i];
    role[size_t(c.q_reader)] = {Role::q_reader, i};
    role[size_t(c.k_reader)] = {Role::k_reader, i};
    if (c.rel_add >= 0) role[size_t(c.rel_add)] = {Role::rel_add, i};
    role[size_t(c.reshape5)] = {Role::reshape5, i};
    role[size_t(c.mask_add)] = {Role::mask_add, i};
    role[size_t(c.reshape4)] = {Role::reshape4, i};
    role[size_t(c.product)] = {Role::product, i};
  }
  fusion::rebuild_expanding(
      g, [&](const Node& n, GraphRewriter& rw) -> std::optional<std::vector<ValueId>> {
        const auto [what, i] = role[size_t(n.id)];
        if (what == Role::none) return std::nullopt;
        const WindowChain& c = chains[i];
        Graph& out = rw.graph();
        const int64_t merged = c.windows * c.heads;
        // `value` (a source value) read as [B, nW * h, .., ..].
        auto merge = [&](ValueId value) {
          const Shape& s = g.value(value).type.shape;
          return out.add_node(OpKind::reshape, ReshapeAttrs{{c.batch, merged, s[2], s[3]}},
                              {rw.mapped(value)}, n.name + "/window_heads",
                              {rw.fresh_name(g.value(value).name + "/window_heads")})[0];
        };
        auto inputs_with = [&](ValueId base) {
          std::vector<ValueId> in;
          for (ValueId x : n.inputs) in.push_back(x == base ? merge(x) : rw.mapped(x));
          return in;
        };
        switch (what) {
          case Role::q_reader:
          case Role::k_reader:
            return rw.emit(n, n.op, n.attrs, inputs_with(what == Role::q_reader ? c.q : c.k),
                           rw.output_names(n));
          case Role::rel_add:
          case Role::reshape5:
          case Role::reshape4: {  // gone: their reader reads what they read
            const ValueId through = what == Role::rel_add ? c.chain_in : n.inputs[0];
            return std::vector<ValueId>{rw.mapped(through)};
          }
          case Role::mask_add: {
            const DType dtype = g.value(n.outputs[0]).type.dtype;
            const Tensor* rel = c.rel != kNoValue ? known_tensor(g, c.rel) : nullptr;
            const Tensor* mask = known_tensor(g, c.mask);
            ValueId bias;
            if (mask != nullptr && (c.rel == kNoValue || rel != nullptr)) {
              bias = out.add_constant(rw.fresh_name(n.name + "/window_bias"),
                                      window_bias(rel, *mask, c, dtype));
            } else {  // computed in the step (a trainable rel): reshape, add, expand, reshape
              auto as5 = [&](ValueId x, const Shape& shape) {
                ValueId y = rw.mapped(x);
                if (g.value(x).type.dtype != dtype)
                  y = out.add_node(OpKind::cast, CastAttrs{dtype}, {y}, n.name + "/window_bias",
                                   {rw.fresh_name(n.name + "/window_bias_cast")})[0];
                return out.add_node(OpKind::reshape, ReshapeAttrs{shape}, {y},
                                    n.name + "/window_bias",
                                    {rw.fresh_name(n.name + "/window_bias_5d")})[0];
              };
              ValueId sum = as5(c.mask, *padded(g.value(c.mask).type.shape, 5));
              if (c.rel != kNoValue)
                sum = out.add_node(
                    OpKind::add, {},
                    {as5(c.rel, *padded(*padded(g.value(c.rel).type.shape, 4), 5)), sum},
                    n.name + "/window_bias", {rw.fresh_name(n.name + "/window_bias_sum")})[0];
              sum = out.add_node(
                  OpKind::expand, ExpandAttrs{{1, c.windows, c.heads, c.queries, c.keys}}, {sum},
                  n.name + "/window_bias", {rw.fresh_name(n.name + "/window_bias_full")})[0];
              bias = out.add_node(OpKind::reshape, ReshapeAttrs{{1, merged, c.queries, c.keys}},
                                  {sum}, n.name + "/window_bias",
                                  {rw.fresh_name(n.name + "/window_bias")})[0];
            }
            return rw.emit(n, OpKind::add, {}, {rw.mapped(c.chain_in), bias}, rw.output_names(n));
          }
          case Role::product: {
            const ValueId y =
                out.add_node(n.op, n.attrs, inputs_with(c.v), n.name,
                             {rw.fresh_name(g.value(n.outputs[0]).name + "/window_heads")})[0];
            return out.add_node(OpKind::reshape, ReshapeAttrs{g.value(n.outputs[0]).type.shape},
                                {y}, n.name + "/windows", rw.output_names(n));
          }
          case Role::none:
            break;
        }
        return std::nullopt;
      });
  return chains.size();
}

}  // namespace

size_t fuse_attention(Graph& g, FusionLog* log, bool training, bool f32) {
  // The split and the merged windows are undone when nothing fuses (a graph without attention
  // is left as it was); a split transpose whose chain does not fuse while others do stays
  // split.
  std::optional<Graph> unsplit;
  split_key_transposes(g, unsplit);
  merge_window_heads(g, unsplit);
  const Readers r(g);
  std::vector<Takeover> takeover(g.nodes().size());
  size_t count = 0;
  Matcher m(g, r, f32);
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
