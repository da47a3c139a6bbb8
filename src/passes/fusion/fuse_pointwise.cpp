// fuse_pointwise_chains (passes/fuse_pointwise.h): find the groups, write each as a
// program, rebuild the graph with one fused_pointwise node per group.
#include "fusebox/passes/fuse_pointwise.h"

#include <algorithm>
#include <set>
#include <vector>

#include "fusebox/ir/pointwise_program.h"
#include "fusion_rewrite.h"

namespace fusebox {

bool is_pointwise_member(const Graph& g, const Node& n) {
  if (n.op == OpKind::fused_pointwise || !is_pointwise_instr_node(n)) return false;
  for (ValueId v : n.inputs)
    if (v == kNoValue || !is_floating(g.value(v).type.dtype)) return false;
  return n.outputs.size() == 1 && is_floating(g.value(n.outputs[0]).type.dtype);
}

namespace {

// fuse_pointwise.h: a producer joins only where no large value it reads lives longer by more
// than this many nodes.
constexpr NodeId kMaxDeferral = 2;
constexpr size_t kDeferredBytes = size_t(64) << 20;

bool broadcasts_to(const Shape& s, const Shape& to) {
  Shape b;
  return broadcast_shapes(s, to, &b) && b == to;
}

struct Group {
  std::vector<NodeId> members;  // in node order; the last writes the group's output
  std::vector<ValueId> inputs;  // the values it reads from outside, in first-read order
  PointwiseProgram program;
};

class Finder {
 public:
  explicit Finder(const Graph& g)
      : g_(g),
        readers_(g.values().size()),
        group_of_(g.nodes().size(), -1),
        fusible_(g.nodes().size(), false) {
    for (const Node& n : g.nodes()) {
      fusible_[size_t(n.id)] = is_pointwise_member(g, n);
      for (ValueId v : n.inputs)
        if (v != kNoValue) readers_[size_t(v)].push_back(n.id);
    }
    for (ValueId v : g.outputs()) graph_outputs_.insert(v);
    for (ValueId v : g.inputs()) graph_inputs_.insert(v);
  }

  std::vector<Group> groups() {
    std::vector<Group> found;
    for (size_t i = g_.nodes().size(); i-- > 0;) {
      if (!fusible_[i] || group_of_[i] >= 0) continue;
      std::vector<NodeId> members = grow(NodeId(i));
      if (members.size() < 2 && !broadcasts_an_input(members.front())) continue;
      for (NodeId m : members) group_of_[size_t(m)] = int(found.size());
      found.push_back(program_of(std::move(members)));
    }
    return found;
  }

  const std::vector<int>& group_of() const { return group_of_; }

  // Whether node n reads a value of another shape than its output's (header: a lone op
  // that broadcasts is a group).
  bool broadcasts_an_input(NodeId n) const {
    const Node& node = g_.node(n);
    const Shape& out = g_.value(node.outputs[0]).type.shape;
    for (ValueId v : node.inputs)
      if (g_.value(v).type.shape != out) return true;
    return false;
  }

 private:
  // Whether node p joining the group of `sink` would keep u, a large value p reads, alive more
  // than kMaxDeferral nodes past its last reader outside the group (p included).
  bool deferred_too_long(ValueId u, NodeId p, const std::set<NodeId>& members, NodeId sink) const {
    // Inputs, outputs and constants live through the whole graph: nothing to extend.
    if (sink - p <= kMaxDeferral || g_.is_constant(u) || graph_inputs_.count(u) ||
        graph_outputs_.count(u))
      return false;
    const TensorType& t = g_.value(u).type;
    if (size_t(numel(t.shape)) * dtype_size(t.dtype) < kDeferredBytes) return false;
    NodeId last = p;
    for (NodeId r : readers_[size_t(u)]) {
      // A member reads u already: u lives to the group's place whether p joins or not
      // (HardSwish's x * gate(x): the gate's scale of x joins the product of x).
      if (members.count(r)) return false;
      last = std::max(last, r);
    }
    // u read by p and the group alone, from a producer that may join too: computed in the
    // group then (that producer's inputs checked when it joins).
    const NodeId q = g_.value(u).producer;
    if (last == p && q >= 0 && fusible_[size_t(q)] && group_of_[size_t(q)] < 0) return false;
    return sink - last > kMaxDeferral;
  }

  // The values members read that no member writes.
  std::set<ValueId> inputs_of(const std::set<NodeId>& members) const {
    std::set<ValueId> in;
    for (NodeId m : members)
      for (ValueId v : g_.node(m).inputs)
        if (!members.count(g_.value(v).producer)) in.insert(v);
    return in;
  }

  // Whether the producer of `v` may join `members` (whose output has shape `out`, written by
  // node `sink`).
  bool may_join(ValueId v, const std::set<NodeId>& members, const Shape& out, NodeId sink) const {
    const NodeId p = g_.value(v).producer;
    if (p < 0 || !fusible_[size_t(p)] || group_of_[size_t(p)] >= 0 || members.count(p))
      return false;
    if (graph_outputs_.count(v)) return false;
    for (NodeId r : readers_[size_t(v)])
      if (!members.count(r)) return false;
    for (ValueId u : g_.node(p).inputs)
      if (!broadcasts_to(g_.value(u).type.shape, out) || deferred_too_long(u, p, members, sink))
        return false;
    std::set<NodeId> with = members;
    with.insert(p);
    return inputs_of(with).size() <= size_t(kMaxPointwiseInputs);
  }

  // The group whose output `sink` writes, grown backwards until nothing more may join.
  std::vector<NodeId> grow(NodeId sink) const {
    const Shape& out = g_.value(g_.node(sink).outputs[0]).type.shape;
    std::set<NodeId> members{sink};
    for (ValueId u : g_.node(sink).inputs)
      if (!broadcasts_to(g_.value(u).type.shape, out)) return {sink};
    if (inputs_of(members).size() > size_t(kMaxPointwiseInputs)) return {sink};
    for (bool grew = true; grew;) {
      grew = false;
      for (ValueId v : inputs_of(members)) {
        if (!may_join(v, members, out, sink)) continue;
        members.insert(g_.value(v).producer);
        grew = true;
        break;  // inputs changed: look again
      }
    }
    return {members.begin(), members.end()};  // ascending ids: node order
  }

  Group program_of(std::vector<NodeId> members) const {
    Group group;
    group.members = std::move(members);
    std::vector<int32_t> index(g_.values().size(), -1);  // value -> operand index
    std::vector<PointwiseInstr> instrs;
    std::vector<std::pair<ValueId, size_t>> results;  // (value, instruction)
    for (NodeId m : group.members) {
      const Node& n = g_.node(m);
      std::vector<int32_t> operands;
      for (ValueId v : n.inputs) {
        if (g_.value(v).producer >= 0 &&
            std::binary_search(group.members.begin(), group.members.end(), g_.value(v).producer)) {
          operands.push_back(-1 - index[size_t(v)]);  // instruction, numbered below
          continue;
        }
        if (index[size_t(v)] < 0) {
          index[size_t(v)] = int32_t(group.inputs.size());
          group.inputs.push_back(v);
        }
        operands.push_back(index[size_t(v)]);
      }
      index[size_t(n.outputs[0])] = int32_t(instrs.size());
      instrs.push_back(pointwise_instr(n, std::move(operands)));
    }
    // Instruction operands were written as -1 - j; they follow the k inputs.
    const auto k = int32_t(group.inputs.size());
    for (PointwiseInstr& ins : instrs)
      for (int32_t& o : ins.operands)
        if (o < 0) o = k + (-1 - o);
    group.program.inputs = k;
    group.program.instrs = std::move(instrs);
    return group;
  }

  const Graph& g_;
  std::vector<std::vector<NodeId>> readers_;  // by value
  std::set<ValueId> graph_outputs_, graph_inputs_;
  std::vector<int> group_of_;  // by node: the group it joined, -1 for none
  std::vector<bool> fusible_;
};

}  // namespace

size_t fuse_pointwise_chains(Graph& g, FusionLog* log) {
  Finder finder(g);
  const std::vector<Group> groups = finder.groups();
  if (groups.empty()) return 0;
  if (log != nullptr) {
    for (const Group& group : groups) {
      std::vector<std::string> ops;
      for (NodeId m : group.members) ops.push_back(fusion::op_text(g.node(m)));
      log->add(g.node(group.members.back()).name, ops);
    }
  }
  const std::vector<int>& group_of = finder.group_of();

  Graph out(g.name());
  std::vector<ValueId> map(g.values().size(), kNoValue);
  for (ValueId v : g.inputs()) {
    const Value& value = g.value(v);
    map[size_t(v)] = out.add_input(value.name, value.type.dtype, value.type.shape);
  }
  auto mapped = [&](ValueId v) {  // constants are added where first read
    if (v != kNoValue && map[size_t(v)] == kNoValue && g.is_constant(v))
      map[size_t(v)] = out.add_constant(g.value(v).name, *g.constant(v));
    return v == kNoValue ? kNoValue : map[size_t(v)];
  };
  for (const Node& n : g.nodes()) {
    const int gi = group_of[size_t(n.id)];
    if (gi >= 0 && groups[size_t(gi)].members.back() != n.id) continue;  // inside the program
    std::vector<ValueId> inputs;
    for (ValueId v : gi >= 0 ? groups[size_t(gi)].inputs : n.inputs) inputs.push_back(mapped(v));
    std::vector<std::string> names;
    for (ValueId v : n.outputs) names.push_back(g.value(v).name);
    const std::vector<ValueId> outs =
        gi >= 0 ? out.add_node(OpKind::fused_pointwise, groups[size_t(gi)].program,
                               std::move(inputs), n.name, names)
                : out.add_node(n.op, n.attrs, std::move(inputs), n.name, names);
    for (size_t i = 0; i < outs.size(); ++i) map[size_t(n.outputs[i])] = outs[i];
  }
  for (ValueId v : g.outputs()) out.mark_output(mapped(v));
  g = std::move(out);
  return groups.size();
}

}  // namespace fusebox
