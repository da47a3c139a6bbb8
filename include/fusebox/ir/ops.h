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

#define FUSEBOX_OP_KINDS(X)                                                        \
  X(conv) X(conv_backward_data) X(conv_backward_filter)                            \
  X(batch_norm) X(layer_norm) X(rms_norm)                                          \
  X(relu) X(leaky_relu) X(gelu) X(silu) X(sigmoid) X(tanh) X(exp) X(log) X(sqrt)   \
  X(rsqrt) X(reciprocal) X(neg) X(abs) X(erf) X(clip)                              \
  X(add) X(sub) X(mul) X(div) X(max) X(min) X(pow)                                 \
  X(matmul) X(gemm)                                                                \
  X(reduce_sum) X(reduce_mean) X(reduce_max)                                       \
  X(softmax) X(log_softmax)                                                        \
  X(max_pool) X(avg_pool) X(global_avg_pool)                                       \
  X(reshape) X(flatten) X(transpose) X(concat) X(slice) X(pad) X(squeeze)          \
  X(unsqueeze) X(cast) X(constant) X(identity)                                     \
  X(cross_entropy)

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
struct ConvAttrs {
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  std::vector<int64_t> pads_begin;  // low padding per spatial dim
  std::vector<int64_t> pads_end;    // high padding per spatial dim
  int64_t groups = 1;
};
// conv:                 x [N, C, D...], w [K, C/groups, R...], bias [K]?  -> y [N, K, O...]
//                       O = floor((D + pb + pe - dil*(R-1) - 1) / stride) + 1, each >= 1.
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
//   inference (training=false): 1 output, y = (x - mean) / sqrt(var + eps) * scale + bias
//     with the running statistics.
//   training: 5 outputs: y (normalised with the batch statistics), new running mean,
//     new running var (running * momentum + batch * (1 - momentum), batch variance is
//     the population variance, as ONNX), saved mean [C], saved inverse std [C].
struct BatchNormAttrs {
  double epsilon = 1e-5;
  double momentum = 0.9;
  bool training = false;
};
// layer_norm: x, scale?, bias? (shape of x's dims from `axis` on, or broadcastable to it).
//   Normalises over dims [axis, rank). 3 outputs: y, mean, inv_std_dev; mean and
//   inv_std_dev have x's shape with dims [axis, rank) set to 1 (ONNX).
// rms_norm: x, scale?. y = x / sqrt(mean(x^2) + eps) * scale. 2 outputs: y, inv_rms
//   (shaped like layer_norm's mean).
struct NormAttrs {
  int64_t axis = -1;
  double epsilon = 1e-5;
};

// ---- pointwise -------------------------------------------------------------
struct LeakyReluAttrs { double alpha = 0.01; };
struct GeluAttrs { bool tanh_approximation = false; };
struct ClipAttrs {  // min/max of +-infinity mean unbounded
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
};
// Binary ops (add sub mul div max min pow) broadcast as numpy; both operands
// have the same dtype, except pow, whose exponent may be any numeric dtype
// (the result has the base's dtype). Integer div truncates toward zero.

// ---- matmul ----------------------------------------------------------------
// matmul: numpy matmul (1-D operands promoted and the added dim removed; batch
//   dims broadcast).
// gemm: A [M, K] (or [K, M] with trans_a), B [K, N] (or [N, K]), C? broadcastable
//   to [M, N]. y = alpha * A' B' + beta * C.
struct GemmAttrs {
  bool trans_a = false;
  bool trans_b = false;
  double alpha = 1.0;
  double beta = 1.0;
};

// ---- reductions ------------------------------------------------------------
// Empty axes reduce over every dim (ONNX's noop_with_empty_axes=1 is handled by
// the importer as identity).
struct ReduceAttrs {
  std::vector<int64_t> axes;
  bool keepdims = true;
};
// softmax / log_softmax over one axis (ONNX opset 13 semantics).
struct SoftmaxAttrs { int64_t axis = -1; };

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
struct FlattenAttrs { int64_t axis = 1; };
// transpose: output dim i is input dim perm[i]; empty perm reverses the dims.
struct TransposeAttrs { std::vector<int64_t> perm; };
struct ConcatAttrs { int64_t axis = 0; };
// slice: ONNX semantics (negative indices count from the end, clamped; steps may be
// negative). Empty axes = [0, len(starts)); empty steps = all 1.
struct SliceAttrs {
  std::vector<int64_t> starts, ends, axes, steps;
};
// pad: pads = [b0, b1, ..., e0, e1, ...] for every dim (negative crops).
enum class PadMode : uint8_t { constant, reflect, edge };
struct PadAttrs {
  std::vector<int64_t> pads;
  PadMode mode = PadMode::constant;
  double value = 0.0;
};
// squeeze (empty axes: every dim of extent 1) / unsqueeze (axes index the output).
struct AxesAttrs { std::vector<int64_t> axes; };
// cast: float -> int truncates toward zero; -> bool is (x != 0); float narrowing rounds to nearest even.
struct CastAttrs { DType to = DType::f32; };
struct ConstantAttrs { Tensor value; };

// ---- losses ----------------------------------------------------------------
// cross_entropy: logits [N, C, D...] (float), labels [N, D...] (i64 or i32), weight [C]?.
// 2 outputs: loss (scalar for mean/sum, [N, D...] for none) and log_prob (log_softmax of
// the logits over dim 1, the logits' shape). Labels equal to ignore_index contribute 0
// and are left out of the mean's denominator; mean divides by the sum of the weights of
// the counted labels (ONNX SoftmaxCrossEntropyLoss). A label outside [0, C) that is not
// ignore_index is an error at run time.
enum class Reduction : uint8_t { none, sum, mean };
struct CrossEntropyAttrs {
  Reduction reduction = Reduction::mean;
  std::optional<int64_t> ignore_index;
};

using Attrs = std::variant<std::monostate, ConvAttrs, ConvBackwardDataAttrs,
                           ConvBackwardFilterAttrs, BatchNormAttrs, NormAttrs, LeakyReluAttrs,
                           GeluAttrs, ClipAttrs, GemmAttrs, ReduceAttrs, SoftmaxAttrs, PoolAttrs,
                           ReshapeAttrs, FlattenAttrs, TransposeAttrs, ConcatAttrs, SliceAttrs,
                           PadAttrs, AxesAttrs, CastAttrs, ConstantAttrs, CrossEntropyAttrs>;

}  // namespace fusebox
