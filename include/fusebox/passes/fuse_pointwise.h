// fuse_pointwise_chains: groups of elementwise ops become one fused_pointwise node (ir/ops.h),
// which the CUDA backend runs as one generated kernel (kernels/pointwise/fused.cu): every
// input read once, the output written once, the intermediates never stored. Why: a chain of
// k pointwise ops unfused reads and writes an activation k times (x*a+b, gelu, *c, +d, relu:
// five passes), and on a GPU those passes are the whole cost.
//
// A group is a maximal connected set of nodes, each a float unary pointwise op (relu ..
// clip), a float binary one (add .. pow, a pow's exponent float too), a cast between float
// dtypes or an activation's gradient (unary_backward of relu, leaky_relu, gelu, silu, sigmoid
// or tanh: ir/pointwise_program.h is_program_derivative), such that:
//   - it has one output: every value a member writes, except the group's output (the last
//     member's), is read only by members and is not a graph output;
//   - it has >= 2 ops, or one op that broadcasts an input (a squeeze-and-excitation scale
//     [N, C, 1, 1] over x, Swin's window mask): the generated kernel walks a broadcast
//     operand by its own strides where the op's own kernel indexes every operand through
//     an N-d division per element (RegNetY's 27 scale muls: 3.6 ms of a 34 ms step on an
//     H200);
//   - it reads at most 16 values from outside (kMaxPointwiseInputs);
//   - every value it reads or writes broadcasts to the output's shape (always so for
//     elementwise ops; no reductions, which are not members).
// Groups grow backwards from their output, taking a producer when all of its value's readers
// are members, until nothing more can join (or 16 inputs are reached). A producer does not
// join where that would keep a large value (>= 64 MiB) it reads alive more than 2 nodes past
// its last reader outside the group, and no member reads it already: the group computes it
// at its output's place, so its inputs live until there. A gradient sum's adds, one per branch of a
// layer read by many (DeepLabV3's ASPP head: five 256 MiB gradients), as one kernel held every
// branch's gradient at once where the adds alone hold one running sum. The fused node takes the
// output's place in the graph, writes the output's value (its name kept) and is named after the
// output's node; its inputs are the values the group reads, in the order the program first reads
// them. Other nodes, inputs, constants and outputs stay as they were.
//
// Run it after the fusions that take pointwise ops into other nodes (passes/fusion.h: a
// batch norm's relu, a convolution's epilogue), so it leaves those alone; the ops they
// consumed are no longer in the graph, and every node they formed (batch_norm, conv) is not
// pointwise. A graph is fused once: the fused_pointwise nodes a previous run formed do not
// join new groups.
//
// Inference only: fused_pointwise has no gradient rule, so run it on graphs that will not be
// differentiated (an inference graph, or a training step after autodiff built its backward
// pass). In a step, the gradient terms of an activation are summed in one kernel with their
// elementwise neighbours (silu's two terms, a gradient sum and an activation's gradient); a
// residual batch norm's block-output sum and relu mask are not left to it: the norm's backward
// takes them (passes/fusion.h fold_gradient_sums, autodiff's dy_output).
#pragma once

#include <cstddef>

#include "fusebox/ir/graph.h"
#include "fusebox/passes/fusion.h"

namespace fusebox {

// Replaces every group of `g` (rebuilt in place: value and node ids change, names do not) by
// one fused_pointwise node, each recorded in `log` when given. Returns the number of groups;
// `g` is untouched when that is 0.
size_t fuse_pointwise_chains(Graph& g, FusionLog* log = nullptr);

// Whether node `n` of `g` may be a member of a group: a unary or binary pointwise op, a cast or
// an activation's unary_backward (is_pointwise_instr_node), on float values only (pow's
// exponent included; an integer one stays an unfused pow), one output; not a fused_pointwise
// node.
bool is_pointwise_member(const Graph& g, const Node& n);

}  // namespace fusebox
