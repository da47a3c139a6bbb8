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

// hoist_narrowing_casts: a narrowing cast (f32 -> bf16/f16, f64 -> f32, ...) whose input is
// written by an op that only moves or repeats its one input's elements (transpose, reshape,
// flatten, squeeze, unsqueeze, slice, expand) and read by that cast alone moves above it:
// mover(x) -> cast becomes cast(x) -> mover, up a chain of movers. Exact (each element is
// cast alike wherever it moves to). Why: mixed precision casts a value where a low-precision
// op reads it, after the layout ops between: ViT-B/16's norms write f32 that a transpose
// moves at f32 before the cast to bf16 (twice the bytes), and the norm cannot write the
// casts' dtype itself (fold_norm_casts, passes/fusion.h) while the transpose is between.
// Inference pipeline, after the fusions that match casts in place (attention). Returns the
// number of moves (a cast moved above k ops counts k).
size_t hoist_narrowing_casts(Graph& g, FusionLog* log = nullptr);

// recognize_gelu: GELU spelled out in elementwise ops, as PyTorch's ONNX export (opset < 20)
// writes it, becomes one gelu node (ir/ops.h GeluAttrs) reading x:
//   erf form (nn.GELU()):       x * 0.5 * (1 + erf(x / sqrt(2)))     (or x * (1 / sqrt(2)));
//   tanh form (approximate='tanh', GPT-2's gelu_new):
//     x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))        (pow(x, 3) or x * x * x);
// the products' factors in any order and association, the sums' operands either way round, in
// f32, f16 or bf16. The constants are one-element float constants within their dtype's rounding
// of these values (1e-6 relative in f32: 1.4142135381698608 is sqrt(2)), the exponent exactly
// 3. Every value between x and the result is read only inside the pattern and is not a graph
// output (x may have other readers); the gelu takes the last product's node and value names.
// Not bit-exact: the gelu computes the function whose rounded constants the graph wrote, once
// (torch's erf spelling gives the same f32 values on the CPU; the others differ by a few ulps,
// or a few ulps of x where 1 + erf or 1 + tanh cancels for x << 0, the ops' error). Why:
// GPT-2's GELU ran as a generated kernel of eight ops whose powf made it compute-bound (4x its
// memory time on an H200), and a gelu after a linear layer becomes its gemm's cuBLASLt
// epilogue (fuse_gemm_epilogues, passes/fusion.h) where the spelled-out ops could not. Every
// pipeline, right after remove_identity_ops: on the f32 graph, so that mixed precision sees
// one gelu (both forms have a gradient rule). Returns the number of GELUs formed.
size_t recognize_gelu(Graph& g, FusionLog* log = nullptr);

// fold_gemm_transposes: a gemm operand made by a 2-D transpose that the gemm alone reads (and
// that is not a graph output) becomes the transpose's input, the gemm's trans_a / trans_b
// flipped: exact (cuBLASLt reads either layout). Why: a model imported for training keeps an
// exporter's Transpose of each Linear weight as a node (OnnxImportOptions::
// keep_parameter_transforms), which would otherwise copy every weight each step, and its
// gradient's transpose back. Training forward pipeline, after form_linears. Returns the number
// of transposes folded.
size_t fold_gemm_transposes(Graph& g, FusionLog* log = nullptr);

// swap_transposed_products: transpose(matmul(a, b)) swapping the last two dims, where only the
// transpose reads the product (>= 16 MiB) and a is at most an eighth of it, becomes
// matmul(b^T, a^T) (the same values: each element the same dot product): b^T a constant
// transposed at compile, or the input of a transpose b came from; a^T a transpose of the small
// operand. Why: a decoder's classes-first logits (GPT-2's [B, T, 50257] transposed to
// [B, 50257, T] for a cross entropy over dim 1) were a 206 MB copy at batch 8 after the LM
// head's product; swapped, the product writes that order. Run by Executable::compile for the
// CPU's fast kernels (oneDNN reads the broadcast constant and the strided operand as they
// are). Returns the number of products swapped.
size_t swap_transposed_products(Graph& g, FusionLog* log = nullptr);

// pad_product_columns: a matmul of rows [.., K] by a 2-D weight [K, N] whose N is not a
// multiple of 8 becomes, where its flops pay for the copies (PadColumnsThresholds):
//   rows = reshape(x, [M, K]); y' = matmul(rows, pad(w, N -> N')) [M, N'];
//   y = reshape(slice(y', columns 0..N), [.., N])
// with N' the next multiple of 8 (the pad's columns zero: the same values). Why: a column
// count whose bytes are not a multiple of 16 leaves cuBLASLt only slow kernels (GPT-2's LM
// head, N = 50,257: 10.0 ms forward on an H200 against 1.9 at N = 50,264), and in a training
// step the backward's products are the same problem twice more (dx reduces over N, dw writes
// [K, N]): 10.5 and 9.0 ms, where autodiff of this form gives aligned products, the weight's
// gradient through the pad's (a slice), and one product over the flattened rows instead of a
// batch of them summed. The copies: the forward's slice and the backward's zero-padded
// gradient of y. Training forward pipeline, after form_linears (inference: the CUDA matmul
// pads such a product itself, kernels/matmul/matmul.cpp). Returns the number rewritten.
// fold_cross_entropy: a cross_entropy whose log_prob nothing reads (a training step's loss)
// takes its lse_stash form (ir/ops.h: the backward recomputes the softmax from the logits
// and each position's log-sum-exp instead of reading log_prob) and reads its logits through
// what stands between them and their producer:
//   a widening cast from f16/bf16 (mixed precision's f32 rule for the loss): the low logits
//     are read, loss and lse stay f32;
//   the transpose moving the class axis from last to 1 ([N, T, V] -> [N, V, T], how a decoder's
//     loss is exported): the rows [N*T, V] are read, labels flattened alike;
//   then reshapes that keep the class axis last, and a slice of the leading columns
//     (pad_product_columns' product): the padded rows are read, `classes` the sliced count.
// The walked nodes that only the walk read go. The same values in another order of rounding:
// the loss is computed in f32 from the low logits, as the cast's f32 copy would have given.
// Why: GPT-2's training step (16 x 1024 tokens, vocabulary 50,257, bf16) spent 20.8 of 58.5 ms
// on an H200 between the LM head's product and its gradient: the slice, the transpose, the f32
// cast and log_prob (3.3 GB each way), and their gradients. Training forward pipeline, last.
// Returns the number of cross_entropy nodes rewritten.
size_t fold_cross_entropy(Graph& g, FusionLog* log = nullptr);

// concat_slice_gradients: a sum (a tree of adds) of slice_backward nodes of one input whose
// slices tile one axis (each takes a range of it, the others whole; step 1; together every
// index once) becomes the concat of their gradients along that axis; the adds and the
// slice_backward nodes go (each read only inside the tree). Exact: every element of the sum
// is one gradient's plus zeros (a -0 gradient element comes out -0, where the sum gave +0).
// Why: autodiff of a split (GPT-2's qkv into q, k and v) scatters each part's gradient into a
// zero tensor of the whole and adds the three: 3 scatters and 2 adds of the whole per layer
// (2.4 ms of GPT-2's 42 ms training step on an H200) where one concat writes it once.
// Training step graphs, after autodiff (train/step_graph.cpp). Returns the sums rewritten.
size_t concat_slice_gradients(Graph& g, FusionLog* log = nullptr);

// attention_output_from_layout_copy: an attention_backward reads the forward's output O through
// the inverse of the transposes and reshapes that copy O for its only other reader (the output
// projection's rows [B*T, H*d], which its weight gradient keeps), so that O is not kept for the
// backward too (ViT-B/16 b64: 12 x 18.5 MiB of its training peak). Exact: an index map. The
// executable plans the inverse chain as a strided view of the copy. Training step graphs, after
// autodiff. Returns the attention_backward nodes rewritten.
size_t attention_output_from_layout_copy(Graph& g, FusionLog* log = nullptr);

struct PadColumnsThresholds {
  double min_flops = double(int64_t(1) << 32);
  double min_flops_per_copied_byte = 128;  // the forward's and backward's copies of y
};
size_t pad_product_columns(Graph& g, FusionLog* log = nullptr,
                           const PadColumnsThresholds& thresholds = {});

}  // namespace fusebox
