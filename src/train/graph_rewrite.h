// Rebuilding a graph node by node with small changes: how the training session turns a
// model into its step and eval graphs. Every value, node and output keeps its name.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "fusebox/ir/graph.h"

namespace fusebox::train {

// What to do with batch_norm nodes.
enum class BatchNormForm : uint8_t {
  keep,
  // Inference nodes become training nodes (5 outputs); the extra outputs get fresh names.
  training,
  // As training, each with BatchNormAttrs::sync (a data-parallel step's synchronized ones).
  synchronized_training,
  // Training nodes become inference nodes; reading a training-only output (running
  // statistics, saved mean / inv std) is then an Error.
  inference,
};

struct RewriteOptions {
  // Constants (by name) that become graph inputs of the same name, dtype and shape,
  // added after the source graph's own inputs, in value-id order.
  std::set<std::string> constants_to_inputs;
  // Constants (by name) that keep their name with these values (same dtype and shape): the
  // trained parameters of an exported model.
  std::map<std::string, Tensor> constant_values;
  BatchNormForm batch_norm = BatchNormForm::keep;
  // The source's nodes in this order (every node once, each after the writers of its inputs);
  // empty: the source's order.
  std::vector<NodeId> node_order;
};

struct RewrittenGraph {
  Graph graph;
  // Source value id -> rewritten value id; kNoValue for outputs that no longer exist
  // (the training outputs of a batch_norm switched to inference form).
  std::vector<ValueId> value_map;
};

// Throws an Error naming the constant or node at fault (an unknown constant name, a
// value read that the rewrite removed).
RewrittenGraph rewrite_graph(const Graph& src, const RewriteOptions& opts);

}  // namespace fusebox::train
