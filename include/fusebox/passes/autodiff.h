// Reverse-mode automatic differentiation on the IR.
//
//   Graph g = ...;                                     // forward graph, loss a scalar
//   GradResult r = grad(g, loss, {w1, b1, x});         // appends the backward graph to g
//   ValueId dw1 = r.of(w1);                            // d loss / d w1, shaped like w1
//
// What grad() appends:
//   - The seed d loss / d loss: a constant 1 (expanded to the loss's shape when the loss
//     is not a scalar, i.e. the gradient of sum(loss)), or, with seed_input, a new graph
//     input named "<loss>:grad" of the loss's type that the caller feeds (a VJP).
//   - For every node on a path from some `wrt` to the loss, in reverse order, the
//     backward ops of ops.h (conv_backward_data, batch_norm_backward, ...) and plain
//     ops (mul, reduce_sum, reshape, ...). Nothing else: values that no wrt reaches,
//     or that do not reach the loss, get no gradient ops.
//   - A value used several times gets the sum (add) of its uses' gradients.
//   - Literal numbers (1/count, -1/2, the seed 1, ...) are `constant` NODES, so
//     Graph::constants() still holds exactly the constants that were there before
//     (the model's parameters): a caller may turn those into state.
//
// Rules worth knowing:
//   - Only floating-point values carry gradients. Integer and bool values (labels,
//     max_pool indices, casts to int) stop the gradient; asking for one is an Error.
//   - A wrt that the loss does not depend on gets an all-zero gradient of its own shape
//     (a broadcast constant), never an error.
//   - Gradients through these are refused with an Error naming the node, because the
//     IR has no op for them: any backward op and the optimizer updates (second order),
//     batch_norm's running / saved statistics outputs, layer_norm's mean / inv_std_dev
//     and rms_norm's inv_rms outputs, and cross_entropy's class weights. The error is
//     raised only when the gradient actually has to flow there, i.e. some wrt reaches
//     the node and the node's output reaches the loss.
//   - Each gradient value is named "<wrt>:grad" when that name is free.
//
// Training: pass the parameters (graph constants) as wrt, with the scalar loss; the
// returned gradients are ordinary values that optimizer update nodes can read.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fusebox/ir/graph.h"

namespace fusebox {

struct GradOptions {
  // false: the seed is a constant 1 (of the loss's shape). true: the seed is a new graph
  // input "<loss>:grad" with the loss's dtype and shape.
  bool seed_input = false;
  // Marks every returned gradient as a graph output (in wrt order).
  bool mark_outputs = false;
  // Backward node names are "<name_prefix>/<forward node>/<part>".
  std::string name_prefix = "grad";
};

struct GradResult {
  // wrt value -> its gradient (same dtype and shape as the wrt value).
  std::map<ValueId, ValueId> grads;
  // The seed value (a graph input with seed_input, else a constant node's output).
  ValueId seed = kNoValue;
  // The gradient of `wrt`; an Error when wrt was not asked for.
  ValueId of(ValueId wrt) const;
};

// Appends to `g` the gradient of `loss` (any float value) with respect to each of `wrt`
// (graph inputs, constants or intermediate float values) and returns their ids. Throws
// an Error (naming the node or value) for a non-float loss or wrt, an unknown id, or a
// gradient the IR cannot express (see above). On error `g` may hold part of the
// backward graph; the caller should discard it.
GradResult grad(Graph& g, ValueId loss, const std::vector<ValueId>& wrt,
                const GradOptions& opts = {});

}  // namespace fusebox
