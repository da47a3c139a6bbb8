// The project's tensor-core convolutions (kernels/conv/implicit_gemm/): fprop, dgrad and
// wgrad as one implicit-GEMM main loop with three index maps (operands.cuh), for 1 to 3
// spatial dims, stride, dilation, asymmetric padding and groups, in f32 (TF32 or exact),
// f16 and bf16. kernels/conv/conv.cpp calls it where cuDNN refuses a problem and for
// FUSEBOX_CONV_BACKEND=own; the direct kernels (direct.cu) remain for what it cannot take.
// On compute capability 9.0 run_implicit_gemm tries the CUTLASS Hopper kernels
// (kernels/conv/cutlass/) first and runs its own main loop where they do not take the problem.
//
//   if (auto why = implicit_gemm_cannot_implement(n, op, in, out)) ... direct kernel
//   std::string plan = run_implicit_gemm(ctx, n, op, in, out, epilogue);
#pragma once

#include <optional>
#include <string>

#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/conv/problem.h"

namespace fusebox::cuda {

// Why the implicit GEMM cannot run the node's convolution (igemm::cannot_implement), or
// nullopt. Inputs and output as the kernels.h entry gets them.
std::optional<std::string> implicit_gemm_cannot_implement(const Node& n, ConvOp op, Inputs in,
                                                          const DeviceTensor& out);

// Records the convolution and the whole epilogue `e` (fprop: bias, activation, residual,
// residual activation; dgrad: bias) on ctx.encoder; returns the plan's description
// (igemm::Plan::describe). Operands that are not dense channels-last are copied first (the
// kernels read NDHWC activations and KRSC filters), and so is an output that is not.
// settings: allow_tf32 (f32 on TF32 tensor cores, else exact) and igemm_tile.
std::string run_implicit_gemm(Context& ctx, const Node& n, ConvOp op, Inputs in, Outputs out,
                              const ConvEpilogueOperands& e, const ConvSettings& settings);

}  // namespace fusebox::cuda
