// Depthwise convolutions (groups == C == K: one filter per channel) in NHWC: memory-bound
// ops, so one pass over the activations with 16-byte channel vectors instead of an implicit
// GEMM whose K would be the filter's few taps. fprop, dgrad and wgrad for 1 to 3 spatial dims,
// stride, dilation, asymmetric pads; f32, f16, bf16 (f32 accumulation); C a multiple of the
// vector width (8 for 16-bit types, 4 for f32). The depthwise engine (engine.cpp) runs them
// where plan.h's cannot_implement and the operands' alignment allow.
//
//   std::string plan = run_depthwise(ctx, n, op, in, out, epilogue);
#pragma once

#include <string>

#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/conv/problem.h"

namespace fusebox::cuda {

// Records the convolution with the whole epilogue `e` (fprop: bias, activation, residual,
// residual activation; dgrad: bias); operands not dense channels-last are copied first.
// Returns the plan's description ("depthwise bf16 fprop 3x3").
std::string run_depthwise(Context& ctx, const Node& n, ConvOp op, Inputs in, Outputs out,
                          const ConvEpilogueOperands& e);

}  // namespace fusebox::cuda
