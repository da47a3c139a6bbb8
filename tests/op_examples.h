// A valid node of every op on tiny inputs, from one switch over OpKind: the op coverage
// tests run each on the backends (tests/unit/ops/test_op_coverage.cpp) and with a dim set to 0
// (test_op_empty.cpp), the shape arithmetic property test scales its dims towards 2^63
// (tests/unit/ir/shape_arithmetic_test.cpp).
#pragma once

#include <optional>
#include <vector>

#include "testing.h"

namespace fusebox::testing {

// One node's attributes and inputs (an undefined tensor is an absent optional input).
struct OpExample {
  Attrs attrs;
  std::vector<Tensor> inputs;
};

// A valid node of `op` on tiny inputs; inputs that must match a forward op's outputs
// (a backward op's y, saved statistics, ...) are computed by that forward op on the CPU.
// nullopt for an op with no example yet (the op coverage test fails then).
std::optional<OpExample> tiny_example(OpKind op);

// The example as a one-node graph (inputs "in<i>", the node "node", every output marked)
// and its feeds. add_node's inference errors propagate.
struct OneNodeGraph {
  Graph graph{"op_coverage"};
  std::vector<ValueId> inputs;  // kNoValue for an absent optional input
  std::vector<ValueId> outputs;
  NamedTensors feeds;
};
OneNodeGraph build(OpKind op, const OpExample& example);

// Every op of the op table (fusebox/ir/op_info.h), in its order: the parameters of the
// every-op test suites.
std::vector<OpKind> every_op();

}  // namespace fusebox::testing
