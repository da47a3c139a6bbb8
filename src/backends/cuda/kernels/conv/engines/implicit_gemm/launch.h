// Launching a planned implicit-GEMM convolution (plan.h) on the encoder: one kernel per op,
// compiled in fprop.cu, dgrad.cu and wgrad.cu (launch.cuh instantiates the tiles plan.h's
// tile_available names). The caller (implicit_gemm.cpp) has filled the plan's pointers and
// passes what they read and write.
#pragma once

#include "backends/cuda/kernels/conv/engines/implicit_gemm/plan.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda::igemm {

void launch_fprop(Context& ctx, const Plan& plan, const BufferList& reads,
                  const BufferList& writes);
void launch_dgrad(Context& ctx, const Plan& plan, const BufferList& reads,
                  const BufferList& writes);
// The wgmma tiles (conv_sm90a.cu): fprop, and dgrad reading the transposed filter (operands.cuh
// DgradWT) from plan.params.w.
void launch_sm90(Context& ctx, const Plan& plan, const BufferList& reads, const BufferList& writes);
// With splits > 1 the kernel writes plan.params.partial (`partial`) and a second kernel adds
// the splits into `dw` in order.
void launch_wgrad(Context& ctx, const Plan& plan, const BufferList& reads, const BufferRange& dw,
                  const BufferRange* partial);

}  // namespace fusebox::cuda::igemm
