// The shared prerequisites of the project's own Hopper convolution kernels (own_kernel_checks.h).
#include "backends/cuda/kernels/conv/own_kernel_checks.h"

#include "fusebox/core/error.h"

namespace fusebox::cuda {

std::optional<std::string> own_sm90_2d_refusal(const char* kernel, const ConvGeometry& g,
                                               DType dtype, int compute_capability, bool aligned) {
  if (compute_capability != 90)
    return cat(kernel, " is sm_90a code; compute capability ", compute_capability / 10, ".",
               compute_capability % 10);
  if (dtype != DType::bf16 && dtype != DType::f16)
    return cat(kernel, " takes bf16 and f16, not ", dtype_name(dtype));
  if (g.groups != 1) return cat(kernel, " takes no groups");
  if (g.spatial_rank != 2) return cat(kernel, " is 2-D; this is ", g.spatial_rank, "-D");
  if (!aligned) return cat(kernel, " needs 16-byte aligned operands");
  return std::nullopt;
}

}  // namespace fusebox::cuda
