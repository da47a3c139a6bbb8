// Planning of the phase dgrad (plan.h).
#include "backends/cuda/kernels/conv/engines/phase_dgrad/plan.h"

#include <algorithm>
#include <limits>

#include "backends/cuda/kernels/conv/own_kernel_checks.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda::phase_dgrad {

std::optional<std::string> cannot_implement(const ConvGeometry& g, DType dtype,
                                            int compute_capability, bool aligned) {
  if (auto why = own_sm90_2d_refusal("the phase dgrad", g, dtype, compute_capability, aligned))
    return why;
  for (int d = 1; d < 3; ++d) {
    // dy's extent is then (D + pad_hi - 1) / 2 + 1 for any trailing pad: the kernel reads dy
    // at i and i + 1 within it and writes every dx position 2i + a below D.
    if (g.filter[d] != 3 || g.stride[d] != 2 || g.dilation[d] != 1 || g.pad_lo[d] != 1)
      return std::string(
          "the phase dgrad takes 3x3 filters of stride 2, dilation 1, leading pads 1");
  }
  if (g.in_channels % kChannelBlock != 0 || g.out_channels % kChannelBlock != 0)
    return cat("the phase dgrad needs channels and filters in multiples of ", kChannelBlock, " (C ",
               g.in_channels, ", K ", g.out_channels, ")");
  if (g.out_channels > kMaxFilterSteps * kChannelBlock)
    return cat("the phase dgrad keeps at most ", kMaxFilterSteps * kChannelBlock,
               " filters in shared memory (K ", g.out_channels, ")");
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (g.batch * g.in_size() * g.in_channels > kMax ||
      g.batch * g.out_size() * g.out_channels > kMax || 9 * g.in_channels * g.out_channels > kMax)
    return std::string("the phase dgrad indexes tensors below 2^31 elements");
  return std::nullopt;
}

Plan make_plan(const ConvGeometry& g, DType dtype, int sm_count) {
  Plan p;
  p.dtype = dtype;
  p.lattice_h = (g.in[1] + 1) / 2;
  p.lattice_w = (g.in[2] + 1) / 2;
  p.tiles = (g.batch * p.lattice_h * p.lattice_w + kLatticeBlock - 1) / kLatticeBlock;
  p.c_blocks = int(g.in_channels / kChannelBlock);
  const int64_t per_block = std::clamp<int64_t>(std::max(sm_count, 1) / p.c_blocks, 1, p.tiles);
  p.ctas = int(per_block * p.c_blocks);
  return p;
}

std::string Plan::describe() const {
  return cat("phase dgrad 3x3s2 ", dtype_name(dtype), " sm90, ", tiles, " x ", c_blocks,
             " tiles on ", ctas, " CTAs");
}

}  // namespace fusebox::cuda::phase_dgrad
