// Recording a planned patch weight gradient (plan.h) on the encoder: the kernel (compiled for
// sm_90a alone, patch_wgrad_sm90a.cu) writes each run's f32 sums into its slice of `partial`,
// then sum_splits adds the slices in order into dw.
#pragma once

#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/engines/patch_wgrad/plan.h"
#include "backends/cuda/kernels/conv/wgrad_operands.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda::patch_wgrad {

// `reads`: x's and dy's bytes; `written`: dw's; `partial`: the partial buffer's.
void record(Context& ctx, const Plan& plan, const ConvGeometry& g, const WgradOperands& o,
            const BufferList& reads, const BufferRange& written, const BufferRange& partial);

}  // namespace fusebox::cuda::patch_wgrad
