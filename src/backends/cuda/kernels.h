// CUDA kernels of the op set, one entry per op (or family), all with one signature,
// mirroring backends/cpu/kernels.h. cuda::run_node (dispatch.cpp) picks the function
// by OpKind. Attributes arrive normalised (ir/graph.h: infer_and_normalize).
//
// Every entry records its work on ctx.encoder (never launches directly) and declares
// what it reads and writes; temporaries come from ctx.allocator and are handed to
// ctx.encoder.add_temporary. inputs[i] is nullptr for an absent optional input; outputs
// are allocated by the caller with the inferred types. Layouts (run_node, dispatch.cpp):
// convolution entries take any strides; batch_norm, the pools and their backward ops get
// their activation operands (x, y, dy, dx) all contiguous or all dense channels-last
// (per-channel vectors contiguous; pool indices either); every other entry gets contiguous
// outputs (elementwise ones through views permuted into the outputs' physical order), and
// non-contiguous inputs only where it says so.
//
// dtypes: f32, f16 and bf16 with f32 accumulation (f64 where the CPU backend allows it
// is accepted but not tuned); integer dtypes where the op's CPU kernel takes them.
#pragma once

#include <span>

#include "backends/cuda/runtime/context.h"
#include "backends/cuda/runtime/tensor.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {

using Inputs = std::span<const DeviceTensor* const>;
using Outputs = std::span<DeviceTensor>;

void run_node(Context& ctx, const Node& n, Inputs in, Outputs out);
// run_node's path for a node with an empty input whose outputs have elements
// (empty_inputs.cpp): what the op computes over nothing, never a launch over zero extents.
void run_with_empty_inputs(Context& ctx, const Node& n, Inputs in, Outputs out);

// ---- pointwise_*.cu, reduce_*.cu, shape_*.cu, kernels/reduce/cross_entropy.cu ----------
void unary(Context& ctx, const Node& n, Inputs in, Outputs out);   // strided inputs OK
void binary(Context& ctx, const Node& n, Inputs in, Outputs out);  // strided/broadcast OK
// kernels/pointwise/logic.cu: the comparisons and logic ops (FUSEBOX_LOGIC_OPS), where
void logic(Context& ctx, const Node& n, Inputs in, Outputs out);  // strided/broadcast OK
void where(Context& ctx, const Node& n, Inputs in, Outputs out);  // strided/broadcast OK
// kernels/pointwise/fused.cu: a generated kernel per program (NVRTC); strided/broadcast OK
void fused_pointwise(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/attention/attention.cu: cuDNN's fused attention, else the project's row kernel
void attention(Context& ctx, const Node& n, Inputs in, Outputs out);
void attention_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
void reduce(Context& ctx, const Node& n, Inputs in, Outputs out);
void arg_reduce(Context& ctx, const Node& n, Inputs in, Outputs out);  // arg_max, arg_min
// kernels/reduce/cumsum.cu
void cumsum(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/reduce/top_k.cu: CUB's stable segmented sort
void top_k(Context& ctx, const Node& n, Inputs in, Outputs out);
void softmax(Context& ctx, const Node& n, Inputs in, Outputs out);  // softmax, log_softmax
void cross_entropy(Context& ctx, const Node& n, Inputs in, Outputs out);
void copy_reshape(Context& ctx, const Node& n, Inputs in, Outputs out);
void transpose(Context& ctx, const Node& n, Inputs in, Outputs out);
void concat(Context& ctx, const Node& n, Inputs in, Outputs out);
void slice(Context& ctx, const Node& n, Inputs in, Outputs out);
void pad(Context& ctx, const Node& n, Inputs in, Outputs out);
void cast(Context& ctx, const Node& n, Inputs in, Outputs out);
void constant(Context& ctx, const Node& n, Inputs in, Outputs out);
// Strided -> strided copy (any rank, any dtype; the destination may be a view too, e.g. a
// slice of concat's output); used by run_node and the executor.
void copy_strided(Context& ctx, const DeviceTensor& src, const DeviceTensor& dst);
// dst = src (dense, the same type, shape and order) unless the halt word is set
// (runtime/error_flags.h): how a training step commits state it could not update in place.
void copy_unless_halted(Context& ctx, const DeviceTensor& src, const DeviceTensor& dst,
                        const BufferRange& halt);

// ---- backward ops and optimizer updates (ops.h), the CPU kernels' semantics -----------
// kernels/pointwise/backward.cu
void unary_backward(Context& ctx, const Node& n, Inputs in, Outputs out);  // strided inputs OK
void binary_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/shape/backward.cu
void expand(Context& ctx, const Node& n, Inputs in, Outputs out);  // strided input OK
void slice_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
void pad_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/shape/gather.cu: gather, gather_elements and their backward ops
void gather(Context& ctx, const Node& n, Inputs in, Outputs out);
void gather_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
void gather_elements(Context& ctx, const Node& n, Inputs in, Outputs out);
void gather_elements_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/shape/resize.cu: resize and resize_backward
void resize(Context& ctx, const Node& n, Inputs in, Outputs out);
void resize_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/reduce/backward.cu: softmax_backward and log_softmax_backward, reduce_max_backward
void softmax_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
void reduce_max_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/reduce/cross_entropy.cu
void cross_entropy_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/batch_norm/batch_norm.cu, kernels/pool/pool.cu
void batch_norm_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
void max_pool_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
void avg_pool_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/norm/backward.cu: the IR forms of the direct calls declared below
void layer_norm_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
void rms_norm_backward(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/optimizer/optimizer.cu: one fused pass each; lr and step are read on the device (no host
// sync)
void sgd_update(Context& ctx, const Node& n, Inputs in, Outputs out);
void adamw_update(Context& ctx, const Node& n, Inputs in, Outputs out);
// One node's operands, for what records several nodes at once.
struct NodeOperands {
  const Node* node;
  Inputs in;
  Outputs out;
};
// A run of a step's optimizer updates (sgd_update or adamw_update) as multi-tensor launches, one
// per up to 192 tensors: the run must share op, attributes, scalar inputs (the same lr, step,
// grad_scale and skip) and dtypes, with every tensor 16-byte aligned; false, recording nothing,
// where it does not (the caller then records each node). A malformed node throws, as alone.
bool record_update_group(Context& ctx, std::span<const NodeOperands> nodes);
// f16 loss scaling, also in kernels/optimizer/optimizer.cu: inputs in any dense order
void nonfinite_any(Context& ctx, const Node& n, Inputs in, Outputs out);
void loss_scale_update(Context& ctx, const Node& n, Inputs in, Outputs out);
// kernels/collective/all_reduce.cu: pack, one NCCL all-reduce over ctx.world, unpack
void all_reduce(Context& ctx, const Node& n, Inputs in, Outputs out);

// ---- norm_*.cu, kernels/batch_norm/batch_norm.cu, kernels/pool/pool.cu, kernels/conv/direct.cu,
// kernels/matmul/matmul.cpp -------
void layer_norm(Context& ctx, const Node& n, Inputs in, Outputs out);
void rms_norm(Context& ctx, const Node& n, Inputs in, Outputs out);
void batch_norm(Context& ctx, const Node& n, Inputs in, Outputs out);
void batch_norm_apply(Context& ctx, const Node& n, Inputs in, Outputs out);
// Per-channel batch statistics as a training batch_norm computes them, written as the triples
// f64 [C, 3] (count, mean, M2: ir/ops.h ConvAttrs::channel_stats, batch_norm's batch_stats):
// of x [N, C, D...] itself (the norm's statistics pass), or from a producer's per-tile sums:
// `sums` and `squares` f32 [tiles][pitch], tile t the rows [t * tile_rows, min(rows, (t + 1) *
// tile_rows)) of a channels-last [rows][C] (the statistics GEMM of
// kernels/conv/engines/cutlass_bn/stats_gemm.h), each tile's triple in f64, merged in the
// norm's fixed order.
struct BatchNormTileSums {
  const float* sums = nullptr;
  const float* squares = nullptr;
  BufferList ranges;  // what the kernel reads (both buffers)
  int64_t tiles = 0, pitch = 0, tile_rows = 0, rows = 0;
};
void channel_moments(Context& ctx, const std::string& where, const DeviceTensor& x,
                     DeviceTensor& moments);
void channel_moments_from_tile_sums(Context& ctx, const std::string& where,
                                    const BatchNormTileSums& sums, int64_t channels,
                                    DeviceTensor& moments);
void max_pool(Context& ctx, const Node& n, Inputs in, Outputs out);
void avg_pool(Context& ctx, const Node& n, Inputs in, Outputs out);
void global_avg_pool(Context& ctx, const Node& n, Inputs in, Outputs out);
void conv_forward(Context& ctx, const Node& n, Inputs in, Outputs out);
void conv_backward_data(Context& ctx, const Node& n, Inputs in, Outputs out);
void conv_backward_filter(Context& ctx, const Node& n, Inputs in, Outputs out);
void matmul(Context& ctx, const Node& n, Inputs in, Outputs out);
void gemm(Context& ctx, const Node& n, Inputs in, Outputs out);

// Norm backward passes as direct calls (benchmarks and tests; the IR ops above wrap
// them). x, dy [rows, cols] contiguous; scale [cols]; mean/rstd [rows] f32.
// dscale/dbias [cols] in scale's dtype (or f32), reduced from per-block f32 partial sums.
void layer_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                         const DeviceTensor* scale, const DeviceTensor& mean,
                         const DeviceTensor& rstd, DeviceTensor& dx, DeviceTensor* dscale,
                         DeviceTensor* dbias);
void rms_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                       const DeviceTensor* scale, const DeviceTensor& rstd, DeviceTensor& dx,
                       DeviceTensor* dscale);

}  // namespace fusebox::cuda
