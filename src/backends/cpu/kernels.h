// CPU kernels, one function per op (or op family), all with one signature.
// run_node (dispatch.cpp) picks the function by OpKind. Attributes are already
// normalised by infer_and_normalize (see ir/graph.h): no defaults, no negative axes.
//
// inputs[i] is nullptr for an absent optional input; outputs are allocated with
// the inferred dtype/shape and hold garbage until written.
#pragma once

#include <span>

#include "fusebox/ir/graph.h"

namespace fusebox::dist {
class Communicator;
}

namespace fusebox::cpu {

using Inputs = std::span<const Tensor* const>;
using Outputs = std::span<Tensor>;

// conv.cpp: convolution and its two backward ops, 1-3 spatial dims.
void conv_forward(const Node& n, Inputs in, Outputs out);
void conv_backward_data(const Node& n, Inputs in, Outputs out);
void conv_backward_filter(const Node& n, Inputs in, Outputs out);

// pool.cpp
void max_pool(const Node& n, Inputs in, Outputs out);
void avg_pool(const Node& n, Inputs in, Outputs out);
void global_avg_pool(const Node& n, Inputs in, Outputs out);

// norm.cpp
void batch_norm(dist::Communicator* world, const Node& n, Inputs in, Outputs out);
// x [N, C, D...]'s batch statistics as batch_norm computes them, into `moments` f64 [C, 3]
// (count, mean, M2 per channel: ir/ops.h ConvAttrs::channel_stats).
void channel_moments(const Node& n, const Tensor& x, Tensor& moments);
void batch_norm_apply(const Node& n, Inputs in, Outputs out);
void layer_norm(const Node& n, Inputs in, Outputs out);
void rms_norm(const Node& n, Inputs in, Outputs out);

// pointwise.cpp: every unary op (relu ... clip, identity) and every binary op.
void unary(const Node& n, Inputs in, Outputs out);
void binary(const Node& n, Inputs in, Outputs out);
// fused_pointwise.cpp: a generated pointwise program, interpreted with pointwise.cpp's formulas.
void fused_pointwise(const Node& n, Inputs in, Outputs out);

// matmul.cpp
void matmul(const Node& n, Inputs in, Outputs out);
// attention.cpp: softmax(scale q k^T) v per row, and its backward, in f64.
void attention(const Node& n, Inputs in, Outputs out);
void attention_backward(const Node& n, Inputs in, Outputs out);
void gemm(const Node& n, Inputs in, Outputs out);

// reduce.cpp: reduce_sum/mean/max, arg_max/min, top_k, cumsum, softmax, log_softmax,
// cross_entropy.
void reduce(const Node& n, Inputs in, Outputs out);
void arg_reduce(const Node& n, Inputs in, Outputs out);  // arg_max, arg_min
void cumsum(const Node& n, Inputs in, Outputs out);
void top_k(const Node& n, Inputs in, Outputs out);  // values and i64 indices
void softmax(const Node& n, Inputs in, Outputs out);
void cross_entropy(const Node& n, Inputs in, Outputs out);

// shape_ops.cpp: reshape flatten squeeze unsqueeze (a copy), transpose, concat,
// slice, pad, cast, constant.
void copy_reshape(const Node& n, Inputs in, Outputs out);
void transpose(const Node& n, Inputs in, Outputs out);
void concat(const Node& n, Inputs in, Outputs out);
void slice(const Node& n, Inputs in, Outputs out);
void pad(const Node& n, Inputs in, Outputs out);
void cast(const Node& n, Inputs in, Outputs out);
void constant(const Node& n, Inputs in, Outputs out);
// logic.cpp: the comparisons and logic ops (FUSEBOX_LOGIC_OPS), where.
void logic(const Node& n, Inputs in, Outputs out);
void where(const Node& n, Inputs in, Outputs out);
// gather.cpp: gather and gather_backward.
void gather(const Node& n, Inputs in, Outputs out);
void gather_backward(const Node& n, Inputs in, Outputs out);
void gather_elements(const Node& n, Inputs in, Outputs out);
void gather_elements_backward(const Node& n, Inputs in, Outputs out);
// resize.cpp: resize and resize_backward.
void resize(const Node& n, Inputs in, Outputs out);
void resize_backward(const Node& n, Inputs in, Outputs out);

// backward.cpp, pool_backward.cpp, norm_backward.cpp: the backward ops (ops.h).
void expand(const Node& n, Inputs in, Outputs out);
void unary_backward(const Node& n, Inputs in, Outputs out);
void binary_backward(const Node& n, Inputs in, Outputs out);
void batch_norm_backward(dist::Communicator* world, const Node& n, Inputs in, Outputs out);
void layer_norm_backward(const Node& n, Inputs in, Outputs out);
void rms_norm_backward(const Node& n, Inputs in, Outputs out);
void softmax_backward(const Node& n, Inputs in, Outputs out);  // softmax and log_softmax
void cross_entropy_backward(const Node& n, Inputs in, Outputs out);
void reduce_max_backward(const Node& n, Inputs in, Outputs out);
void max_pool_backward(const Node& n, Inputs in, Outputs out);
void avg_pool_backward(const Node& n, Inputs in, Outputs out);
void slice_backward(const Node& n, Inputs in, Outputs out);
void pad_backward(const Node& n, Inputs in, Outputs out);

// optimizer.cpp: the optimizer updates and f16 loss scaling
void sgd_update(const Node& n, Inputs in, Outputs out);
void adamw_update(const Node& n, Inputs in, Outputs out);
void nonfinite_any(const Node& n, Inputs in, Outputs out);
void loss_scale_update(const Node& n, Inputs in, Outputs out);

// collective.cpp: all_reduce over `world` (null: a world of one); gather_ranks: every
// rank's `own` (one length on every rank), in rank order.
void all_reduce(dist::Communicator* world, const Node& n, Inputs in, Outputs out);
std::vector<double> gather_ranks(dist::Communicator* world, const std::vector<double>& own);

}  // namespace fusebox::cpu
