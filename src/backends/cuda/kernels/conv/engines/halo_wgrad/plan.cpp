// Planning of the halo weight gradient (plan.h).
#include "backends/cuda/kernels/conv/engines/halo_wgrad/plan.h"

#include <algorithm>
#include <limits>

#include "backends/cuda/kernels/conv/own_kernel_checks.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda::halo_wgrad {

std::optional<std::string> cannot_implement(const ConvGeometry& g, DType dtype,
                                            int compute_capability, bool aligned) {
  if (auto why = own_sm90_2d_refusal("the halo wgrad", g, dtype, compute_capability, aligned))
    return why;
  for (int d = 1; d < 3; ++d) {
    if (g.filter[d] != 3 || g.stride[d] != 1 || g.dilation[d] != 1 || g.pad_lo[d] != 1 ||
        g.out[d] != g.in[d])
      return std::string("the halo wgrad takes 3x3 filters of stride 1, dilation 1, pads 1");
  }
  if (g.in_channels % kChannelBlock != 0 || g.out_channels % kChannelBlock != 0)
    return cat("the halo wgrad needs channels and filters in multiples of ", kChannelBlock, " (C ",
               g.in_channels, ", K ", g.out_channels, ")");
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const int64_t pixels = g.batch * g.in_size();
  if (pixels * std::max(g.in_channels, g.out_channels) > kMax || pixels > kMax / 2)
    return std::string("the halo wgrad indexes tensors below 2^31 elements");
  return std::nullopt;
}

Plan make_plan(const ConvGeometry& g, DType dtype, int sm_count) {
  Plan p;
  p.dtype = dtype;
  const int64_t width = g.in[2];
  p.segments = int((width + kMaxRowPixels - 1) / kMaxRowPixels);
  p.segment_width = int((width + p.segments - 1) / p.segments);
  p.row_pixels = (p.segment_width + 15) / 16 * 16;
  p.k_blocks = int(g.out_channels / kChannelBlock);
  p.c_blocks = int(g.in_channels / kChannelBlock);
  p.rows = g.batch * g.in[1] * p.segments;
  const int64_t blocks = int64_t(p.k_blocks) * p.c_blocks;
  p.splits = int(std::clamp<int64_t>(sm_count / std::max<int64_t>(blocks, 1), 1,
                                     std::max<int64_t>(p.rows / 2, 1)));
  const int64_t count = g.out_channels * 9 * g.in_channels;
  p.partial_bytes = size_t(p.splits) * size_t(count) * sizeof(float);
  return p;
}

bool preferred(const ConvGeometry& g) {
  // One filter block: CUTLASS's tiles are then one tile high and re-read x's nine taps per
  // column tile (ResNet-50's layer 1). With more filters they reuse x across the filter tiles
  // and win (H200: layers 2-4, 0.0287 / 0.0276 / 0.0352 ms against 0.080 / 0.120 / 0.23 here).
  return g.out_channels == kChannelBlock;
}

std::string Plan::describe() const {
  return cat("halo wgrad 3x3 ", dtype_name(dtype), " sm90, rows of ", row_pixels, " px",
             segments > 1 ? cat(" (", segments, " segments)") : std::string(), ", ", splits,
             " splits");
}

}  // namespace fusebox::cuda::halo_wgrad
