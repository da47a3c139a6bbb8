// Fusion: rewriting a forward graph so that one node does the work of several, which a
// backend then runs as one kernel (one read and one write of an activation instead of two
// of each).
//
// fuse_batch_norm_relu: a batch_norm (either form) whose output 0 is read by exactly one
// node, a relu, and is not a graph output, becomes one batch_norm with relu = true
// (ir/ops.h) that writes the relu's value (name included; the relu node goes). Why: in a
// ResNet 33 of 49 relus follow a batch norm directly, and the relu's separate pass (and,
// in training, its gradient's: batch_norm_backward masks dy by y itself) is a full extra
// read and write of an activation. The fused node computes the same bits as the pair on
// every backend. A batch norm whose output is read elsewhere too (a residual add) or is a
// graph output keeps its own relu.
//
// Run it on the forward graph before autodiff (train/step_graph.cpp does), so that the
// backward pass is derived from the fused node. This is where issue 13's fusion
// partitioning (choosing which chains of ops become one kernel) will live.
#pragma once

#include <cstddef>

#include "fusebox/ir/graph.h"

namespace fusebox {

// Fuses every such batch_norm -> relu pair of `g` in place (the graph is rebuilt: value
// and node ids change, names do not; inputs, constants, outputs and the other nodes stay
// as they were). Returns the number of pairs fused; `g` is untouched when that is 0.
size_t fuse_batch_norm_relu(Graph& g);

// fuse_batch_norm_residual: a batch_norm (either form) whose output 0 is read by exactly one
// node, an add of a value of the same type and shape (no broadcasting), becomes one
// batch_norm with that value as its residual input (ir/ops.h); when the add's output is
// read only by a relu, that too (relu = true). The fused node writes the last replaced
// node's value, in its place in the graph. Why: the end of every residual block, relu(bn(x)
// + identity), is otherwise three passes over an activation (the normalisation, the add, the
// relu): ResNet-50's 16 block ends. Run it before fuse_batch_norm_relu (the step graph
// does). Returns the number fused.
size_t fuse_batch_norm_residual(Graph& g);

}  // namespace fusebox
