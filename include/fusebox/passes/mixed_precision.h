// Mixed precision as a graph rewrite: PyTorch autocast's rules (torch.autocast on CUDA)
// applied to a forward graph before autodiff, so that the backward ops autodiff derives
// run in the dtypes the forward ops chose (docs/mixed_precision.md has the op-by-op table).
//
//   Graph model = build_zoo_model("resnet18", {...});             // f32
//   MixedPrecisionReport report;
//   Graph amp = apply_mixed_precision(model, Precision::bf16, &report);
//   // then as any model: the step graph (loss, grad, optimizer updates) is built on `amp`
//
// What the rewrite does, node by node in order (a value's dtype changes only from f32 to
// the low dtype, never for f64, integer or bool values):
//   - low ops (convolutions, matmul, gemm): every f32 input, weights and bias included, is
//     cast to the low dtype (bf16 / f16); the op runs and writes the low dtype;
//   - f32 ops (softmax, log_softmax, cross_entropy, reduce_sum, reduce_mean, layer_norm,
//     rms_norm, exp, log, pow, reciprocal, rsqrt): inputs in the low dtype are cast up to
//     f32 (range and accumulation; autocast's "float32" list);
//   - batch_norm: x as it comes (low after a convolution), scale, bias and the running
//     statistics stay f32 (the IR's mixed form: y in x's dtype, statistics f32);
//   - everything else follows its inputs (relu, add, pooling, concat, reshape, ...): when
//     its f32-typed inputs arrive in different dtypes, the low ones are cast up to f32
//     (autocast's "promote"), else it runs in the low dtype;
//   - ops a forward graph does not normally hold (backward ops, optimizer updates) get
//     exactly their original input dtypes back.
// Each cast is made once per (value, dtype) and shared by all readers. A graph output
// whose dtype changed is cast back: the cast carries the output's name (logits stay
// "logits", f32), the low value is renamed "<name>:<dtype>".
//
// Parameters stay f32 (master weights): a parameter read by a low op is read through a
// cast node, so autodiff (whose cast rule casts the gradient back) gives it an f32
// gradient and the optimizer updates f32 weights and f32 state. Casts of `constant` nodes
// (literals) are folded into low-precision constants; casts of graph constants only with
// MixedPrecisionOptions::fold_constants, because the training step graph turns the model's
// constants into its trained parameters.
//
// Precision f32 and tf32 return the graph unchanged: TF32 is a backend math mode (the CUDA
// backend's FUSEBOX_ALLOW_TF32 and FUSEBOX_ALLOW_TF32_MATMUL, docs/settings.md), not a
// dtype.
#pragma once

#include <cstdint>
#include <string>

#include "fusebox/ir/graph.h"

namespace fusebox {

enum class Precision : uint8_t { f32, tf32, bf16, f16 };

const char* precision_name(Precision p);  // "f32", "tf32", "bf16", "f16"
// The inverse of precision_name; an Error naming the string and the choices otherwise.
Precision parse_precision(const std::string& s);
// The dtype low ops run in: bf16 or f16; f32 for f32 and tf32.
DType precision_dtype(Precision p);

// How the rewrite treats an op (docs/mixed_precision.md gives each op's reason).
enum class AutocastRule : uint8_t {
  low,         // f32 inputs cast to the low dtype
  f32,         // low-dtype inputs cast up to f32
  follow,      // runs in its inputs' dtype; mixed f32 / low inputs promote to f32
  batch_norm,  // x as it comes, per-channel inputs f32 (ir/ops.h's mixed form)
  keep,        // not a forward op: every input gets its original dtype back
};
const char* autocast_rule_name(AutocastRule r);
AutocastRule autocast_rule(OpKind op);

struct MixedPrecisionOptions {
  // Casts of graph constants to the low dtype become low-precision constants at compile
  // time, and a graph constant does not promote a follow op to f32 (it is folded to the
  // low dtype beside a low operand: a model whose weights are all low, as PyTorch's
  // model.to(bfloat16)). Only for graphs whose constants are not trained (inference): the
  // training step graph makes the model's constants its parameters, which must stay f32.
  bool fold_constants = false;
};

struct MixedPrecisionReport {
  int casts_inserted = 0;    // cast nodes added (graph outputs' casts back included)
  int constants_folded = 0;  // casts folded into low-precision constants
  int ops_low = 0;           // low ops run in the low dtype
  int ops_f32 = 0;           // f32 ops (whether or not an input had to be cast up)
  int ops_follow_low = 0;    // follow ops (and batch_norm) that run in the low dtype
  int ops_follow_f32 = 0;    // follow ops (and batch_norm) that run in f32
  int outputs_cast = 0;      // graph outputs cast back to their original dtype
};

// The rewritten copy of `forward` (same inputs, node names and output names; inputs keep
// their dtypes). Throws an Error naming the node when a rewritten node does not infer.
Graph apply_mixed_precision(const Graph& forward, Precision p,
                            MixedPrecisionReport* report = nullptr,
                            const MixedPrecisionOptions& opts = {});

}  // namespace fusebox
