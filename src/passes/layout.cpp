// The layout pass (passes/layout.h): groups of values that must share an order, joined
// through elementwise and channelwise ops by a union-find; groups that touch a convolution
// are stored channels-last where the value's shape and producer allow it.
#include "fusebox/passes/layout.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "fusebox/core/error.h"
#include "fusebox/ir/op_groups.h"

namespace fusebox {

const char* layout_role_name(LayoutRole r) {
  switch (r) {
    case LayoutRole::contiguous:
      return "contiguous";
    case LayoutRole::convolution:
      return "convolution";
    case LayoutRole::elementwise:
      return "elementwise";
    case LayoutRole::channelwise:
      return "channelwise";
    case LayoutRole::pairwise:
      return "pairwise";
    case LayoutRole::any_order:
      return "any_order";
  }
  return "?";
}

LayoutRole layout_role(const Node& n) {
  // max_pool's indices (a second output) count in NCHW order.
  if (n.op == OpKind::max_pool && n.outputs.size() > 1) return LayoutRole::contiguous;
  return op_info(n.op).layout;
}

namespace {

// Whether channels-last and contiguous order the elements of `s` differently.
bool orders_differ(const Shape& s) {
  return s.size() >= 3 && !is_dense_in(s, contiguous_strides(s), MemoryFormat::channels_last);
}

struct Groups {
  std::vector<size_t> parent;
  explicit Groups(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), size_t(0)); }
  size_t find(size_t v) {
    while (parent[v] != v) v = parent[v] = parent[parent[v]];
    return v;
  }
  void join(size_t a, size_t b) { parent[find(a)] = find(b); }
};

// The operands of `n` that must share output 0's order (elementwise: of its shape;
// channelwise: of its rank), inputs then outputs.
std::vector<ValueId> ordered_operands(const Graph& g, const Node& n, LayoutRole role) {
  std::vector<ValueId> result;
  if (n.outputs.empty()) return result;
  const Shape& out = g.value(n.outputs[0]).type.shape;
  auto joins = [&](ValueId v) {
    if (v == kNoValue) return false;
    const Shape& s = g.value(v).type.shape;
    return role == LayoutRole::elementwise ? s == out : s.size() == out.size();
  };
  if (out.size() < 3) return result;
  for (ValueId v : n.inputs)
    if (joins(v)) result.push_back(v);
  for (ValueId v : n.outputs)
    if (joins(v)) result.push_back(v);
  return result;
}

// FUSEBOX_LAYOUT as parsed; -1 until the first layout_policy_from_env() (or a test's re-read).
std::atomic<int> g_layout_policy{-1};

LayoutPolicy parse_layout_env() {
  const char* text = std::getenv("FUSEBOX_LAYOUT");
  if (text == nullptr || *text == '\0' || std::string(text) == "auto")
    return LayoutPolicy::channels_last_convs;
  if (std::string(text) == "contiguous") return LayoutPolicy::contiguous;
  throw Error("FUSEBOX_LAYOUT", "'" + std::string(text) +
                                    "' is not a layout policy: use auto (channels-last around "
                                    "convolutions) or contiguous");
}

}  // namespace

LayoutPolicy layout_policy_from_env() {
  int policy = g_layout_policy.load(std::memory_order_relaxed);
  if (policy < 0) {
    policy = int(parse_layout_env());
    g_layout_policy.store(policy, std::memory_order_relaxed);
  }
  return LayoutPolicy(policy);
}

void reread_layout_policy() {
  g_layout_policy.store(-1, std::memory_order_relaxed);
}

LayoutPlan plan_layouts(const Graph& g, LayoutPolicy policy) {
  LayoutPlan plan;
  const size_t count = g.values().size();
  plan.format.assign(count, MemoryFormat::contiguous);
  if (policy == LayoutPolicy::contiguous) return plan;

  // 1-2. Groups, and which of them touch a convolution.
  Groups groups(count);
  std::vector<bool> conv_operand(count, false);
  for (const Node& n : g.nodes()) {
    const LayoutRole role = layout_role(n);
    if (role == LayoutRole::convolution) {
      for (ValueId v : n.inputs)
        if (v != kNoValue && g.value(v).type.shape.size() >= 3) conv_operand[size_t(v)] = true;
      for (ValueId v : n.outputs) conv_operand[size_t(v)] = true;
    } else if (role == LayoutRole::pairwise) {
      for (size_t i = 0; i < n.inputs.size() && i < n.outputs.size(); ++i)
        groups.join(size_t(n.inputs[i]), size_t(n.outputs[i]));
    } else if (role != LayoutRole::contiguous && role != LayoutRole::any_order) {
      const std::vector<ValueId> operands = ordered_operands(g, n, role);
      for (size_t i = 1; i < operands.size(); ++i)
        groups.join(size_t(operands[0]), size_t(operands[i]));
    }
  }
  std::vector<bool> group_channels_last(count, false);
  for (size_t v = 0; v < count; ++v)
    if (conv_operand[v]) group_channels_last[groups.find(v)] = true;

  // 3. Values.
  for (const Value& v : g.values()) {
    if (!group_channels_last[groups.find(size_t(v.id))] || !orders_differ(v.type.shape)) continue;
    const bool loaded = v.producer < 0;
    if (!loaded && layout_role(g.node(v.producer)) == LayoutRole::contiguous) continue;
    plan.format[size_t(v.id)] = MemoryFormat::channels_last;
    ++plan.channels_last_values;
    if (loaded) ++plan.loads_converted;
  }

  // Conversions: what each reader needs against what it gets.
  for (const Node& n : g.nodes()) {
    const LayoutRole role = layout_role(n);
    MemoryFormat wanted = MemoryFormat::contiguous;
    std::vector<ValueId> readers_of_order;
    if (role == LayoutRole::pairwise) {
      // Input i in output i's order (the kernels convert one that is not).
      for (size_t i = 0; i < n.inputs.size() && i < n.outputs.size(); ++i) {
        const ValueId v = n.inputs[i];
        if (orders_differ(g.value(v).type.shape) && plan.of(v) != plan.of(n.outputs[i]))
          plan.conversions.push_back({n.id, v, plan.of(v), plan.of(n.outputs[i])});
      }
      continue;
    }
    if (role == LayoutRole::any_order) continue;  // reads any strides, writes any order
    if (role == LayoutRole::contiguous) {
      readers_of_order = n.inputs;
    } else if (role == LayoutRole::convolution) {
      // Inputs in the output's order when it is channels-last (cuda::run_node).
      if (plan.of(n.outputs[0]) == MemoryFormat::contiguous) continue;
      wanted = MemoryFormat::channels_last;
      readers_of_order = n.inputs;
    } else {
      // As cuda::run_node decides: channels-last when an output is, or (outputs being
      // both orders, e.g. a pool's [N, C, 1, 1]) when an input of their rank is.
      // Broadcast operands of an elementwise op are read through strides either way.
      bool channels_last = false;
      for (ValueId v : n.outputs)
        channels_last = channels_last || plan.of(v) == MemoryFormat::channels_last;
      for (ValueId v : ordered_operands(g, n, role)) {
        if (g.value(v).producer == n.id) continue;
        readers_of_order.push_back(v);
        if (!orders_differ(g.value(n.outputs[0]).type.shape) &&
            plan.of(v) == MemoryFormat::channels_last) {
          channels_last = true;
        }
      }
      if (channels_last) wanted = MemoryFormat::channels_last;
    }
    for (ValueId v : readers_of_order) {
      if (v == kNoValue || !orders_differ(g.value(v).type.shape) || plan.of(v) == wanted) continue;
      plan.conversions.push_back({n.id, v, plan.of(v), wanted});
    }
  }
  for (ValueId v : g.outputs())
    if (plan.of(v) == MemoryFormat::channels_last)
      plan.conversions.push_back({-1, v, MemoryFormat::channels_last, MemoryFormat::contiguous});
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::transpose) continue;
    const ValueId in = n.inputs[0], out = n.outputs[0];
    if (transpose_keeps_bytes(g.value(in).type.shape, std::get<TransposeAttrs>(n.attrs).perm,
                              plan.of(in), plan.of(out)))
      ++plan.transpose_views;
  }
  return plan;
}

namespace {

size_t value_bytes(const Graph& g, ValueId v) {
  const TensorType& t = g.value(v).type;
  return size_t(numel(t.shape)) * dtype_size(t.dtype);
}

// Why node `n` copies, or "" where it is a view (or no data-movement op).
std::string copy_reason(const Graph& g, const LayoutPlan& plan, const Node& n) {
  if (n.inputs.empty() || n.outputs.empty() || n.inputs[0] == kNoValue) return "";
  const ValueId in = n.inputs[0], out = n.outputs[0];
  const char* from = memory_format_name(plan.of(in));
  const char* to = memory_format_name(plan.of(out));
  if (is_reshape_family(n.op)) {
    if (plan.of(in) == MemoryFormat::contiguous && plan.of(out) == MemoryFormat::contiguous)
      return "";
    return cat("reshapes view contiguous bytes only (input ", from, ", output ", to, ")");
  }
  switch (n.op) {
    case OpKind::transpose:
      if (transpose_keeps_bytes(g.value(in).type.shape, std::get<TransposeAttrs>(n.attrs).perm,
                                plan.of(in), plan.of(out)))
        return "";
      return cat("its output's order (", to, ") is not its input's (", from,
                 ") bytes permuted: a strided copy");
    case OpKind::slice: {
      const std::optional<size_t> offset = block_slice_offset(g, n);
      if (plan.of(in) == MemoryFormat::contiguous && plan.of(out) == MemoryFormat::contiguous &&
          offset && *offset % kBlockSliceAlignment == 0)
        return "";
      return "not one aligned block of its contiguous input: a strided copy";
    }
    case OpKind::concat:
      return "each input is copied into its slab (producers do not write into it)";
    case OpKind::pad:
      return "copied into a larger buffer (no reader takes the padding itself)";
    case OpKind::expand:
      return "a broadcast written out (no reader takes stride-0 views)";
    case OpKind::cast:
      return "no generated kernel took it (its producer and readers are not pointwise)";
    default:
      return "";
  }
}

}  // namespace

std::vector<LayoutCopy> layout_copies(const Graph& g, const LayoutPlan& plan,
                                      const std::vector<std::string>& read_through) {
  const std::set<std::string> skipped(read_through.begin(), read_through.end());
  std::vector<LayoutCopy> copies;
  for (const Node& n : g.nodes()) {
    if (skipped.count(n.name)) continue;
    const std::string reason = copy_reason(g, plan, n);
    if (!reason.empty())
      copies.push_back({n.id, node_label(n), value_bytes(g, n.outputs[0]), reason});
  }
  for (const LayoutPlan::Conversion& c : plan.conversions) {
    copies.push_back(
        {c.node,
         cat("conversion of '", g.value(c.value).name, "' ",
             shape_str(g.value(c.value).type.shape)),
         value_bytes(g, c.value),
         cat("stored ", memory_format_name(c.from), ", read ", memory_format_name(c.to), " by ",
             c.node < 0 ? std::string("the graph output") : node_label(g.node(c.node)))});
  }
  return copies;
}

std::string describe_copies(const std::vector<LayoutCopy>& copies, size_t max_lines) {
  // Per kind: the first word of `what` (the op, or "conversion").
  std::map<std::string, std::pair<size_t, size_t>> kinds;  // count, bytes
  size_t total = 0;
  for (const LayoutCopy& c : copies) {
    auto& [count, bytes] = kinds[c.what.substr(0, c.what.find(' '))];
    ++count;
    bytes += c.bytes;
    total += c.bytes;
  }
  std::ostringstream os;
  os << "copies: " << copies.size() << " nodes move data (" << total / (1 << 20) << " MiB)";
  for (const auto& [kind, cb] : kinds)
    os << "; " << kind << " " << cb.first << " (" << cb.second / (1 << 20) << " MiB)";
  os << "\n";
  for (size_t i = 0; i < copies.size() && i < max_lines; ++i)
    os << "  " << copies[i].what << ": " << copies[i].reason << "\n";
  if (copies.size() > max_lines) os << "  ... " << copies.size() - max_lines << " more\n";
  return os.str();
}

std::optional<size_t> block_slice_offset(const Graph& g, const Node& slice) {
  if (slice.op != OpKind::slice) return std::nullopt;
  const auto& a = std::get<SliceAttrs>(slice.attrs);
  const TensorType& in = g.value(slice.inputs[0]).type;
  const Shape& out = g.value(slice.outputs[0]).type.shape;
  if (!a.normalized || out.size() != in.shape.size()) return std::nullopt;
  std::vector<int64_t> start(in.shape.size(), 0);
  for (size_t k = 0; k < a.axes.size(); ++k) {
    if (a.steps[k] != 1) return std::nullopt;
    start[size_t(a.axes[k])] = a.starts[k];
  }
  // The first dim the slice cuts; every dim before it must be down to one index, every dim
  // after it whole.
  size_t cut = in.shape.size();
  for (size_t d = 0; d < in.shape.size(); ++d) {
    if (out[d] != in.shape[d]) {
      cut = d;
      break;
    }
  }
  if (cut == in.shape.size()) return std::nullopt;  // the whole input: an identity, not a view
  for (size_t d = 0; d < cut; ++d)
    if (out[d] != 1 && in.shape[d] != 1) return std::nullopt;
  for (size_t d = cut + 1; d < in.shape.size(); ++d)
    if (out[d] != in.shape[d] || start[d] != 0) return std::nullopt;
  const Shape strides = strides_for(in.shape, MemoryFormat::contiguous);
  int64_t offset = 0;
  for (size_t d = 0; d <= cut; ++d) offset += start[d] * strides[d];
  return size_t(offset) * dtype_size(in.dtype);
}

bool transpose_keeps_bytes(const Shape& in_shape, const std::vector<int64_t>& perm,
                           MemoryFormat from, MemoryFormat to) {
  if (perm.size() != in_shape.size()) return false;
  const Shape in_strides = strides_for(in_shape, from);
  Shape shape(perm.size()), strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] < 0 || perm[i] >= int64_t(perm.size())) return false;
    shape[i] = in_shape[size_t(perm[i])];
    strides[i] = in_strides[size_t(perm[i])];
  }
  return is_dense_in(shape, strides, to);
}

std::string LayoutPlan::describe(const Graph& g) const {
  std::ostringstream os;
  os << "layout: " << channels_last_values << " of " << format.size() << " values channels-last ("
     << loads_converted << " inputs/constants converted at load), " << conversions.size()
     << " conversions, " << transpose_views << " transposes copy nothing\n";
  for (const Conversion& c : conversions) {
    os << "  " << g.value(c.value).name << " " << shape_str(g.value(c.value).type.shape) << ": "
       << memory_format_name(c.from) << " -> " << memory_format_name(c.to) << " for "
       << (c.node < 0 ? std::string("the graph output") : node_label(g.node(c.node))) << "\n";
  }
  return os.str();
}

}  // namespace fusebox
