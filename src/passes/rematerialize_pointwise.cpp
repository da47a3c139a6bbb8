// rematerialize_pointwise (passes/rematerialize.h): each value gets a plan (the elementwise
// chain to copy before its first late reader, and what the leaves' longer lives cost) priced
// against the span the value no longer lives; the plans of a round are applied by one rebuild.
#include "fusebox/passes/rematerialize.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "fusebox/passes/fuse_pointwise.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

constexpr int kMaxRounds = 32;

// The elementwise ops this pass copies, and counts as elementwise readers: the generated
// programs' members but unary_backward, whose values are gradients, computed once where they
// arise (a program member since it fuses with its neighbours; this pass was measured without).
bool is_elementwise(const Graph& g, const Node& n) {
  return n.op != OpKind::unary_backward && is_pointwise_member(g, n);
}

// A training batch_norm whose y (output 0) batch_norm_apply computes again bit for bit: its
// saved statistics are outputs (3 and 4) stored in x's compute type and no residual is fused
// (y would need it too). Synchronized norms are left alone: their y would be as exact (the
// saved statistics are every rank's), but no data-parallel test covers the copy.
bool recomputable_batch_norm(const Graph& g, const Node& n) {
  if (n.op != OpKind::batch_norm || n.outputs.size() < 5) return false;
  const auto& a = std::get<BatchNormAttrs>(n.attrs);
  if (!a.training || a.sync || (n.inputs.size() > 5 && n.inputs[5] != kNoValue)) return false;
  const DType x = g.value(n.inputs[0]).type.dtype, param = g.value(n.inputs[1]).type.dtype;
  return is_floating(x) && param == (x == DType::f64 ? DType::f64 : DType::f32);
}

double bytes(const Graph& g, ValueId v) {
  const TensorType& t = g.value(v).type;
  return double(numel(t.shape)) * double(dtype_size(t.dtype));
}

// The value to compute again, where the copies go and which nodes they copy (in node order,
// the value's producer last).
struct Plan {
  ValueId value = kNoValue;
  NodeId before = -1;
  std::vector<NodeId> chain;
};

class Planner {
 public:
  Planner(const Graph& g, const RematerializeOptions& options)
      : g_(g), options_(options), readers_(g.values().size()), pinned_(g.values().size(), false) {
    for (const Node& n : g.nodes())
      for (ValueId v : n.inputs)
        if (v != kNoValue) readers_[size_t(v)].push_back(n.id);  // ascending: nodes in order
    for (ValueId v : g.inputs()) pinned_[size_t(v)] = true;
    for (ValueId v : g.outputs()) pinned_[size_t(v)] = true;
    for (const auto& [v, tensor] : g.constants()) pinned_[size_t(v)] = true;
  }

  // v: the output of an elementwise op or a recomputable batch norm's y.
  std::optional<Plan> plan(ValueId v) const {
    const std::vector<NodeId>& r = readers_[size_t(v)];
    if (pinned_[size_t(v)] || r.empty()) return std::nullopt;
    // The widest gap between consecutive uses (the producer first): the forward's readers
    // before it, the backward's after.
    NodeId previous = g_.value(v).producer, widest = 0;
    size_t split = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i] - previous > widest) {
        widest = r[i] - previous;
        split = i;
      }
      previous = r[i];
    }
    if (size_t(widest) < options_.min_gap) return std::nullopt;
    Plan plan{.value = v, .before = r[split], .chain = {}};
    const Node& producer = g_.node(g_.value(v).producer);
    if (producer.op == OpKind::batch_norm) return plan_batch_norm(plan, r, split, widest);
    std::set<ValueId> provided;
    const std::optional<double> cost = recompute(v, plan.before, plan.chain, provided);
    if (!cost || *cost >= bytes(g_, v) * double(widest)) return std::nullopt;
    // Copies that a late reader cannot take into its generated kernel (it is not elementwise)
    // are a pass over memory of their own: made for a large widening cast only.
    const bool fused = std::all_of(r.begin() + std::ptrdiff_t(split), r.end(),
                                   [&](NodeId n) { return is_elementwise(g_, g_.node(n)); });
    if (!fused && !large_widening_cast(v, plan)) return std::nullopt;
    std::sort(plan.chain.begin(), plan.chain.end());
    return plan;
  }

 private:
  // A batch norm's y, computed again by batch_norm_apply from x and the saved statistics
  // (which its backward reads, so they are live there anyway): a pass over memory of its own,
  // made where every late reader is elementwise or the norm's own backward (its relu mask),
  // not for a convolution's (wgrad reads the y it also took forward: that is the convolution's
  // input, kept as PyTorch keeps it).
  std::optional<Plan> plan_batch_norm(Plan plan, const std::vector<NodeId>& r, size_t split,
                                      NodeId widest) const {
    const Node& bn = g_.node(g_.value(plan.value).producer);
    // The norm writes y whatever is read: a copy before every reader would be a second y. And
    // one copy per norm, for the backward's readers (the widest gap): the forward's, planned
    // again in a later round across a narrower gap, keep y.
    if (split == 0) return std::nullopt;
    for (NodeId reader : readers_[size_t(bn.outputs[3])])
      if (g_.node(reader).op == OpKind::batch_norm_apply) return std::nullopt;
    for (size_t i = split; i < r.size(); ++i) {
      const Node& reader = g_.node(r[i]);
      if (!is_elementwise(g_, reader) && reader.op != OpKind::batch_norm_backward)
        return std::nullopt;
    }
    double cost = 0;  // the leaves kept alive until the copy
    for (ValueId in : {bn.inputs[0], bn.inputs[1], bn.inputs[2], bn.outputs[3], bn.outputs[4]}) {
      if (live_at(in, plan.before)) continue;
      const std::vector<NodeId>& in_readers = readers_[size_t(in)];
      const NodeId last = in_readers.empty() ? bn.id : in_readers.back();
      cost += bytes(g_, in) * double(plan.before - last);
    }
    if (cost >= bytes(g_, plan.value) * double(widest)) return std::nullopt;
    plan.chain = {bn.id};
    return plan;
  }

  bool large_widening_cast(ValueId v, const Plan& plan) const {
    if (plan.chain.size() != 1) return false;
    const Node& cast = g_.node(plan.chain[0]);
    return cast.op == OpKind::cast && bytes(g_, cast.inputs[0]) < bytes(g_, v) &&
           bytes(g_, v) >= double(options_.min_unfused_bytes);
  }

  bool live_at(ValueId u, NodeId at) const {
    const std::vector<NodeId>& r = readers_[size_t(u)];
    return pinned_[size_t(u)] || (!r.empty() && r.back() >= at);
  }

  // The cost of computing u again before node `at` (its producer's copy added to `chain`, and
  // what its inputs need); none where its producer is not elementwise or the chain is full.
  std::optional<double> recompute(ValueId u, NodeId at, std::vector<NodeId>& chain,
                                  std::set<ValueId>& provided) const {
    const NodeId p = g_.value(u).producer;
    if (p < 0 || !is_elementwise(g_, g_.node(p)) || chain.size() >= options_.max_chain)
      return std::nullopt;
    chain.push_back(p);
    double cost = 0;
    for (ValueId in : g_.node(p).inputs)
      if (provided.insert(in).second) cost += provide(in, at, chain, provided);
    return cost;
  }

  // The cost of having u at node `at`: nothing where it is live there anyway; else the cheaper
  // of keeping it alive until then (its bytes times the span added) and computing it again.
  double provide(ValueId u, NodeId at, std::vector<NodeId>& chain,
                 std::set<ValueId>& provided) const {
    if (live_at(u, at)) return 0;
    const std::vector<NodeId>& r = readers_[size_t(u)];
    const double keep = bytes(g_, u) * double(at - r.back());
    std::vector<NodeId> longer = chain;
    std::set<ValueId> longer_provided = provided;
    const std::optional<double> again = recompute(u, at, longer, longer_provided);
    if (again && *again < keep) {
      chain = std::move(longer);
      provided = std::move(longer_provided);
      return *again;
    }
    return keep;
  }

  const Graph& g_;
  const RematerializeOptions& options_;
  std::vector<std::vector<NodeId>> readers_;  // by value, in node order
  std::vector<bool> pinned_;                  // live through the whole step
};

// The values a plan reads or writes: its value and its copies' inputs and outputs.
std::set<ValueId> touched(const Graph& g, const Plan& plan) {
  std::set<ValueId> t{plan.value};
  for (NodeId c : plan.chain) {
    const Node& n = g.node(c);
    t.insert(n.inputs.begin(), n.inputs.end());
    t.insert(n.outputs.begin(), n.outputs.end());
  }
  return t;
}

// g with each plan's chain copied before its node; its value's readers from there read the copy.
Graph with_copies(const Graph& g, const std::vector<Plan>& plans) {
  std::multimap<NodeId, const Plan*> before;
  for (const Plan& p : plans) before.emplace(p.before, &p);
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    const auto [first, last] = before.equal_range(n.id);
    for (auto it = first; it != last; ++it) {
      const Plan& plan = *it->second;
      std::map<ValueId, ValueId> copy_of;  // a source value -> its copy's new value
      for (NodeId c : plan.chain) {
        const Node& source = g.node(c);
        if (source.op == OpKind::batch_norm) {  // y from x and the saved statistics
          const ValueId out = source.outputs[0];
          BatchNormAttrs a;
          a.relu = std::get<BatchNormAttrs>(source.attrs).relu;
          copy_of[out] = rw.graph().add_node(
              OpKind::batch_norm_apply, a,
              {rw.mapped(source.inputs[0]), rw.mapped(source.inputs[1]),
               rw.mapped(source.inputs[2]), rw.mapped(source.outputs[3]),
               rw.mapped(source.outputs[4])},
              source.name + "/recompute", {rw.fresh_name(g.value(out).name + "/recompute")})[0];
          continue;
        }
        std::vector<ValueId> inputs;
        for (ValueId in : source.inputs) {
          const auto copied = copy_of.find(in);
          inputs.push_back(copied != copy_of.end() ? copied->second : rw.mapped(in));
        }
        const ValueId out = source.outputs[0];
        copy_of[out] = rw.graph().add_node(source.op, source.attrs, std::move(inputs),
                                           source.name + "/recompute",
                                           {rw.fresh_name(g.value(out).name + "/recompute")})[0];
      }
      rw.map(plan.value, copy_of.at(plan.value));
    }
    rw.copy(n);
  }
  return rw.finish();
}

}  // namespace

size_t rematerialize_pointwise(Graph& g, FusionLog* /*log*/, const RematerializeOptions& options) {
  size_t count = 0;
  // Rounds: every value planned against one graph, latest producer first; the plans that
  // touch no value another accepted plan recomputes (nor have theirs touched) are applied in
  // one rebuild, the others planned again in the next round, on the graph with the copies
  // (a HardSwish's gate first, then the sum it starts from, read by the gate's copy). A copy
  // is recomputed again only for readers past another wide gap, so rounds end; the bound is a
  // guard (the graph is whole after every round).
  for (int rounds = 0; rounds < kMaxRounds; ++rounds) {
    const Planner planner(g, options);
    std::vector<Plan> round;
    std::set<ValueId> recomputed, reached;
    for (size_t i = g.nodes().size(); i-- > 0;) {
      const Node& n = g.nodes()[i];
      if (!(is_elementwise(g, n) || recomputable_batch_norm(g, n)) || reached.count(n.outputs[0]))
        continue;
      std::optional<Plan> plan = planner.plan(n.outputs[0]);
      if (!plan) continue;
      const std::set<ValueId> t = touched(g, *plan);
      if (std::any_of(t.begin(), t.end(), [&](ValueId v) { return recomputed.count(v) != 0; }))
        continue;
      recomputed.insert(plan->value);
      reached.insert(t.begin(), t.end());
      round.push_back(std::move(*plan));
    }
    if (round.empty()) break;
    g = with_copies(g, round);
    count += round.size();
  }
  return count;
}

}  // namespace fusebox
