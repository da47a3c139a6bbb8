// Depthwise convolutions (groups == C == K: one filter per channel) in NHWC: memory-bound
// ops, so one pass over the activations with 16-byte channel vectors instead of an implicit
// GEMM whose K would be the filter's few taps. fprop, dgrad and wgrad for 1 to 3 spatial dims,
// stride, dilation, asymmetric pads; f32, f16, bf16 (f32 accumulation); C a multiple of the
// vector width (8 for 16-bit types, 4 for f32). kernels/conv/conv.cpp runs them for
// depthwise problems under FUSEBOX_CONV_BACKEND=own, where depthwise_beats_cudnn says so, and
// where autotuning timed them faster.
//
//   if (auto why = depthwise_cannot_implement(n, op, in, out)) ... another path
//   std::string plan = run_depthwise(ctx, n, op, in, out, epilogue);
#pragma once

#include <optional>
#include <string>

#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/conv/problem.h"

namespace fusebox::cuda {

// Why the depthwise kernels cannot run the node's convolution, or nullopt: groups != C or
// K != C, dtypes other than f32 / f16 / bf16, C not a multiple of the vector width, tensors
// past 2^31 elements.
std::optional<std::string> depthwise_cannot_implement(const Node& n, ConvOp op, Inputs in,
                                                      const DeviceTensor& out);

// Whether the depthwise kernels run this problem without autotuning, ahead of cuDNN: where
// they were measured faster than cuDNN's best engine on every shape (bf16; f16 runs the same
// loop; bench/results/2026-11-25_h100_session14/, 2026-11-28_h200_session19/): dgrad at
// stride 1 (1.5-2.6x); fprop at stride 1 without a fused activation or residual with a 7-wide
// filter, or a 3-wide one on the ring kernel; 3-wide weight gradients on the ring kernel.
// Elsewhere (f32 included) cuDNN was faster or not measured: cuDNN runs (autotuning still
// times both).
bool depthwise_beats_cudnn(const Node& n, ConvOp op, Inputs in, const DeviceTensor& out,
                           const ConvEpilogueOperands& e);

// Records the convolution with the whole epilogue `e` (fprop: bias, activation, residual,
// residual activation; dgrad: bias); operands not dense channels-last are copied first.
// Returns the plan's description ("depthwise bf16 fprop 3x3").
std::string run_depthwise(Context& ctx, const Node& n, ConvOp op, Inputs in, Outputs out,
                          const ConvEpilogueOperands& e);

}  // namespace fusebox::cuda
