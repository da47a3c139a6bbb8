// The rewrite the fusion passes share (passes/fusion/): a node takes over nodes after it (an
// activation, an add) and is emitted where the last of them was, writing the last one's value
// (name included), with new attributes and inputs. Graph only appends, so the graph is rebuilt
// node by node (passes/rewrite/graph_rewriter.h).
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/ir/graph.h"
#include "fusebox/passes/fusion.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox::fusion {

// Who reads each value.
struct Readers {
  std::vector<std::vector<NodeId>> of;  // by value
  std::set<ValueId> outputs;

  explicit Readers(const Graph& g)
      : of(g.values().size()), outputs(g.outputs().begin(), g.outputs().end()) {
    for (const Node& n : g.nodes())
      for (ValueId v : n.inputs)
        if (v != kNoValue) of[size_t(v)].push_back(n.id);
  }
  // The one node reading v, when v is read by exactly one node and is not a graph output.
  NodeId only_reader(ValueId v) const {
    return of[size_t(v)].size() == 1 && !outputs.count(v) ? of[size_t(v)][0] : NodeId(-1);
  }
};

// What one node takes over.
struct Takeover {
  std::vector<NodeId> replaced;  // in node order; the last is where the fused node goes
  ValueId writes = kNoValue;     // the value its output 0 becomes (the last node's)
  Attrs attrs;                   // the fused node's attributes
  std::vector<std::pair<size_t, ValueId>> inputs;  // (input slot, value) set or added
  std::optional<OpKind> op;                        // the fused node's op, when not the node's
};

// A takeover grown from one node along single readers (the conv and gemm epilogues):
// next() is the one reader of the value written so far, unless an earlier takeover took it;
// take() adds a node and the op text the FusionLog records.
struct Chain {
  const Graph& g;
  const Readers& readers;
  const std::vector<bool>& taken;  // by node
  Takeover& t;
  std::vector<std::string>& ops;

  const Node* next() const {
    const NodeId n = readers.only_reader(t.writes);
    return n >= 0 && !taken[size_t(n)] ? &g.node(n) : nullptr;
  }
  void take(const Node& n);
};

// Rebuilds g with the takeovers (indexed by node id; empty `replaced`: none; the node
// itself keeps its place when `replaced` is {its own id}). Constants nothing reads any more
// (a weight replaced by its folded copy, added to g as a constant before) are dropped.
void rebuild(Graph& g, const std::vector<Takeover>& takeover);

// A rewrite that puts nodes of its own in a node's place (form_linears, the split of a key
// transpose): given the node and the rewriter (its graph, the map from g's values to it), it
// either emits what replaces the node and returns the values its outputs become (kNoValue for
// an output nothing reads any more), or returns nothing, and the node is copied as it is.
using Expansion =
    std::function<std::optional<std::vector<ValueId>>(const Node& n, GraphRewriter& r)>;
// Rebuilds g node by node with `expand` (names of inputs, outputs and copied nodes kept;
// constants on first use, the unread ones dropped).
void rebuild_expanding(Graph& g, const Expansion& expand);

using fusebox::activation_of;  // passes/fusion.h

// The tensor behind v: a graph constant or a constant node's value; null for any other value.
const Tensor* known_tensor(const Graph& g, ValueId v);

// "relu 'layer1.0.relu'": an op of a group, as FusionLog records it.
std::string op_text(const Node& n);

}  // namespace fusebox::fusion
