// The op set: kinds, typed attribute structs and their semantics.
//
// Every op has logical NCHW semantics, as in ONNX / PyTorch. Inputs that ONNX
// passes as tensors but that decide shapes (Reshape's shape, Slice's starts,
// Pad's pads, Clip's bounds, ...) are attributes here: the IR is static.
// An absent optional input is kNoValue in Node::inputs.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "fusebox/core/tensor.h"

namespace fusebox {

// clang-format off
#define FUSEBOX_OP_KINDS(X)                                                                        \
  X(conv) X(conv_backward_data) X(conv_backward_filter) X(batch_norm) X(batch_norm_apply)          \
  X(layer_norm) X(rms_norm)                                                                        \
  X(relu) X(leaky_relu) X(gelu) X(silu) X(sigmoid) X(tanh) X(exp) X(log) X(sqrt) X(rsqrt)          \
  X(reciprocal)                                                                                    \
  X(neg) X(abs) X(erf) X(sin) X(cos) X(floor) X(ceil) X(round) X(clip)                             \
  X(add) X(sub) X(mul) X(div) X(max) X(min) X(pow)                                                 \
  X(equal) X(less) X(greater) X(less_equal) X(greater_equal) X(logical_not) X(logical_and)         \
  X(logical_or) X(logical_xor) X(where) X(matmul) X(gemm) X(reduce_sum) X(reduce_mean)             \
  X(reduce_max)                                                                                    \
  X(arg_max) X(arg_min) X(top_k) X(cumsum) X(softmax) X(log_softmax) X(max_pool) X(avg_pool)                \
  X(global_avg_pool)                                                                               \
  X(reshape) X(flatten) X(transpose) X(concat) X(slice) X(pad) X(squeeze) X(unsqueeze) X(cast)     \
  X(constant) X(identity) X(expand) X(gather) X(gather_elements) X(resize) X(cross_entropy)        \
  /* backward ops (autodiff emits them; see "backward ops" below) */                               \
  X(unary_backward) X(binary_backward) X(batch_norm_backward) X(layer_norm_backward)               \
  X(rms_norm_backward) X(softmax_backward) X(log_softmax_backward) X(cross_entropy_backward)       \
  X(reduce_max_backward) X(max_pool_backward) X(avg_pool_backward) X(slice_backward)               \
  X(pad_backward)                                                                                  \
  X(gather_backward) X(gather_elements_backward) X(resize_backward)                                \
  /* optimizer updates and f16 loss scaling */                                                     \
  X(sgd_update) X(adamw_update) X(nonfinite_any) X(loss_scale_update)                              \
  /* generated pointwise kernels (passes/fuse_pointwise.h) */                                      \
  X(fused_pointwise)                                                                               \
  /* fused attention (passes/fusion.h fuse_attention) */                                           \
  X(attention) X(attention_backward)                                                               \
  /* collectives of data-parallel training (docs/distributed.md) */                                \
  X(all_reduce)
// clang-format on

enum class OpKind : uint8_t {
#define FUSEBOX_ENUM(name) name,
  FUSEBOX_OP_KINDS(FUSEBOX_ENUM)
#undef FUSEBOX_ENUM
};

const char* op_name(OpKind k);
bool parse_op_name(const std::string& name, OpKind* out);

// ---- convolution -----------------------------------------------------------
// Rank-agnostic: S = number of spatial dims (1..3), taken from the weight's
// rank - 2. Empty vectors mean the default (stride 1, dilation 1, pad 0) and
// are filled to length S when the node is added.
// A pointwise activation fused into another op's epilogue (passes/fusion.h sets it): the
// unfused op's formula (relu, gelu, gelu with approximate=tanh, silu, sigmoid, tanh, clip
// with [min, max]) applied in the compute type, before the result is rounded.
enum class Activation : uint8_t { none, relu, gelu, gelu_tanh, silu, sigmoid, tanh, clip };
const char* activation_name(Activation a);  // "none", "relu", "gelu", "gelu_tanh", ...
struct FusedActivation {
  Activation kind = Activation::none;
  double min = -std::numeric_limits<double>::infinity();  // clip's bounds
  double max = std::numeric_limits<double>::infinity();
  explicit operator bool() const { return kind != Activation::none; }
  bool operator==(const FusedActivation&) const = default;
};

struct ConvAttrs {
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  std::vector<int64_t> pads_begin;  // low padding per spatial dim
  std::vector<int64_t> pads_end;    // high padding per spatial dim
  int64_t groups = 1;
  // The fused epilogue (conv only; none in the backward ops' copies):
  //   y = residual_activation(activation(conv(x, w) + bias) + residual)
  // computed in the compute type (f32 for f16/bf16) and rounded once, as cuDNN's fused
  // graphs compute it: within rounding of the unfused ops, not their bits.
  FusedActivation activation;           // on conv + bias
  FusedActivation residual_activation;  // after the residual add; needs the residual input
  // conv only: output 1 is y's batch statistics per output channel, f64 [K, 3]: the count of
  // y's elements in the channel (N * O...), their mean and the sum of their squared deviations
  // from it (M2), of y as stored (rounded to its dtype): the statistics a training batch_norm
  // reading y computes (its input 6). passes/fusion.h fold_norm_statistics sets it.
  bool channel_stats = false;
};
// conv:                 x [N, C, D...], w [K, C/groups, R...], bias [K]?, residual?
//                       -> y [N, K, O...]
//                       O = floor((D + pb + pe - dil*(R-1) - 1) / stride) + 1, each >= 1.
//                       residual (optional input 3) has y's type and shape (bias may be
//                       absent: kNoValue); see ConvAttrs' epilogue.
// conv_backward_data:   dy [N, K, O...], w [K, C/groups, R...], bias [C]?  -> dx [N, C, D...]
//                       dx = d(sum(conv(x, w) * dy)) / dx, plus bias per channel when given.
//                       D is given (input_spatial): it is never guessed. Transposed
//                       convolution is this op with D = (O-1)*stride - pb - pe +
//                       dil*(R-1) + 1 + output_padding.
// conv_backward_filter: x [N, C, D...], dy [N, K, O...]              -> dw [K, C/groups, R...]
//                       R is given (filter_spatial) and K from dy.
struct ConvBackwardDataAttrs {
  ConvAttrs conv;
  std::vector<int64_t> input_spatial;  // D, the spatial extents of dx
};
struct ConvBackwardFilterAttrs {
  ConvAttrs conv;
  std::vector<int64_t> filter_spatial;  // R, the spatial extents of dw
};

// ---- normalisation ---------------------------------------------------------
// batch_norm: x [N, C, D...], scale [C], bias [C], running_mean [C], running_var [C].
//   The four per-channel inputs share one dtype: x's, or f32 when x is f16 or bf16 (mixed
//   precision, as PyTorch autocast and cuDNN: low-precision activations, f32 weights and
//   running statistics). y has x's type; the per-channel outputs have the inputs' dtype.
//   inference (training=false): 1 output, y = (x - mean) / sqrt(var + eps) * scale + bias
//     with the running statistics.
//   training: 5 outputs: y (normalised with the batch statistics), new running mean,
//     new running var (running * momentum + batch * (1 - momentum), batch variance is
//     the population variance, as ONNX), saved mean [C], saved inverse std [C].
//   relu (a fused activation, both forms): output 0 is relu(y), relu as the op (y < 0 ? 0
//     : y, applied to y rounded to its dtype: NaN stays NaN, -0 stays -0), bit for bit
//     batch_norm then relu; the statistics outputs are unchanged. passes/fusion.h sets it.
//   residual (optional input 5, x's type and shape: a fused residual add): output 0 is
//     y + residual (y rounded to its dtype, the sum as the add op computes it), then the
//     relu if any: bit for bit batch_norm, add, relu. The block end of a residual network.
//   sync (training only: synchronized batch norm in a data-parallel step): the batch
//     statistics are those of every rank's x together (the compile's communicator; a run
//     without one is a world of one rank). Every rank merges the ranks' (count, mean, M2)
//     in rank order, so all get the same statistics, bit for bit.
//   batch_stats (optional input 6, training and not sync: f64 [C, 3], ConvAttrs::
//     channel_stats' triples): x's batch statistics as x's producer computed them, used in
//     place of the norm's own pass over x (the same values: the count, mean and M2 the norm
//     would compute from x, so the outputs are the same bit for bit on the CPU).
//   batch_norm_backward with sync and training: mean(dy) and mean(dy * x_hat) of dx are
//     over every rank's dy; dscale and dbias stay this rank's sums (the data-parallel
//     gradient average then makes them the whole batch's).
// batch_norm_apply: (x, scale, bias, saved_mean, saved_inv_std) -> y: a training batch_norm's
//   output 0 computed again from its saved statistics (outputs 3 and 4) instead of kept:
//   y = (x - saved_mean) * k + bias with k = scale * saved_inv_std, in compute_t of x's dtype,
//   rounded to x's dtype, then relu'd with `relu` (BatchNormAttrs; the others play no part).
//   Bit for bit the training forward's y where the statistics' dtype is x's compute type (f32
//   for f16 / bf16 / f32 x, f64 for f64 x): the forward normalises with the statistics as it
//   stores them there. passes/rematerialize.h emits it; nothing imports it.
struct BatchNormAttrs {
  double epsilon = 1e-5;
  double momentum = 0.9;
  bool training = false;
  bool relu = false;
  bool sync = false;
  // batch_norm_backward only: output 3 is dy as the backward used it (see there).
  bool dy_output = false;
};
// layer_norm: x, scale?, bias? (shape of x's dims from `axis` on, or broadcastable to it).
//   Normalises over dims [axis, rank). 3 outputs: y, mean, inv_std_dev; mean and
//   inv_std_dev have x's shape with dims [axis, rank) set to 1 (ONNX).
// rms_norm: x, scale?. y = x / sqrt(mean(x^2) + eps) * scale. 2 outputs: y, inv_rms
//   (shaped like layer_norm's mean).
// Both: scale and bias have x's dtype; y has x's dtype, or y_dtype where set. The mixed
//   form (f32 scale and bias; x and y of one dtype, f16 or bf16, or one of them f32 and the
//   other f16 or bf16; fold_norm_casts, passes/fusion.h, makes it of a norm computed in f32
//   between casts) computes as the f32 norm of x widened to f32, y rounded once to its
//   dtype: the same values as cast -> f32 norm -> cast. Inference forms only (no gradient).
struct NormAttrs {
  int64_t axis = -1;
  double epsilon = 1e-5;
  std::optional<DType> y_dtype;
};

// ---- pointwise -------------------------------------------------------------
// Comparisons, logic and where (no attributes; every operand numpy-broadcast):
// equal, less, greater, less_equal, greater_equal: (a, b) of one dtype (numeric; equal also
//   bool) -> bool, compared in the compute type (f16 / bf16 exactly as f32, integers
//   exactly); a NaN compares false, so NaN != NaN.
// logical_not: bool -> bool; logical_and, logical_or, logical_xor: (bool, bool) -> bool.
// where: (condition bool, a, b) -> condition ? a : b, a's dtype (b's must match); the
//   three broadcast together. The gradient goes to a where condition holds, else to b.
struct LeakyReluAttrs {
  double alpha = 0.01;
};
struct GeluAttrs {
  bool tanh_approximation = false;
};
struct ClipAttrs {  // min/max of +-infinity mean unbounded
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
};
// Binary ops (add sub mul div max min pow) broadcast as numpy; both operands
// have the same dtype, except pow, whose exponent may be any numeric dtype
// (the result has the base's dtype). Integer div truncates toward zero.

// ---- generated pointwise programs ------------------------------------------------
// fused_pointwise: (in0, ..., in{k-1}) -> y, 1 <= k <= 16 float tensors (f64 f32 f16 bf16);
//   y's shape is the numpy broadcast of every input's shape. A PointwiseProgram is a list
//   of instructions: instruction i computes `op` on its operands, where an index < k names
//   input `index` and k + j names instruction j's result (j < i); y is the last one's value.
//   ops: the unary pointwise ops (relu .. clip, their attributes held here), the binary
//   ones (add .. pow), cast (float to float) and unary_backward (dy, x) of the activations
//   whose derivative the generator writes (is_program_derivative: relu, leaky_relu, gelu,
//   silu, sigmoid, tanh; the forward op in `of`, its attributes held here). Every input and
//   every instruction but the last is read by some instruction.
//   Semantics: every instruction is its op exactly as the op alone: computed in f32 (f64
//   for f64) from its operands' values and rounded to the dtype that op gives (its operand's;
//   a binary op's operands share one, except pow's exponent, any float dtype; cast's `to`).
//   So a program gives the unfused chain's bits on the CPU; on the GPU (a kernel generated
//   and compiled at run time: kernels/pointwise/fused_codegen.h) the unfused kernels' ulps,
//   zero signs and NaN payloads aside. Not differentiable: passes/fuse_pointwise.h forms it
//   on graphs that are not differentiated.
struct PointwiseInstr {
  OpKind op = OpKind::add;
  std::vector<int32_t> operands;    // 1 (unary ops, cast) or 2 (binary ops; pow: base, exponent;
                                    // unary_backward: dy, x)
  OpKind of = OpKind::relu;         // unary_backward: the forward op
  double alpha = 0.01;              // leaky_relu
  bool tanh_approximation = false;  // gelu
  double min = -std::numeric_limits<double>::infinity();  // clip
  double max = std::numeric_limits<double>::infinity();
  DType to = DType::f32;  // cast
  bool operator==(const PointwiseInstr&) const = default;
};
struct PointwiseProgram {
  int32_t inputs = 0;  // k, the node's input count (operand indices below it name inputs)
  std::vector<PointwiseInstr> instrs;
  bool operator==(const PointwiseProgram&) const = default;
};

// ---- matmul ----------------------------------------------------------------
// matmul: numpy matmul (1-D operands promoted and the added dim removed; batch
//   dims broadcast).
// gemm: A [M, K] (or [K, M] with trans_a), B [K, N] (or [N, K]), C? broadcastable
//   to [M, N]. y = activation(alpha * A' B' + beta * C): the activation is a fused
//   epilogue (none from ONNX; passes/fusion.h fuse_gemm_epilogues sets it), computed in
//   the compute type before the result is rounded, as cuBLASLt's epilogues compute it.
//   y has A's dtype, or y_dtype where set: the mixed form (A and B f16 or bf16, no C,
//   y_dtype f32; fold_product_casts, passes/fusion.h, makes it of a product read only by a
//   widening cast) stores the f32 accumulator unrounded: the values of the product computed
//   in f32 from the same operands, which the rounded product widened is not. Inference
//   forms only (no gradient).
struct GemmAttrs {
  bool trans_a = false;
  bool trans_b = false;
  double alpha = 1.0;
  double beta = 1.0;
  FusedActivation activation;
  std::optional<DType> y_dtype;
};

// ---- reductions ------------------------------------------------------------
// Empty axes reduce over every dim (ONNX's noop_with_empty_axes=1 is handled by
// the importer as identity).
struct ReduceAttrs {
  std::vector<int64_t> axes;
  bool keepdims = true;
};
// arg_max / arg_min: the index (i64) of the largest / smallest element along `axis` (ONNX
// ArgMax / ArgMin, opset 13): the first such index, or the last with select_last_index; a NaN
// counts as the largest and the smallest (as NumPy's argmax / argmin); keepdims keeps the
// axis as extent 1. Not differentiable.
struct ArgReduceAttrs {
  int64_t axis = 0;
  bool keepdims = true;
  bool select_last_index = false;
};
// top_k: x -> (values, indices i64), ONNX TopK: the k largest (smallest with largest false)
//   elements along `axis` (normalised) in order, values of x's dtype and their positions;
//   the outputs are x's shape with the axis's extent k (0 <= k <= extent). Equal elements
//   keep the lower index first; a NaN is above every number (first when largest, last when
//   smallest; PyTorch's topk), -0 equals +0. `sorted` false allows any order (ONNX):
//   the result is sorted anyway. Numeric x. Differentiable in x: the values are
//   gather_elements(x, indices) along the axis.
struct TopKAttrs {
  int64_t k = 1;
  int64_t axis = -1;
  bool largest = true;
  bool sorted = true;
};
// cumsum: running sums of x along `axis` (normalised), ONNX CumSum: y[.., i, ..] = sum of
//   x[.., j, ..] over j <= i (exclusive: j < i; reverse: j >= i, or j > i with both).
//   Numeric x; floats sum in f64 and round each output once, integers wrap.
struct CumSumAttrs {
  int64_t axis = 0;
  bool exclusive = false;
  bool reverse = false;
};
// softmax / log_softmax over one axis (ONNX opset 13 semantics).
struct SoftmaxAttrs {
  int64_t axis = -1;
};

// ---- attention ---------------------------------------------------------------
// attention: (q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv], bias?) -> y [..., Tq, dv], the
//   leading dims ([B, H] or [B]) the same for q, k and v:
//     y = softmax(scale * q k^T + bias, over the keys) v
//   with causal: key j > query i masked out (top-left aligned: Tq <= Tk). bias (optional) is
//   additive, any float dtype, broadcast (numpy rules) to the scores [..., Tq, Tk]: a padding
//   mask [B, 1, 1, Tk] of 0 / -inf (or finfo.min), a relative-position bias [1, H, Tq, Tk].
//   The scores and the softmax in f32 whatever the storage; q, k, v and y one float dtype.
//   Formed by fuse_attention (passes/fusion.h). with_lse adds a second output, lse [..., Tq]
//   f32: log(sum_j exp(scale * q_i . k_j + bias_ij)) over the kept keys, what the backward reads.
// attention_backward: (dy, q, k, v, y, lse, bias?) -> (dq, dk, dv, dbias?), with the forward's
//   attributes: p = exp(scale q k^T + bias - lse); dv = p^T dy; ds = p * (dy v^T - rowsum(dy * y));
//   dq = scale ds k; dk = scale ds^T q; with bias_grad, dbias = ds summed over the dims the
//   bias broadcasts (bias's shape and dtype).
struct AttentionAttrs {
  double scale = 1.0;
  bool causal = false;
  bool with_lse = false;
  bool bias_grad = false;  // attention_backward only: also output dbias
};

// ---- pooling ---------------------------------------------------------------
// max_pool / avg_pool: x [N, C, D...]. Output extent per dim:
//   O = floor_or_ceil((D + pb + pe - dil*(R-1) - 1) / stride) + 1; with ceil_mode, a
//   window that would start in the end padding is dropped (ONNX / PyTorch rule).
// avg_pool divides by the window's size including padding when count_include_pad,
//   else by the number of in-bounds elements. Dilation applies to max_pool only.
// max_pool with return_indices has a second output: i64 indices into the flattened
//   x (ONNX storage_order 0: row-major over N, C, D...).
// global_avg_pool: mean over every spatial dim, keeping them as 1.
struct PoolAttrs {
  std::vector<int64_t> kernel;
  std::vector<int64_t> strides;     // default 1 each
  std::vector<int64_t> dilations;   // default 1 each
  std::vector<int64_t> pads_begin;  // default 0 each
  std::vector<int64_t> pads_end;
  bool ceil_mode = false;
  bool count_include_pad = false;
  bool return_indices = false;
};

// ---- shape and data movement -----------------------------------------------
// reshape: ONNX semantics: 0 copies the input's extent (unless allow_zero), one -1 is inferred.
struct ReshapeAttrs {
  std::vector<int64_t> shape;
  bool allow_zero = false;
};
// flatten: [d0..d(axis-1)] x [d(axis)..] -> 2-D.
struct FlattenAttrs {
  int64_t axis = 1;
};
// transpose: output dim i is input dim perm[i]; empty perm reverses the dims.
struct TransposeAttrs {
  std::vector<int64_t> perm;
};
struct ConcatAttrs {
  int64_t axis = 0;
};
// slice: ONNX semantics (negative indices count from the end, clamped; steps may be
// negative). Empty axes = [0, len(starts)); empty steps = all 1.
struct SliceAttrs {
  std::vector<int64_t> starts, ends, axes, steps;
  // Set by normalisation: starts/ends are absolute (see graph.h), so a normalised end of
  // -1 with a negative step means "before index 0", not "the last index" as in ONNX.
  bool normalized = false;
};
// pad: pads = [b0, b1, ..., e0, e1, ...] for every dim (negative crops).
enum class PadMode : uint8_t { constant, reflect, edge };
struct PadAttrs {
  std::vector<int64_t> pads;
  PadMode mode = PadMode::constant;
  double value = 0.0;
};
// expand: numpy broadcast_to(x, shape) (x's shape must broadcast to `shape`; the
// output's shape is exactly `shape`).
struct ExpandAttrs {
  std::vector<int64_t> shape;
};
// squeeze (empty axes: every dim of extent 1) / unsqueeze (axes index the output).
struct AxesAttrs {
  std::vector<int64_t> axes;
};
// cast: float -> int truncates toward zero; -> bool is (x != 0); float narrowing rounds to nearest
// even.
struct CastAttrs {
  DType to = DType::f32;
};
struct ConstantAttrs {
  Tensor value;
};
// gather: (data, indices) -> y, ONNX Gather: with data viewed as [outer, extent, inner]
//   around `axis` (normalised) and the indices flattened, y[o, j, i] = data[o, indices[j],
//   i]; y's shape is data's with dim `axis` replaced by the indices' shape (a scalar index
//   removes it). data of any dtype; indices i64 or i32, any rank, negative ones counting
//   from the end (+extent). An index outside [-extent, extent) is an error at run time
//   naming the node and the index's position (in a training step, a halt: no update).
//   The embedding lookup: gather(table [V, D], token ids [B, T]) -> [B, T, D].
// gather_elements: (data, indices) -> y of the indices' shape, ONNX GatherElements
//   (torch.gather): y[p] = data[p with its coordinate along `axis` replaced by
//   indices[p]]. indices (i64 or i32) have data's rank and, along every other dim, at most
//   data's extent; negative ones count from the end; out of range fails the run as gather.
//   GatherAttrs as gather's.
struct GatherAttrs {
  int64_t axis = 0;
};

// resize: x -> y of shape `sizes` (x's rank), ONNX Resize (opsets 11-19): every dim resampled
//   on its own. Output index o of a dim (in -> out elements, scale s = scales[d]) reads the
//   source coordinate c (in x's index space, computed in f64):
//     half_pixel            (o + 0.5) / s - 0.5
//     half_pixel_symmetric  half_pixel + (in / 2) * (1 - out / (s * in))   (centred)
//     pytorch_half_pixel    out > 1 ? (o + 0.5) / s - 0.5 : 0
//     align_corners         L != 1 ? o * (in - 1) / (L - 1) : 0
//     asymmetric            o / s
//     tf_half_pixel_for_nn  (o + 0.5) / s   (opsets 11-12)
//     tf_crop_and_resize    L != 1 ? r0 (in - 1) + o (r1 - r0)(in - 1) / (L - 1)
//                                   : (r0 + r1)(in - 1) / 2    (r0, r1: roi_start, roi_end)
//   L = s * in, the unrounded output length, as ONNX's reference (it differs from out when
//   scales were given and out was rounded down).
//   nearest: x[round(c)] by nearest_mode (round_prefer_floor: .5 goes down; _ceil: up;
//     floor; ceil), clamped to [0, in - 1]; any dtype (a copy).
//   linear: taps floor(c), floor(c) + 1 with weights 1 - t, t (t = c - floor(c));
//   cubic: taps floor(c) - 1 .. floor(c) + 2 with Keys' weights of coefficient cubic_a;
//     taps outside [0, in) read the edge element, or with exclude_outside get weight 0 and
//     the others are renormalised. Float only; the taps' products summed in f32 (f64 for
//     f64), rounded once. A tap of weight 0 is not read (an integral c reads one element).
//   tf_crop_and_resize: a coordinate outside [0, in - 1] gives extrapolation_value.
//   scales: the Resize node's (it may differ from out / in when out was rounded down);
//   empty means out / in. roi_start / roi_end: per dim, empty means 0 and 1.
// resize_backward: (dy) -> dx of input_shape: zeros, then each dy element added to its
//   taps with their weights (CPU in order, in f64; CUDA with atomics, f32 sums for f16 /
//   bf16: not bit-reproducible). Float only; `resize` as the forward's.
enum class ResizeMode : uint8_t { nearest, linear, cubic };
enum class ResizeCoordinates : uint8_t {
  half_pixel,
  half_pixel_symmetric,
  pytorch_half_pixel,
  align_corners,
  asymmetric,
  tf_crop_and_resize,
  tf_half_pixel_for_nn
};
enum class ResizeNearest : uint8_t { round_prefer_floor, round_prefer_ceil, floor, ceil };
struct ResizeAttrs {
  std::vector<int64_t> sizes;
  std::vector<double> scales;
  ResizeMode mode = ResizeMode::nearest;
  ResizeCoordinates coordinates = ResizeCoordinates::half_pixel;
  ResizeNearest nearest = ResizeNearest::round_prefer_floor;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation_value = 0.0;
  std::vector<double> roi_start, roi_end;
};
const char* resize_mode_name(ResizeMode m);                // "nearest", "linear", "cubic"
const char* resize_coordinates_name(ResizeCoordinates c);  // the ONNX spelling
const char* resize_nearest_name(ResizeNearest r);          // the ONNX spelling
struct ResizeBackwardAttrs {
  ResizeAttrs resize;
  std::vector<int64_t> input_shape;
};

// ---- losses ----------------------------------------------------------------
// cross_entropy: logits [N, C, D...] (float), labels [N, D...] (i64 or i32), weight [C]?.
// 2 outputs: loss (scalar for mean/sum, [N, D...] for none) and log_prob (log_softmax of
// the logits over dim 1, the logits' shape). Labels equal to ignore_index contribute 0
// and are left out of the mean's denominator; mean divides by the sum of the weights of
// the counted labels (ONNX SoftmaxCrossEntropyLoss). A label outside [0, C) that is not
// ignore_index is an error at run time.
//
// The recomputing form (lse_stash; passes/simplify.h fold_cross_entropy makes it where
// nothing reads log_prob; no ONNX equivalent): output 1 is each position's log-sum-exp
// [N, D...] (log_prob = logits - lse) instead of log_prob, loss and lse are f32 for f16/bf16
// logits (stash_dtype) and a weight has their dtype; cross_entropy_backward then recomputes
// the softmax from the logits. `classes` (lse_stash only): only the first `classes` entries
// of dim 1 are classes, the rest padding (a padded product's columns) that takes no part in
// the loss and gets gradient 0.
enum class Reduction : uint8_t { none, sum, mean };
struct CrossEntropyAttrs {
  Reduction reduction = Reduction::mean;
  std::optional<int64_t> ignore_index;
  bool lse_stash = false;
  std::optional<int64_t> classes;
};

// ---- backward ops ------------------------------------------------------------
// Emitted by autodiff (passes/autodiff); every backend implements them. `dy` is the
// gradient of the forward op's output, `dx` that of its input; all float.
//
// unary_backward: (dy, x) -> dx = dy * f'(x) for forward op `op` (relu .. clip; the
//   forward attrs are repeated here). relu' = 1 where x > 0, else 0 (relu'(0) = 0);
//   leaky_relu' = 1 where x > 0, else alpha (alpha at 0, as PyTorch); clip passes the
//   gradient where min <= x <= max (inclusive, as PyTorch); abs'(0) = 0.
struct UnaryBackwardAttrs {
  OpKind op = OpKind::relu;
  double alpha = 0.01;                                    // leaky_relu
  bool tanh_approximation = false;                        // gelu
  double min = -std::numeric_limits<double>::infinity();  // clip
  double max = std::numeric_limits<double>::infinity();
};
// binary_backward: (dy, a, b) -> (da, db), both at the broadcast (output) shape and in
//   a's dtype, for forward op `op` in {div, max, min, pow}; autodiff reduces them to the
//   operands' shapes. max/min send the gradient to a where a >= b (max) / a <= b (min)
//   or a is NaN, else to b (ties go to a, so the total is conserved; a NaN operand gets
//   it where the forward picked it). pow: da = dy*b*a^(b-1), taken as 0 where b == 0;
//   db = dy*log(a)*a^b, taken as 0 where a == 0 and b >= 0 (both as PyTorch). pow's
//   exponent b may have any numeric dtype, as the forward's; db is still in a's dtype.
struct BinaryBackwardAttrs {
  OpKind op = OpKind::div;
};
// batch_norm_backward: (dy, x, scale, saved_mean, saved_inv_std, y?, bias?, dy_addend?) -> (dx,
//   dscale [C], dbias [C], dy_used?): dx in x's dtype, dscale and dbias in the per-channel
//   inputs' dtype (x's, or f32 with f16 / bf16 x, as the forward's). With training = true (the
//   training form, what autodiff of a training batch_norm emits) the batch statistics' dependence
//   on x is included; with training = false (the default, so a node without attributes gets this
//   form!) mean and inv_std are constants (the running statistics of an inference forward:
//   dx = dy * scale * inv_std). epsilon and momentum play no part. With relu (the forward
//   was a fused batch_norm + relu) y, the forward's output 0 (after the relu, x's type), is
//   input 5 and dy is first masked as relu's gradient (unary_backward of relu at y: dy * 1
//   where y > 0, else dy * 0, rounded to dy's dtype); without relu there is no input 5. Input
//   6, with relu only, is the forward's bias ([C], the per-channel dtype): with it a backend
//   may recompute y from x, the saved statistics, scale and bias instead of reading it (the
//   CUDA kernels do where the statistics are stored in their compute type: the forward's own
//   coefficients, so the same mask); the CPU reads y.
//   Input 7, dy_addend (dy's type), is a second term of the gradient: dy + dy_addend, as the
//   add op computes it (rounded to dy's dtype), is the dy masked and used (autodiff's sum of
//   two contributions, taken in by fold_gradient_sums, passes/fusion.h). With dy_output the
//   node has output 3, that dy as used (the sum, masked by relu's gradient with relu), in dy's
//   dtype: the gradient at a residual batch_norm's sum, which its residual input gets too.
//   A relu over a fused residual masks by the output after the add, so such a node is given y
//   and no bias (the bias alone does not give that y back).
// layer_norm_backward: (dy, x, scale?, mean, inv_std_dev) -> (dx, dscale, dbias), dscale
//   and dbias shaped like x's dims [axis, rank) (or like scale when given, summed over
//   the dims scale broadcasts along; dbias too, so a bias shaped unlike scale needs a
//   further reduce), in x's dtype; mean and inv_std_dev are the forward's outputs (their
//   shape and stash dtype). Without scale, dscale = sum(dy * xhat) all the same.
// rms_norm_backward: (dy, x, scale?, inv_rms) -> (dx, dscale), likewise.
//   (norm attrs as the forward op: BatchNormAttrs / NormAttrs)
// softmax_backward: (dy, y) -> dx = y * (dy - sum(dy * y, axis)).
// log_softmax_backward: (dy, y) -> dx = dy - exp(y) * sum(dy, axis)   (y = log_softmax)
//   (SoftmaxAttrs as the forward op)
// cross_entropy_backward: (dloss, log_prob, labels, weight?) -> dlogits, the fused
//   gradient (softmax - onehot) * weight[label] * dloss (/ the mean's denominator),
//   0 for ignored labels (so all zeros when every label is ignored, as PyTorch, where
//   the mean's loss is NaN). (CrossEntropyAttrs as the forward op; dloss has the forward
//   loss's shape and dtype; softmax is exp(log_prob).) Bad labels fail as the forward's.
//   The lse_stash form: (dloss, lse, labels, weight?, logits) -> dlogits in the logits'
//   type, softmax = exp(logits - lse); 0 in the padding columns past `classes`.
// reduce_max_backward: (dy, x, y) -> dx: dy goes to the elements equal to the max,
//   split evenly among ties (as PyTorch's amax); where y is NaN, among the NaN elements.
//   (ReduceAttrs as the forward op; dy and y have the forward output's type; float only.)
// max_pool_backward: (dy, x) -> dx: each window's gradient goes to its first maximal
//   element (row-major order within the window, as the forward indices; a NaN wins as
//   in the forward); a window with no in-bounds tap sends nowhere.
// avg_pool_backward: (dy) -> dx, the forward's division spread over each window.
// `pool` is normalised as the forward's (and return_indices set false: it plays no part).
struct PoolBackwardAttrs {
  PoolAttrs pool;
  std::vector<int64_t> input_shape;  // x's full shape [N, C, D...]; max_pool: empty = x's
};
// slice_backward: (dy) -> dx of shape input_shape: dy scattered where the slice read,
//   zeros elsewhere. `slice` is normalised against input_shape as the forward's.
struct SliceBackwardAttrs {
  SliceAttrs slice;
  std::vector<int64_t> input_shape;
};
// pad_backward: (dy) -> dx of shape input_shape: for constant mode the interior; for
//   reflect/edge the interior plus every padded position's gradient added to the
//   element it copied. A cropped (negative pad) element gets 0.
struct PadBackwardAttrs {
  PadAttrs pad;
  std::vector<int64_t> input_shape;
};
// gather_backward: (dy, indices) -> ddata of shape data_shape: zeros, then each dy element
//   added to the data element the forward read (indices read twice sum; the CPU adds in
//   the order of the indices, in f64; the CUDA backend with atomics, in no fixed order).
//   `gather` is normalised as the forward's; an index out of range adds nothing (the
//   forward raised for it).
// gather_elements_backward: (dy, indices) -> ddata of shape data_shape, likewise: each dy
//   element added to the element gather_elements read.
struct GatherBackwardAttrs {
  GatherAttrs gather;
  std::vector<int64_t> data_shape;
};

// ---- optimizer updates -------------------------------------------------------
// One op per parameter tensor, so a backend can fuse the whole update into one pass
// (and a later pass can batch all parameters into one launch). lr (and step) are f32
// (i64) scalar INPUTS, not attributes, so the graph stays the same while a schedule
// changes them: rank 0; lr may be any float dtype (f32 normally), step i64 or i32 and
// >= 1 at run time. grad and the state buffers have param's dtype and shape (grad may also be
// bf16 or f16 beside an f32 param: mixed precision's gradient, read as its exact f32 value);
// the update runs in f32 (f64 for f64 params) with the per-step scalars in f64.
// Both take two optional trailing scalar inputs (rank 0), for f16 loss scaling (PyTorch's
// GradScaler: docs/mixed_precision.md), read at run time like lr:
//   grad_scale (any float dtype): the gradient is multiplied by it (rounded to the compute
//     type: g = grad * grad_scale) before anything else reads it (the unscaling by
//     1 / loss scale);
//   skip (any dtype): when nonzero (NaN counts) the update is skipped: every output equals
//     its input (param, the state buffers) bit for bit.
// Without them (absent, kNoValue) the update is exactly the one below, bit for bit.
// A last optional input, low_param (bf16 or f16, param's shape; param f32), adds a last output
// new_low_param = new_param rounded to low_param's dtype (round to nearest even, as cast): the
// low copy a mixed-precision step's products read instead of casting the parameter every step
// (train/step_graph.cpp). Its values are not read: it is there so that the new copy may be
// written in its place.
// sgd_update: (param, grad, momentum_buf, lr, grad_scale?, skip?, low_param?) -> (new_param,
//   new_momentum_buf, new_low_param?), PyTorch semantics:
//   g = grad + weight_decay * param; buf = momentum * buf + (1 - dampening) * g
//   (buf = g on the first step is the caller's business: it starts buf at 0 and sets
//   dampening 0, which PyTorch's first step equals); g = nesterov ? g + momentum * buf : buf
//   (when momentum != 0; buf is updated by the formula either way); param -= lr * g.
//   nesterov needs momentum > 0 and dampening 0 (PyTorch's rule).
struct SgdAttrs {
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};
// adamw_update: (param, grad, m, v, lr, step, grad_scale?, skip?, low_param?) -> (new_param,
//   new_m, new_v, new_low_param?), PyTorch AdamW: param *= 1 - lr * weight_decay; m = b1 m + (1-b1)
//   g; v = b2 v + (1-b2) g^2; param -= lr * (m / (1 - b1^step)) / (sqrt(v) / sqrt(1 - b2^step)
//   + eps). step counts from 1 (the step being taken; with skipped steps, the steps not
//   skipped, as PyTorch's per-parameter count). beta1, beta2 in [0, 1).
struct AdamWAttrs {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0.01;
};
// nonfinite_any: (x1, ..., xn) -> found, f32 [] : 1 when some element of some input is an
//   infinity or a NaN, else 0 (PyTorch's found_inf of GradScaler.unscale_). One or more
//   floating-point inputs of any shapes and dtypes (the gradients of a step). No
//   attributes; the result does not depend on the order the elements are read in.
// loss_scale_update: (scale, growth_tracker, found_inf, skipped?) -> (new_scale,
//   new_growth_tracker, new_skipped?), PyTorch's GradScaler.update (torch's
//   _amp_update_scale_): scale a float scalar, growth_tracker an integer scalar (i64 or
//   i32), found_inf a numeric scalar (nonzero: this step's gradients were not finite),
//   skipped an optional integer scalar counting the skipped steps; outputs of their
//   inputs' types. With f = found_inf != 0:
//     f:     new_scale = scale * backoff_factor, new_growth_tracker = 0;
//     not f: t = growth_tracker + 1; when t == growth_interval: new_scale =
//            scale * growth_factor (unless that is not finite: scale kept) and
//            new_growth_tracker = 0; else new_scale = scale, new_growth_tracker = t;
//     new_skipped = skipped + (f ? 1 : 0).
//   The products are taken in f64 and rounded to scale's dtype. growth_factor > 1,
//   0 < backoff_factor < 1, growth_interval >= 1.
struct LossScaleAttrs {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// ---- collectives (data-parallel training, docs/distributed.md) ------------
// all_reduce: (x1, ..., xn) -> (y1, ..., yn), yi of xi's type and shape: the elementwise sum
//   (mean: times 1 / world size, rounded to f32) of xi over the ranks of the world the
//   executable was compiled for (CompileOptions::communicator; none: a world of one, whose
//   sum is xi). Floating-point inputs. The values travel and are summed as reduce_dtype
//   (f32, bf16 or f16): xi is rounded to it first and yi = dtype_i(float(sum) * scale), so a
//   world of one with reduce_dtype bf16 returns xi rounded through bf16. Every rank gets the
//   same bits. One node is one bucket: its inputs are packed, reduced in one collective and
//   unpacked. Every rank must run the same all_reduce nodes, with the same types, in the same
//   order (the step graph's node order); on the GPU they are chained in that order and
//   overlap the nodes after them (the memory plan keeps their inputs to the step's end, so
//   no later node waits for one: runtime/memory_plan.h).
struct AllReduceAttrs {
  bool mean = true;
  DType reduce_dtype = DType::f32;
};

using Attrs = std::variant<
    std::monostate, ConvAttrs, ConvBackwardDataAttrs, ConvBackwardFilterAttrs, BatchNormAttrs,
    NormAttrs, LeakyReluAttrs, GeluAttrs, ClipAttrs, GemmAttrs, ReduceAttrs, SoftmaxAttrs,
    PoolAttrs, ReshapeAttrs, FlattenAttrs, TransposeAttrs, ConcatAttrs, SliceAttrs, PadAttrs,
    AxesAttrs, CastAttrs, ConstantAttrs, CrossEntropyAttrs, ExpandAttrs, UnaryBackwardAttrs,
    BinaryBackwardAttrs, PoolBackwardAttrs, SliceBackwardAttrs, PadBackwardAttrs, SgdAttrs,
    AdamWAttrs, LossScaleAttrs, PointwiseProgram, AttentionAttrs, ArgReduceAttrs, GatherAttrs,
    GatherBackwardAttrs, CumSumAttrs, ResizeAttrs, ResizeBackwardAttrs, TopKAttrs, AllReduceAttrs>;

}  // namespace fusebox
