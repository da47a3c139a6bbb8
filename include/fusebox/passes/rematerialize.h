// rematerialize_pointwise: a training step's memory pass. A value that an elementwise op writes
// in the forward pass and the backward pass reads much later is computed again where the
// backward reads it, from values that are live there anyway, instead of being stored across
// the whole gap:
//   forward   s = sigmoid(x); y = x * s            (x is kept: the backward reads it)
//   backward  s' = sigmoid(x); dx = dy * s' + ... (s dies with y's product, not at dx)
// Why: PyTorch's ONNX export spells SiLU as x * sigmoid(x) and HardSwish imports as
// x * clip(x / 6 + 1/2, 0, 1): autodiff of the spelled-out ops saves the gate (and the clip's
// input) beside x, where PyTorch's own silu/hardswish backward saves x alone. EfficientNet-B0's
// step (batch 128, bf16) held 1.5 GiB more than PyTorch eager's on an H200, a 294 MiB sigmoid
// output per expanded block at the peak. A general rule rather than SiLU recognised: any
// elementwise chain whose inputs outlive it is cheaper to recompute than to keep.
//
// The rule, per value v written by a float elementwise op or cast (fuse_pointwise's members),
// latest producer first. v's readers, by node position, split at their widest gap into the
// early ones (the forward's) and the late ones (from L, the first after the gap; the gap at
// least `min_gap` nodes). v is recomputed before L by a copy of its producer, and of the
// elementwise producers behind it, back to leaves: values live at L anyway (read at or after
// L, graph inputs and outputs, constants) cost nothing; any other leaf (a value not written by
// such an op, or past `max_chain` ops) is kept alive from its last reader to L and costs its
// bytes times that span. The copy is made when those costs are below v's bytes times the span
// it no longer lives (its last early reader to L); every late reader then reads the copy.
// Exact: the copies compute the very ops on the very values (elementwise ops are
// deterministic), so the step's results keep their bits.
// A training batch_norm's y is recomputed the same way, by batch_norm_apply from x and the
// saved statistics (bit for bit where those are stored in x's compute type: ir/ops.h), which
// the norm's backward reads anyway: where every late reader of y is elementwise or that
// backward (its relu mask). MobileNetV3's HardSwish backward reads the norm's y, RegNet's
// squeeze-and-excitation backward a relu'd one: each kept across the whole gap had put those
// steps' peaks above PyTorch eager's. The copy is a pass over memory of its own (read x, write
// y), not taken into the readers' kernels. The copies are new nodes (their names
// the originals' + "/recompute") that fuse_pointwise_chains then takes into the backward's
// generated kernels where the late readers are elementwise too; where one is not, the copy
// would run as a kernel of its own, and is made for a large widening cast only.
//
// Training step pipeline (passes/pipeline.h), right after autodiff's own rewrites. Returns the
// number of values recomputed.
#pragma once

#include <cstddef>

#include "fusebox/ir/graph.h"
#include "fusebox/passes/fusion.h"

namespace fusebox {

struct RematerializeOptions {
  size_t min_gap = 8;    // nodes between the early and the late readers, at least
  size_t max_chain = 8;  // elementwise ops recomputed for one value, at most
  // A value some late reader of which is not elementwise (a convolution's backward reading
  // its input, a norm's reading a widened one) cannot have its copies taken into that
  // reader's kernel: they would be a pass over memory of their own. Made only for a widening
  // cast (the narrow value kept in its place: ConvNeXt's layer norms read f32 copies of bf16
  // activations) of at least this many bytes.
  size_t min_unfused_bytes = size_t(16) << 20;
};

size_t rematerialize_pointwise(Graph& g, FusionLog* log = nullptr,
                               const RematerializeOptions& options = {});

}  // namespace fusebox
