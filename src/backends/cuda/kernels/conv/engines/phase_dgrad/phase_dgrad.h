// Recording a planned phase dgrad (plan.h) on the encoder: one persistent kernel (compiled
// for sm_90a alone, phase_dgrad_sm90a.cu) writing every pixel of dx.
#pragma once

#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/engines/phase_dgrad/plan.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda::phase_dgrad {

// dy [N][P][Q][K], w [K][3][3][C] (KRSC) and dx [N][H][W][C], channels-last. `reads`: dy's
// and w's bytes; `written`: dx's.
void record(Context& ctx, const Plan& plan, const ConvGeometry& g, const void* dy, const void* w,
            void* dx, const BufferList& reads, const BufferRange& written);

}  // namespace fusebox::cuda::phase_dgrad
