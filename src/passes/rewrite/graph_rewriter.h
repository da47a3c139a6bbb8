// Rebuilding a graph node by node with changes: the one rebuilder of the graph passes (the
// fusions' takeovers and expansions, passes/fusion/fusion_rewrite.h; mixed precision's casts)
// and of the training session's graphs (train/graph_rewrite.h). Graph only appends, so a pass
// that replaces, drops or reorders nodes builds a new graph: the source's inputs first, then
// the nodes as the pass emits them, reading the new values the source's values map to, then
// the source's outputs. Names are kept unless the pass gives others.
//
// Autodiff's Emitter (passes/autodiff/vjp.h) is another job: it appends the backward ops to
// the graph being differentiated, which it never rebuilds.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fusebox/ir/graph.h"

namespace fusebox {

class GraphRewriter {
 public:
  // Starts the new graph (the source's name) with the source's inputs. `source` must outlive
  // the rewriter; it may be the graph finish() replaces.
  explicit GraphRewriter(const Graph& source);

  const Graph& source() const { return src_; }
  // The graph being built: a pass adds nodes of its own to it.
  Graph& graph() { return out_; }

  // The new value of a source value: kNoValue for kNoValue; a source constant read for the
  // first time is copied (its name kept). An Error for any other value not mapped yet.
  ValueId mapped(ValueId source_value);
  // The new value mapped so far (kNoValue: none yet; constants are not copied).
  ValueId lookup(ValueId source_value) const { return map_[size_t(source_value)]; }
  // Maps a source value to a new value (kNoValue: to none, e.g. read only by removed nodes).
  void map(ValueId source_value, ValueId new_value) { map_[size_t(source_value)] = new_value; }
  const std::vector<ValueId>& value_map() const { return map_; }

  // Adds a node in `source_node`'s place reading `inputs` (new values) and maps the source
  // node's outputs to its outputs by position (those only one of them has stay unmapped).
  std::vector<ValueId> emit(const Node& source_node, OpKind op, Attrs attrs,
                            std::vector<ValueId> inputs, const std::vector<std::string>& names);
  // `n` as it is (op, attributes, node and output names), reading its inputs' new values.
  std::vector<ValueId> copy(const Node& n);
  // The names of a source node's outputs.
  std::vector<std::string> output_names(const Node& n) const;

  // A value name neither graph has: `base`, else base_1, base_2, ...
  std::string fresh_name(const std::string& base) const;

  // Marks the source's outputs, each as `output` gives it (default: mapped()), and returns
  // the new graph; the rewriter is spent.
  Graph finish(const std::function<ValueId(ValueId)>& output = {});

 private:
  const Graph& src_;
  Graph out_;
  std::vector<ValueId> map_;  // source value -> new value
};

}  // namespace fusebox
