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
// Run it on the forward graph before autodiff (the training forward pipeline does:
// passes/pipeline.h), so that the backward pass is derived from the fused node.
//
// Inference graphs (the inference pipeline, passes/pipeline.h) go further, in this order:
//   1. fold_batch_norms: conv -> batch_norm (inference form, constant weights and
//      statistics) becomes one conv with folded weights and bias (computed in f64, rounded
//      once: exact to the dtype's rounding in f32; bf16's error is measured in the tests);
//   1b. form_linears: matmul + bias add (nn.Linear as exported) as one gemm;
//   2. mixed precision (passes/mixed_precision.h), the folded constants cast once;
//   3. fuse_conv_epilogues: conv -> activation -> add(residual) -> activation becomes one
//      conv with its epilogue (ir/ops.h ConvAttrs), which the CUDA backend lowers to ONE
//      cuDNN graph (conv + bias + activation + add + activation, kept on chip), or splits
//      where cuDNN refuses (kernels/conv/conv.cpp: the report says why);
//   3b. fuse_gemm_epilogues: matmul/gemm -> bias add -> activation as one gemm;
//   3c. fuse_attention: matmul -> scale -> softmax -> matmul as one attention node;
//   4. the batch-norm fusions above for the batch norms left (not after a conv);
//   4b. hoist_narrowing_casts (passes/simplify.h), then fold_norm_casts: the casts around
//       layer/RMS norms taken into the norms; fold_product_casts: a product's widening cast
//       taken into its store;
//   5. fuse_pointwise_chains (passes/fuse_pointwise.h): the chains of elementwise ops no
//      node above took become one generated kernel each.
// The groups each fusion formed are kept in a FusionLog: `fusebox inspect --fusion`
// prints them (describe_fusion) and `--dot` draws them (fusion_dot).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "fusebox/ir/graph.h"
#include "fusebox/passes/mixed_precision.h"

namespace fusebox {

// The activation an op computes, when it is one a fused epilogue can take (relu, gelu, silu,
// sigmoid, tanh, clip); none otherwise. (The fusions' epilogues and the CPU's oneDNN eltwise
// kernels read ops through it.)
FusedActivation activation_of(const Node& n);

// One group: the node that does the work of several, and the ops it stands for.
struct FusionGroup {
  std::string node;              // the fused node's name
  std::vector<std::string> ops;  // "conv 'layer1.0.conv1'", "batch_norm 'bn1' (folded)", ...
};

// The groups the fusion passes formed, in the order they were first formed. A pass that
// fuses more into a node already in a group adds to that group.
class FusionLog {
 public:
  void add(const std::string& node, const std::vector<std::string>& ops);
  const std::vector<FusionGroup>& groups() const { return groups_; }
  const FusionGroup* find(const std::string& node) const;

 private:
  std::vector<FusionGroup> groups_;
};

// Fuses every such batch_norm -> relu pair of `g` in place (the graph is rebuilt: value
// and node ids change, names do not; inputs, constants, outputs and the other nodes stay
// as they were). Returns the number of pairs fused; `g` is untouched when that is 0.
size_t fuse_batch_norm_relu(Graph& g, FusionLog* log = nullptr);

// fuse_batch_norm_residual: a batch_norm (either form) whose output 0 is read by exactly one
// node, an add of a value of the same type and shape (no broadcasting), becomes one
// batch_norm with that value as its residual input (ir/ops.h); when the add's output is
// read only by a relu, that too (relu = true). The fused node writes the last replaced
// node's value, in its place in the graph. Why: the end of every residual block, relu(bn(x)
// + identity), is otherwise three passes over an activation (the normalisation, the add, the
// relu): ResNet-50's 16 block ends. Run it before fuse_batch_norm_relu (the step graph
// does). Returns the number fused.
size_t fuse_batch_norm_residual(Graph& g, FusionLog* log = nullptr);

// fold_batch_norms: every batch_norm of the inference form (no relu or residual fused yet)
// whose x is a conv's output read by nothing else, the conv's weight and bias and the four
// per-channel inputs all constants, is folded into that conv: W' = W * s, b' = (b - mean) *
// s + beta per output channel, s = scale / sqrt(var + eps). The conv writes the batch
// norm's value (name included); the unfolded weights are dropped when nothing else reads
// them. Returns the number folded.
size_t fold_batch_norms(Graph& g, FusionLog* log = nullptr);

// fuse_conv_epilogues: a conv without an epilogue whose output is read by exactly one node
// (and is not a graph output) takes over, in this order where present: an activation
// (relu, gelu, silu, sigmoid, tanh, clip), an add of a value of y's type (the residual, no
// broadcasting), an activation after the add. No gradient rule exists for the fused conv:
// inference graphs only. Returns the number of convs that took something over.
size_t fuse_conv_epilogues(Graph& g, FusionLog* log = nullptr);

// fuse_gemm_epilogues: a 2-D product takes over the bias add and activation after it, as
// one gemm (ir/ops.h GemmAttrs::activation; cuBLASLt's epilogue on the GPU):
//   gemm (no activation yet) -> activation (relu or gelu's tanh form: those a GEMM's epilogue
//   computes; the others stay for fuse_pointwise_chains);
//   gemm without C -> add(bias) [-> activation], the bias becoming C (beta 1);
//   matmul of two 2-D operands [-> add(bias)] [-> activation], the matmul becoming a gemm;
// a bias is the add's other operand when it broadcasts to y's [M, N] (a [N] row bias, say)
// and has y's dtype; every value taken over is read by that one next node only and is not a
// graph output. An activation reading the product through a reshape alone (form_linears' view
// of N-D rows as [..., N]) moves above the reshape first, and is taken. Why: a linear layer's bias
// and activation are otherwise two more passes over its output. Batched (N-D) matmuls are left
// alone. Inference graphs only (no gradient rule). Returns the number of products that took
// something over.
size_t fuse_gemm_epilogues(Graph& g, FusionLog* log = nullptr);

// form_linears: matmul(x [..., K], w [K, N]) -> add(bias along the last dim), nn.Linear as
// ONNX exporters write it (for N-D activations too), becomes one gemm with the bias (x as
// [M, K] rows through reshape views; passes/fusion/form_linears.cpp); a matmul of an N-D x
// by a 2-D w [K, N] without such a bias becomes a bias-less gemm (N a multiple of 8; the others
// pad_product_columns pads as 2-D matmuls). Run it before mixed precision
// (the inference and training forward pipelines do: passes/pipeline.h): as a gemm the layer runs in
// the low dtype with its bias, as PyTorch's autocast runs nn.Linear, where the add of an f32 bias
// would promote the output to f32. The same sums. Returns the number formed.
size_t form_linears(Graph& g, FusionLog* log = nullptr);

// fuse_attention: scaled dot-product attention spelled out (matmul(q, transpose(k)) ->
// scale -> softmax over the keys -> matmul with v, float casts between, constant scalar
// scales on q, k^T or the scores; passes/fusion/fuse_attention.cpp lists the forms), in bf16 or
// f16, becomes one attention node (ir/ops.h), run by cuDNN's fused flash attention on the GPU. Why:
// the
// [.., Tq, Tk] scores and probabilities are otherwise written and read four times (ViT-B/16:
// 30M elements a layer at batch 64) and the softmax runs in f32 between casts. `training`:
// the nodes also output lse (AttentionAttrs::with_lse), which their gradient rule reads; run
// it on the forward graph before autodiff (the training forward pipeline does). `f32`: f32
// chains fuse too (the CPU's fast kernels run them on oneDNN; on the GPU an f32 chain's products
// are faster on cuBLASLt, unfused). Returns the number fused.
size_t fuse_attention(Graph& g, FusionLog* log = nullptr, bool training = false, bool f32 = false);

// fold_norm_casts: a layer_norm / rms_norm computed in f32 between casts, as mixed precision
// leaves it (the norms are on autocast's f32 list, the products around them in bf16/f16):
//   cast(x: f16/bf16 -> f32) -> norm -> y f32 -> cast(-> f16/bf16), read by nothing else,
// becomes the norm's mixed form (ir/ops.h NormAttrs): x read in its own dtype, y written in
// the casts' dtype (y_dtype), scale and bias f32. Either side alone folds too (an f32
// residual stream into a norm whose y is cast, as in ViT; a bf16 activation into a norm whose
// f32 y is read as it is); an input cast read elsewhere too stays for those readers. Why:
// ConvNeXt-T's 46 casts around its norms were 12% of its step, each a full pass over an
// activation. The same values: a widening cast is exact, and the norm rounds its f32 result
// once to y's dtype as the cast did. Inference graphs only (the mixed form has no gradient
// rule). Returns the number of norms that took a cast.
size_t fold_norm_casts(Graph& g, FusionLog* log = nullptr);

// fold_product_casts: an f16/bf16 product widened to f32 and read by nothing else,
//   gemm(A, B) without C (or matmul of [.., K] rows by a 2-D [K, N] matrix) -> cast(-> f32),
// becomes gemm's mixed form (ir/ops.h GemmAttrs::y_dtype = f32; a matmul first becomes the
// gemm of its rows, reshaped back): the product's f32 accumulator stored as it is, in the
// cast's place. Why: GPT-2's LM head (16 x 1024 rows by a 50,257-wide vocabulary) wrote
// 1.6 GB of bf16 logits that a cast then read to write 3.3 GB of f32 ones, both alive at once
// (the inference peak). Values: the product computed in f32 from the same bf16 operands,
// unrounded, where the casts gave it rounded to bf16 first (more exact, never less).
// Inference graphs only (the mixed form has no gradient rule). Returns the number folded.
size_t fold_product_casts(Graph& g, FusionLog* log = nullptr);

// fold_gradient_sums (training steps, after autodiff): a batch_norm_backward without a
// dy_addend whose dy is an add of two values of dy's type (no broadcasting), neither made by
// an elementwise op, not a graph output, takes the add's operands as dy and dy_addend
// (ir/ops.h) and the add goes, where the node is the add's only reader, or has no relu and
// every other reader comes after it: the node then writes the sum (dy_output) for them (a
// residual norm without a relu passes its dy on to the residual as it is). Why: autodiff sums
// a value's gradient contributions with adds, and a residual network's block output has two
// (the next block's first convolution and its skip): that sum, a pass over the activation of
// its own (with relu's mask: ResNet-50's sixteen block ends, ~8% of a training step), is then
// made by the norm's first pass as it reads dy. A term an elementwise op makes is left to
// fuse_pointwise_chains, which computes the sum in that op's kernel (silu's two gradient terms
// are one kernel writing one tensor: folded, EfficientNet-B0's step was 4.7% slower). The
// same bits: the norm's backward adds and rounds as the add op. Returns the number folded.
size_t fold_gradient_sums(Graph& g, FusionLog* log = nullptr);

// fold_norm_statistics (training steps on the GPU, after autodiff): a training batch_norm
// (not sync) whose x is output 0 of a plain bf16 1x1 convolution (2-D, stride 1, no padding,
// dilation, groups, bias or epilogue; channels in multiples of 64; at least `min_pixels`
// pixels N * H * W) takes x's statistics from that convolution: the conv writes them as its
// output 1 (ConvAttrs::channel_stats) and the norm reads them as its batch_stats (input 6),
// its own pass over x skipped. Why: ResNet-50's training batch norms read each activation
// twice in the forward (statistics, then y), and the CUDA backend computes the statistics in
// the 1x1 convolutions' epilogue (issue 40 item 5; docs/fusion.md); where it cannot, the
// convolution's lowering runs the norm's statistics pass after it (the same work as before).
// The same values: the triples the norm computes from x (bit for bit on the CPU; on the GPU
// within rounding of the norm's own merge order). Returns the number of norms given statistics.
// Which form wins depends on the GPU and the shape, so the CUDA lowering times the statistics
// GEMM against the convolution + the norm's statistics pass once per problem and keeps the
// faster (kernels/conv/conv.cpp). Off by default (FUSEBOX_CONV_NORM_STATISTICS=1 turns it on):
// where the pass form wins, the fold still costs one more small kernel than no fold (the
// statistics merged by the conv, then again, as one triple, by the norm). Session 51, training
// steps with against without the fold, same machine: H200 with the timed choice, ResNet-50
// (batch 256) 32.03 vs 32.20 ms, ResNeXt-50 22.78 vs 22.69; with the GEMM everywhere, H100
// ResNet-50 39.48 vs 39.71 ms, H200 32.32 vs 32.17.
//
// kNormStatisticsMinPixels: bench_norm_stats (H100, session 51), the statistics GEMM + merging
// its tile sums + the norm's apply pass against the convolution + the norm's statistics and
// apply passes: 0.84-0.90 at 56x56 and 28x28 (batch 256: 802,816 and 200,704 pixels),
// 0.96-0.98 at 14x14 (50,176), 1.00-1.08 at 7x7 (12,544). Narrow layers lose: with
// EfficientNet-B0's folded on channels in multiples of 8, its step was 4% slower (H200,
// session 50).
constexpr int64_t kNormStatisticsMinPixels = 32768;
size_t fold_norm_statistics(Graph& g, FusionLog* log = nullptr,
                            int64_t min_pixels = kNormStatisticsMinPixels);

// Which fusions the inference pipeline (passes/pipeline.h) runs. FUSEBOX_FUSION=0 turns them
// all off (for comparisons), 1 (default) on: from_env(), which the CLI passes.
struct InferenceFusionOptions {
  bool fold_batch_norm = true;
  bool conv_epilogue = true;  // and form_linears, fuse_gemm_epilogues
  bool batch_norm = true;     // fuse_batch_norm_residual, fuse_batch_norm_relu
  bool pointwise = true;      // fuse_pointwise_chains
  bool attention = true;      // fuse_attention
  // fuse_attention takes f32 chains too: set by Executable::compile for the CPU's fast kernels
  // (oneDNN's attention kernel), not for the GPU (cuBLASLt's f32 products beat a fused one).
  bool f32_attention = false;
  bool identity_ops = true;   // remove_identity_ops (passes/simplify.h)
  bool norm_casts = true;     // fold_norm_casts
  bool product_casts = true;  // fold_product_casts
  bool hoist_casts = true;    // hoist_narrowing_casts (passes/simplify.h)
  bool gelu = true;           // recognize_gelu (passes/simplify.h)
  // fold_norm_statistics in GPU training steps: off by default (passes/fusion.h says why),
  // FUSEBOX_CONV_NORM_STATISTICS=1 turns it on.
  bool norm_statistics = false;
  static InferenceFusionOptions from_env();
  static InferenceFusionOptions none() {
    return {false, false, false, false, false, false, false, false, false, false, false, false};
  }
};

// What a backend will run a node of a prepared graph on, in words ("cuDNN graph
// conv_fprop+bias+relu", "own kernel batch_norm+relu"): the backend's answer, e.g.
// cuda::describe_lowering (fusebox/backends/cuda.h).
using LoweringDescriber = std::function<std::string(const Node&)>;

// The planned groups of a prepared graph, one line each ("group 3: conv + batch_norm
// (folded) + relu -> cuDNN graph conv_fprop+bias+relu"), then the summary line "fusion: G
// groups, F fused ops, U unfused ops" (U: the graph's other nodes).
std::string describe_fusion(const Graph& g, const FusionLog& log,
                            const LoweringDescriber& lowering);
// That summary line alone.
std::string fusion_summary(const Graph& g, const FusionLog& log);
// The prepared graph in Graphviz: one box per node, fused nodes filled and labelled with
// the ops of their group and their lowering.
std::string fusion_dot(const Graph& g, const FusionLog& log, const LoweringDescriber& lowering);

}  // namespace fusebox
