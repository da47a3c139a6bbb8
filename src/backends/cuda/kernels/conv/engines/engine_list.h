// Each engine's instance (engines/<name>/engine.cpp defines its accessor); engines.cpp orders
// them. Nothing else names an engine's class.
#pragma once

#include "backends/cuda/kernels/conv/engine.h"

namespace fusebox::cuda {

const ConvEngine& cudnn_engine();
const ConvEngine& depthwise_engine();
const ConvEngine& halo_wgrad_engine();
const ConvEngine& patch_wgrad_engine();
const ConvEngine& phase_dgrad_engine();
const ConvEngine& space_to_depth_engine();
const ConvEngine& im2col_engine();
const ConvEngine& cutlass_engine();
const ConvEngine& implicit_gemm_engine();
const ConvEngine& direct_engine();

}  // namespace fusebox::cuda
