// Layout ops as index maps onto a stored root, and the plan of which go unstored
// (layout_views.h).
#include "executable/layout_views.h"

#include <deque>

#include "executable/memory_plan.h"
#include "fusebox/ir/op_groups.h"

namespace fusebox::runtime {

namespace {

// Joins neighbouring factors that nest (outer stride = inner extent x inner stride).
std::vector<Factor> nested(const std::vector<Factor>& factors) {
  std::vector<Factor> out;
  for (const Factor& f : factors) {
    if (!out.empty() && out.back().stride == f.extent * f.stride) {
      out.back().extent *= f.extent;
      out.back().stride = f.stride;
    } else {
      out.push_back(f);
    }
  }
  return out;
}

// Whether two strides of `shape` are the same order (dims of extent 1 do not count).
bool same_dense_order(const Shape& shape, const Shape& a, const Shape& b) {
  if (a.size() != shape.size() || b.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && a[d] != b[d]) return false;
  return true;
}

}  // namespace

IndexMap IndexMap::stored(const Shape& shape, const Shape& strides) {
  IndexMap m;
  m.dims_.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) m.dims_[d].push_back({shape[d], strides[d]});
  return m;
}

// The factors in row-major order, joined where they nest, are dealt to the new dims outermost
// first; a factor larger than what a dim still needs is split (its outer part to the dim, the
// rest stays first in line), which needs the dim's remaining extent to divide it.
bool IndexMap::reshape(const Shape& to) {
  std::vector<Factor> all;
  for (const auto& dim : dims_) all.insert(all.end(), dim.begin(), dim.end());
  const std::vector<Factor> joined = nested(all);
  std::deque<Factor> line(joined.begin(), joined.end());
  std::vector<std::vector<Factor>> dims(to.size());
  for (size_t d = 0; d < to.size(); ++d) {
    int64_t need = to[d];
    if (need <= 0) return false;
    while (need > 1) {
      if (line.empty()) return false;
      Factor f = line.front();
      line.pop_front();
      if (f.extent <= need) {
        if (need % f.extent != 0) return false;
        need /= f.extent;
        dims[d].push_back(f);
      } else {
        if (f.extent % need != 0) return false;
        const int64_t inner = f.extent / need;
        dims[d].push_back({need, f.stride * inner});
        line.push_front({inner, f.stride});
        need = 1;
      }
    }
  }
  if (!line.empty()) return false;
  dims_ = std::move(dims);
  return true;
}

void IndexMap::transpose(const std::vector<int64_t>& perm) {
  std::vector<std::vector<Factor>> dims(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) dims[d] = dims_[size_t(perm[d])];
  dims_ = std::move(dims);
}

// A sliced dim must be one stride (a dim of several factors is sliced only whole); negative
// steps are left to the copy.
bool IndexMap::slice(const SliceAttrs& a, const Shape& out_shape) {
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const size_t d = size_t(a.axes[i]);
    const int64_t count = out_shape[d], step = a.steps.empty() ? 1 : a.steps[i];
    if (d >= dims_.size() || step <= 0 || count <= 0) return false;
    std::vector<Factor> factors = nested(dims_[d]);
    int64_t extent = 1;
    for (const Factor& f : factors) extent *= f.extent;
    if (count == extent && step == 1 && a.starts[i] == 0) continue;
    if (factors.size() != 1) return false;
    offset_ += a.starts[i] * factors[0].stride;
    dims_[d].clear();
    if (count > 1) dims_[d].push_back({count, factors[0].stride * step});
  }
  return true;
}

std::optional<Shape> IndexMap::strides() const {
  Shape out(dims_.size(), 1);
  for (size_t d = 0; d < dims_.size(); ++d) {
    const std::vector<Factor> factors = nested(dims_[d]);
    if (factors.size() > 1) return std::nullopt;
    if (factors.size() == 1) out[d] = factors[0].stride;
  }
  return out;
}

bool follows_layout(const Node& n) {
  return is_reshape_family(n.op) || n.op == OpKind::transpose || n.op == OpKind::slice;
}

bool apply_layout(IndexMap& map, const Node& n, const Shape& out) {
  if (is_reshape_family(n.op)) return map.reshape(out);
  if (n.op == OpKind::transpose) {
    map.transpose(std::get<TransposeAttrs>(n.attrs).perm);
    return true;
  }
  if (n.op == OpKind::slice) return map.slice(std::get<SliceAttrs>(n.attrs), out);
  return false;
}

namespace {

using Kind = LayoutView::Kind;

// One planning round. Maps run forward from the roots; the kinds are decided backward, each
// value after all its readers: a value is a view where it is one and every reader takes
// strides (or is a layout op whose output is not copied from it), unstored where only such
// layout ops read it, and stored otherwise (copied from the root's view where its input is
// unstored). A value marked in `restart` (stored in an earlier round) keeps that round's plan
// (`kept`) and is the root of the chain below it. `chain_root` gets each mapped value's root
// (the plan forgets the roots of copies).
std::vector<LayoutView> plan_round(const Graph& g, const std::vector<bool>& eligible,
                                   const std::vector<Shape>& stored,
                                   const std::function<ReaderTakes(const Node&, size_t)>& takes,
                                   const std::vector<bool>& restart,
                                   const std::vector<LayoutView>& kept,
                                   std::vector<ValueId>& chain_root) {
  const size_t count = g.values().size();
  std::vector<LayoutView> plan(count);
  std::vector<std::optional<IndexMap>> map(count);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!follows_layout(n) || n.inputs.size() != 1 || n.outputs.size() != 1) continue;
    const ValueId in = n.inputs[0], out = n.outputs[0];
    if (!eligible[size_t(out)]) continue;
    std::optional<IndexMap> m;
    ValueId root = kNoValue;
    if (eligible[size_t(in)] && map[size_t(in)] && !restart[size_t(in)]) {
      m = map[size_t(in)];
      root = plan[size_t(in)].root;
    } else if (!stored[size_t(in)].empty()) {
      m = IndexMap::stored(g.value(in).type.shape, stored[size_t(in)]);
      root = in;
    }
    if (!m || !apply_layout(*m, n, g.value(out).type.shape)) continue;
    map[size_t(out)] = std::move(m);
    plan[size_t(out)].root = root;
  }

  std::vector<std::vector<std::pair<size_t, size_t>>> readers(count);  // (node, input)
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (size_t k = 0; k < g.nodes()[i].inputs.size(); ++k)
      if (g.nodes()[i].inputs[k] != kNoValue)
        readers[size_t(g.nodes()[i].inputs[k])].push_back({i, k});

  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    if (!follows_layout(n) || n.outputs.size() != 1) continue;
    const ValueId v = n.outputs[0];
    if (!map[size_t(v)]) continue;
    if (restart[size_t(v)]) {
      plan[size_t(v)] = kept[size_t(v)];
      continue;
    }
    const std::optional<Shape> strides = map[size_t(v)]->strides();
    const Value& value = g.value(v);
    const bool aligned = map[size_t(v)]->offset() * int64_t(dtype_size(value.type.dtype)) %
                             int64_t(MemoryPlan::kAlignment) ==
                         0;
    const bool planned =
        aligned && strides && same_dense_order(value.type.shape, *strides, stored[size_t(v)]);
    bool viewable = strides.has_value(), unstorable = true;
    for (const auto& [r, k] : readers[size_t(v)]) {
      const Node& reader = g.nodes()[r];
      const bool layout_reader = follows_layout(reader) && reader.outputs.size() == 1 &&
                                 map[size_t(reader.outputs[0])].has_value();
      if (layout_reader) {
        // The reader's output was decided already: a stored one is copied from the root's
        // view where it has one (then v need not be a tensor), else by its node from v.
        const ValueId w = reader.outputs[0];
        if (plan[size_t(w)].kind == Kind::copy && !map[size_t(w)]->strides()) unstorable = false;
        continue;
      }
      unstorable = false;
      switch (takes(reader, k)) {
        case ReaderTakes::planned:
          viewable = viewable && planned;
          break;
        case ReaderTakes::aligned_strides:
          viewable = viewable && aligned;
          break;
        case ReaderTakes::any_view:
          break;
      }
    }
    LayoutView& p = plan[size_t(v)];
    if (viewable) {
      p.kind = Kind::view;
    } else if (unstorable && !readers[size_t(v)].empty()) {
      p.kind = Kind::unstored;
    } else {
      p.kind = Kind::copy;
    }
    if (p.kind == Kind::view) {
      p.offset = map[size_t(v)]->offset();
      p.strides = *strides;
    }
  }
  // A stored output whose input is unstored is copied from its root's view (its map is one:
  // else the input would have had to be a tensor).
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!follows_layout(n) || n.outputs.size() != 1 || n.inputs.size() != 1) continue;
    const ValueId in = n.inputs[0], out = n.outputs[0];
    LayoutView& p = plan[size_t(out)];
    if (restart[size_t(out)] || p.kind != Kind::copy || plan[size_t(in)].kind != Kind::unstored)
      continue;
    const std::optional<Shape> strides = map[size_t(out)]->strides();
    p.kind = Kind::from_root;
    p.offset = map[size_t(out)]->offset();
    p.strides = *strides;
  }
  chain_root.assign(count, kNoValue);
  for (size_t v = 0; v < count; ++v) {
    if (map[v]) chain_root[v] = plan[v].root;
    if (plan[v].kind == Kind::copy) plan[v].root = kNoValue;
  }
  return plan;
}

bool stored_kind(Kind k) {
  return k == Kind::copy || k == Kind::from_root;
}

}  // namespace

// A chain can pass stored copies (a transpose a GEMM reads as rows); what follows them is still
// mapped onto the chain's first root, which then lives as long as any of them. Where the chain
// goes on past such a copy (the inverse reshape and transpose a backward reads), the copy is
// made the root of what follows, so the first root dies with its own readers (ViT's attention
// output, kept once as the output projection's rows). A copy is kept as a root only where no
// value below it turns from a view (or unstored) into a copy by it (strides it cannot take).
std::vector<LayoutView> plan_layout_views(
    const Graph& g, const std::vector<bool>& eligible, const std::vector<Shape>& stored,
    const std::function<ReaderTakes(const Node&, size_t)>& takes) {
  const size_t count = g.values().size();
  std::vector<ValueId> first_roots;
  const std::vector<LayoutView> first =
      plan_round(g, eligible, stored, takes, std::vector<bool>(count, false), {}, first_roots);
  std::vector<bool> restart(count, false);
  bool any = false;
  for (const Node& n : g.nodes()) {
    if (!follows_layout(n) || n.inputs.size() != 1 || n.outputs.size() != 1) continue;
    const ValueId in = n.inputs[0];
    if (first_roots[size_t(n.outputs[0])] == kNoValue || first_roots[size_t(in)] == kNoValue ||
        !stored_kind(first[size_t(in)].kind) || stored[size_t(in)].empty())
      continue;
    restart[size_t(in)] = true;  // a mapped stored value a mapped layout op reads
    any = true;
  }
  while (any) {
    std::vector<ValueId> roots;
    std::vector<LayoutView> plan = plan_round(g, eligible, stored, takes, restart, first, roots);
    any = false;
    for (size_t v = 0; v < count; ++v) {
      const ValueId r = roots[v];
      if (r == kNoValue || !restart[size_t(r)] || stored_kind(first[v].kind) ||
          !stored_kind(plan[v].kind))
        continue;
      restart[size_t(r)] = false;  // v would be copied below it: the first plan's root stays
      any = true;
    }
    if (!any) return plan;
  }
  return first;
}

}  // namespace fusebox::runtime
