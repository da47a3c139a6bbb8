// What the project's own Hopper convolution kernels (halo_wgrad/, patch_wgrad/, phase_dgrad/)
// all require, checked once for their planners' cannot_implement. Host code without CUDA
// types, tested without a GPU through those planners.
#pragma once

#include <optional>
#include <string>

#include "backends/common/conv_geometry.h"
#include "fusebox/core/dtype.h"

namespace fusebox::cuda {

// Why `kernel` (its name in the reason, e.g. "the halo wgrad") cannot take g: not sm_90a,
// not bf16 / f16, groups, not 2-D, operands not 16-byte aligned; nullopt where it can.
std::optional<std::string> own_sm90_2d_refusal(const char* kernel, const ConvGeometry& g,
                                               DType dtype, int compute_capability, bool aligned);

}  // namespace fusebox::cuda
