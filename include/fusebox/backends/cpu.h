// The CPU reference backend: the oracle every other backend is tested against.
// Written for exactness and clarity: floats are computed in f64 for f64 tensors
// and in f32 (accumulating in f64 where it costs little) for f32/f16/bf16,
// rounding once to the output dtype.
#pragma once

#include <span>

#include "fusebox/ir/graph.h"

namespace fusebox::dist {
class Communicator;
}

namespace fusebox::cpu {

// Runs one node. `inputs[i]` is nullptr for an absent optional input;
// `outputs` are allocated by the caller with the node's inferred types (their
// contents are garbage: a kernel writes every element). `world`: the data-parallel world
// an all_reduce sums over (null: a world of one).
void run_node(const Graph& g, const Node& n, std::span<const Tensor* const> inputs,
              std::span<Tensor> outputs, dist::Communicator* world = nullptr);

}  // namespace fusebox::cpu
