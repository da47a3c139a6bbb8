// The rule of loss_scale_update (ops.h; PyTorch's GradScaler.update, torch's
// _amp_update_scale_), for both backends. Includes only standard headers, so CUDA device
// code may include it.
#pragma once

#include <cstdint>

#include "backends/common/index_math.h"  // FUSEBOX_HOST_DEVICE

namespace fusebox {

// One step of the scaler: the factor the scale is multiplied by (backoff, growth or 1)
// and the next growth tracker and skipped-step count.
struct LossScaleStep {
  double factor;
  int64_t growth_tracker;
  int64_t skipped;
};

// `found`: this step's gradients held an infinity or a NaN. The caller multiplies the
// scale by `factor` in f64, rounds the product to the scale's dtype and keeps the old
// scale when the rounded product is not finite (a growth past the dtype's range).
FUSEBOX_HOST_DEVICE inline LossScaleStep loss_scale_step(bool found, int64_t growth_tracker,
                                                         int64_t skipped, double growth_factor,
                                                         double backoff_factor,
                                                         int64_t growth_interval) {
  if (found) return {backoff_factor, 0, skipped + 1};
  const int64_t successful = growth_tracker + 1;
  if (successful == growth_interval) return {growth_factor, 0, skipped};
  return {1.0, successful, skipped};
}

}  // namespace fusebox
