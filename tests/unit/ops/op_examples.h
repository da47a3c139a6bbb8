// The tiny examples of every OpKind that the op tests share (test_op_coverage.cpp runs
// them as they are, test_op_empty.cpp with a dimension set to 0): a valid node of each op
// on tiny inputs, and the one-node graph that runs it.
#pragma once

#include <optional>
#include <vector>

#include "testing.h"

namespace fusebox::testing {

// One node's attributes and inputs (an undefined tensor is an absent optional input).
struct Example {
  Attrs attrs;
  std::vector<Tensor> inputs;
};

// A valid node of `op` on tiny inputs; inputs that must match a forward op's outputs
// (a backward op's y, saved statistics, ...) are computed by that forward op on the CPU.
// std::nullopt for an op that has no example yet (the coverage test fails on it).
std::optional<Example> tiny_example(OpKind op);

// The example as a one-node graph (inputs "in<i>", the node "node", every output marked)
// and its feeds. add_node's inference errors propagate.
struct OneNodeGraph {
  Graph graph{"op_coverage"};
  std::vector<ValueId> inputs;  // kNoValue for an absent optional input
  std::vector<ValueId> outputs;
  NamedTensors feeds;
};
OneNodeGraph build(OpKind op, const Example& example);

// Every OpKind, in the op table's order.
std::vector<OpKind> every_op();

}  // namespace fusebox::testing
