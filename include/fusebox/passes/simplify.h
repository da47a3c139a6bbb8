// Simplification: rewrites that leave a graph computing the same values with less work,
// before any fusion sees it.
//
// remove_identity_ops: a node that leaves its input as it is goes, its readers reading that
// input: a pad by zeros (any mode), a slice of every element in order (steps 1, the input's
// shape), a transpose by the identity, a reshape, flatten, squeeze, unsqueeze or expand to the
// input's own shape, a cast to the input's own dtype, a concat of one input, an identity op.
// Exact: the readers get the very values the node would have copied. A node whose output is
// a graph output stays (the output keeps its name). Why: exporters write these where the
// sizes happen to need nothing (Swin-T pads each stage to a multiple of its window and
// crops back, by zeros at 224x224: 15 pads and their crops copying 1.9 ms of a 24 ms step on
// an H200), and every one was a copy. Returns the number of nodes removed.
#pragma once

#include <cstddef>

#include "fusebox/ir/graph.h"
#include "fusebox/passes/fusion.h"

namespace fusebox {

size_t remove_identity_ops(Graph& g, FusionLog* log = nullptr);

// Whether node `n` of `g` leaves its input as it is (the rules above, graph outputs aside).
bool is_identity_op(const Graph& g, const Node& n);

}  // namespace fusebox
