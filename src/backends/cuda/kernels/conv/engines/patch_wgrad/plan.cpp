// Planning of the patch weight gradient (plan.h).
#include "backends/cuda/kernels/conv/engines/patch_wgrad/plan.h"

#include <algorithm>
#include <limits>

#include "backends/cuda/kernels/conv/own_kernel_checks.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda::patch_wgrad {

std::optional<std::string> cannot_implement(const ConvGeometry& g, DType dtype,
                                            int compute_capability, bool aligned) {
  if (auto why = own_sm90_2d_refusal("the patch wgrad", g, dtype, compute_capability, aligned))
    return why;
  for (int d = 1; d < 3; ++d) {
    if (g.filter[d] != kTap || g.dilation[d] != 1)
      return std::string("the patch wgrad takes 7x7 filters of dilation 1");
    if (g.pad_lo[d] < 0 || g.pad_lo[d] >= kTap)
      return cat("the patch wgrad takes pads below 7, not ", g.pad_lo[d]);
  }
  if (g.in_channels > kChannels)
    return cat("the patch wgrad takes at most ", kChannels, " channels, not ", g.in_channels);
  if (g.out_channels % kFilterBlock != 0)
    return cat("the patch wgrad needs filters in multiples of ", kFilterBlock, " (K ",
               g.out_channels, ")");
  if (g.out[2] > kMaxRowPixels)
    return cat("the patch wgrad takes output rows of at most ", kMaxRowPixels, " pixels, not ",
               g.out[2]);
  if ((g.out[2] - 1) * g.stride[2] + kTap > kMaxXRowPixels)
    return cat("the patch wgrad reads x rows of at most ", kMaxXRowPixels, " pixels (OW ", g.out[2],
               ", stride ", g.stride[2], ")");
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (g.batch * g.out_size() * g.out_channels > kMax || g.batch * g.in_size() * 4 > kMax)
    return std::string("the patch wgrad indexes tensors below 2^31 elements");
  return std::nullopt;
}

Plan make_plan(const ConvGeometry& g, DType dtype, int sm_count) {
  Plan p;
  p.dtype = dtype;
  p.row_pixels = int((g.out[2] + 15) / 16 * 16);
  p.x_row_pixels = int((g.out[2] - 1) * g.stride[2] + kTap);
  p.k_blocks = int(g.out_channels / kFilterBlock);
  p.rows = g.batch * g.out[1];
  p.splits = int(
      std::clamp<int64_t>(sm_count / std::max(p.k_blocks, 1), 1, std::max<int64_t>(p.rows / 2, 1)));
  const int64_t count = g.out_channels * kTap * kTap * g.in_channels;
  p.partial_bytes = size_t(p.splits) * size_t(count) * sizeof(float);
  return p;
}

std::string Plan::describe() const {
  return cat("patch wgrad 7x7 ", dtype_name(dtype), " sm90, rows of ", row_pixels, " px, ", splits,
             " splits");
}

}  // namespace fusebox::cuda::patch_wgrad
