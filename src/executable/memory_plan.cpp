#include "executable/memory_plan.h"

#include <algorithm>
#include <numeric>

#include "fusebox/ir/op_info.h"

namespace fusebox::runtime {

Liveness liveness(const Graph& g) {
  Liveness life;
  life.first.assign(g.values().size(), -1);
  life.last.assign(g.values().size(), -1);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    for (ValueId v : n.inputs)
      if (v != kNoValue) life.last[size_t(v)] = int(i);
    for (ValueId v : n.outputs) life.first[size_t(v)] = int(i);
  }
  // A collective runs beside the nodes after it (all_reduce, ops.h): its inputs are kept to
  // the step's end, so that no later node writes their bytes and waits for it.
  const int last_node = int(g.nodes().size()) - 1;
  for (const Node& n : g.nodes())
    if (op_info(n.op).family == OpFamily::collective)
      for (ValueId v : n.inputs)
        if (v != kNoValue) life.last[size_t(v)] = std::max(life.last[size_t(v)], last_node);
  for (ValueId v : g.outputs()) life.last[size_t(v)] = Liveness::kAfterLastNode;
  return life;
}

namespace {

size_t aligned(size_t bytes) {
  return (bytes + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
}

// [begin, end] in node indices; a value nobody reads lives at its writer only.
struct Interval {
  int begin, end;
  bool overlaps(const Interval& o) const { return begin <= o.end && o.begin <= end; }
};

}  // namespace

MemoryPlan plan_memory(const Graph& g, const Liveness& life, const std::vector<size_t>& bytes,
                       bool reuse, const std::vector<ValueId>& same_bytes,
                       const std::vector<size_t>& view_offset) {
  const size_t count = g.values().size();
  MemoryPlan plan;
  plan.offset.assign(count, MemoryPlan::kNotPlanned);
  // Each value's root: the value whose bytes it is, through chains of views, and where in the
  // root's bytes it starts.
  std::vector<ValueId> root(count);
  std::vector<size_t> into_root(count, 0);
  for (size_t v = 0; v < count; ++v) {
    ValueId r = ValueId(v);
    while (!same_bytes.empty() && same_bytes[size_t(r)] != kNoValue) {
      if (!view_offset.empty()) into_root[v] += view_offset[size_t(r)];
      r = same_bytes[size_t(r)];
    }
    root[v] = r;
  }
  std::vector<ValueId> values;  // the roots: placed
  std::vector<Interval> when(count);
  for (size_t v = 0; v < count; ++v) {
    if (bytes[v] == 0 || root[v] != ValueId(v)) continue;
    values.push_back(ValueId(v));
    when[v] = {life.first[v], std::max(life.first[v], life.last[v])};
    plan.unshared_bytes += aligned(bytes[v]);
  }
  for (size_t v = 0; v < count; ++v) {  // a root lives as long as its views
    if (bytes[v] == 0 || root[v] == ValueId(v)) continue;
    FUSEBOX_CHECK(bytes[size_t(root[v])] >= into_root[v] + bytes[v], "plan_memory", "value ", v,
                  " is a view of value ", root[v], " at byte ", into_root[v],
                  ", which is not planned or smaller");
    Interval& r = when[size_t(root[v])];
    r.begin = std::min(r.begin, life.first[v]);
    r.end = std::max({r.end, life.first[v], life.last[v]});
  }
  plan.held_from.assign(count, 0);
  plan.held_to.assign(count, -1);
  for (size_t v = 0; v < count; ++v) {
    if (bytes[v] == 0) continue;
    const bool is_root = root[v] == ValueId(v);
    plan.held_from[v] = is_root ? when[v].begin : life.first[v];
    plan.held_to[v] = is_root ? when[v].end : std::max(life.first[v], life.last[v]);
  }
  if (values.empty()) return plan;

  // Largest first; ties in node order, so the plan does not depend on the sort's whims.
  std::stable_sort(values.begin(), values.end(),
                   [&](ValueId a, ValueId b) { return bytes[size_t(a)] > bytes[size_t(b)]; });
  plan.largest = values.front();

  if (!reuse) {
    for (ValueId v : values) {
      plan.offset[size_t(v)] = plan.arena_bytes;
      plan.arena_bytes += aligned(bytes[size_t(v)]);
    }
  } else {
    std::vector<ValueId> placed;
    std::vector<std::pair<size_t, size_t>> taken;  // [begin, end) of overlapping placed values
    for (ValueId v : values) {
      const size_t size = aligned(bytes[size_t(v)]);
      taken.clear();
      for (ValueId p : placed) {
        if (!when[size_t(v)].overlaps(when[size_t(p)])) continue;
        taken.emplace_back(plan.offset[size_t(p)],
                           plan.offset[size_t(p)] + aligned(bytes[size_t(p)]));
      }
      std::sort(taken.begin(), taken.end());
      size_t offset = 0;  // the lowest gap that fits
      for (const auto& [begin, end] : taken) {
        if (begin >= offset + size) break;
        offset = std::max(offset, end);
      }
      plan.offset[size_t(v)] = offset;
      plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
      placed.push_back(v);
    }
  }

  for (size_t v = 0; v < count; ++v)
    if (bytes[v] > 0 && root[v] != ValueId(v))
      plan.offset[v] = plan.offset[size_t(root[v])] + into_root[v];

  // The lower bound: bytes live at each node.
  std::vector<size_t> live(g.nodes().size() + 1, 0);
  for (ValueId v : values) {
    const Interval& t = when[size_t(v)];
    const int end = std::min<int>(t.end, int(g.nodes().size()));
    for (int i = std::max(t.begin, 0); i <= end; ++i) live[size_t(i)] += aligned(bytes[size_t(v)]);
  }
  const auto peak = std::max_element(live.begin(), live.end());
  plan.peak_live_bytes = *peak;
  plan.peak_node = int(peak - live.begin());
  for (ValueId v : values)  // largest first already
    if (when[size_t(v)].begin <= plan.peak_node && plan.peak_node <= when[size_t(v)].end)
      plan.peak_values.push_back(v);
  return plan;
}

std::vector<Gap> free_gaps(const Graph& g, const std::vector<size_t>& bytes,
                           const MemoryPlan& plan) {
  const int nodes = int(g.nodes().size());
  // The placed values live at each node, as byte intervals.
  std::vector<std::vector<std::pair<size_t, size_t>>> taken(static_cast<size_t>(nodes));
  for (size_t v = 0; v < plan.offset.size(); ++v) {
    if (plan.offset[v] == MemoryPlan::kNotPlanned || bytes[v] == 0) continue;
    const int begin = std::max(plan.held_from[v], 0);
    const int end = std::min(std::max(plan.held_from[v], plan.held_to[v]), nodes - 1);
    for (int i = begin; i <= end; ++i)
      taken[size_t(i)].emplace_back(plan.offset[v], plan.offset[v] + aligned(bytes[v]));
  }
  std::vector<Gap> gaps(static_cast<size_t>(nodes));
  for (int i = 0; i < nodes; ++i) {
    auto& t = taken[size_t(i)];
    std::sort(t.begin(), t.end());
    size_t free_from = 0;
    Gap& best = gaps[size_t(i)];
    auto consider = [&](size_t end) {
      if (end > free_from && end - free_from > best.bytes) best = {free_from, end - free_from};
    };
    for (const auto& [begin, end] : t) {
      consider(begin);
      free_from = std::max(free_from, end);
    }
    consider(plan.arena_bytes);
  }
  return gaps;
}

std::vector<ValueId> elementwise_in_place(const Graph& g, const Liveness& life,
                                          const std::vector<size_t>& bytes,
                                          const InPlaceCandidates& c) {
  const size_t count = g.values().size();
  auto tensor_bytes = [&](ValueId v) {
    const TensorType& t = g.value(v).type;
    return size_t(numel(t.shape)) * dtype_size(t.dtype);
  };
  // The last node that reads a holder's bytes, through it or any view of it.
  std::vector<int> held_to(count, -1);
  for (size_t v = 0; v < count; ++v)
    if (c.holder[v] != kNoValue)
      held_to[size_t(c.holder[v])] = std::max(held_to[size_t(c.holder[v])], life.last[v]);
  std::vector<ValueId> in(count, kNoValue);
  std::vector<bool> reused(count, false);  // a holder whose bytes an output took
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const OpFamily family = op_info(n.op).family;
    if (n.outputs.size() != 1 ||
        (family != OpFamily::unary && family != OpFamily::binary && family != OpFamily::pointwise))
      continue;
    const ValueId out = n.outputs[0];
    if (c.holder[size_t(out)] != out || c.order[size_t(out)] < 0) continue;
    const TensorType& t = g.value(out).type;
    for (ValueId u : n.inputs) {
      if (u == kNoValue || c.holder[size_t(u)] == kNoValue) continue;
      const ValueId h = c.holder[size_t(u)];
      const TensorType& ut = g.value(u).type;
      if (reused[size_t(h)] || held_to[size_t(h)] != int(i) || ut.dtype != t.dtype ||
          ut.shape != t.shape || c.order[size_t(u)] != c.order[size_t(out)] ||
          bytes[size_t(h)] != tensor_bytes(out))
        continue;
      // Every operand in h's bytes read element for element as the output is written.
      bool aligned = true;
      for (ValueId w : n.inputs)
        if (w != kNoValue && c.holder[size_t(w)] == h)
          aligned = aligned && c.order[size_t(w)] == c.order[size_t(out)] &&
                    g.value(w).type.shape == t.shape && g.value(w).type.dtype == t.dtype;
      if (!aligned) continue;
      in[size_t(out)] = h;
      reused[size_t(h)] = true;
      break;
    }
  }
  return in;
}

void note_peak(const Graph& g, const MemoryPlan& plan, const std::vector<size_t>& bytes,
               ExecutableStats& stats) {
  constexpr size_t kNamed = 8;
  const bool at_a_node = plan.peak_node >= 0 && size_t(plan.peak_node) < g.nodes().size();
  stats.peak_node = at_a_node ? g.nodes()[size_t(plan.peak_node)].name : "";
  stats.peak_values.clear();
  for (ValueId v : plan.peak_values) {
    if (stats.peak_values.size() == kNamed) break;
    stats.peak_values.emplace_back(g.value(v).name, bytes[size_t(v)]);
  }
}

}  // namespace fusebox::runtime
