// The operands of the project's own weight-gradient kernels (halo_wgrad/, patch_wgrad/):
// dense channels-last x [N][H][W][C] and dy [N][OH][OW][K], dw [K][R][S][C], and the plan's
// partial_bytes of f32 sums (one slice per run of rows, added in order by sum_splits).
#pragma once

namespace fusebox::cuda {

struct WgradOperands {
  const void* x = nullptr;
  const void* dy = nullptr;
  void* dw = nullptr;
  float* partial = nullptr;
};

}  // namespace fusebox::cuda
