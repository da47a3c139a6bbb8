#include "backends/common/resize_map.h"

#include "fusebox/core/error.h"
#include "fusebox/ir/ops.h"

namespace fusebox {

static_assert(uint8_t(ResizeMode::cubic) == kResizeCubic &&
              uint8_t(ResizeCoordinates::tf_crop_and_resize) == kTfCropAndResize &&
              uint8_t(ResizeCoordinates::tf_half_pixel_for_nn) == kTfHalfPixelForNn &&
              uint8_t(ResizeCoordinates::half_pixel_symmetric) == kHalfPixelSymmetric &&
              uint8_t(ResizeNearest::ceil) == kNearestCeil);

ResizeMap make_resize_map(const ResizeAttrs& a, const Shape& x, const std::string& where) {
  const size_t r = x.size();
  FUSEBOX_CHECK(r <= size_t(kResizeMaxRank), where, "resize of rank ", r, "; at most ",
                kResizeMaxRank, " dims");
  FUSEBOX_CHECK(a.sizes.size() == r && a.scales.size() == r && a.roi_start.size() == r &&
                    a.roi_end.size() == r,
                where, "attributes are not normalised to the rank ", r, " of ", shape_str(x));
  ResizeMap m;
  m.rank = int(r);
  for (size_t d = 0; d < r; ++d) {
    m.in[d] = x[d];
    m.out[d] = a.sizes[d];
    m.scale[d] = a.scales[d];
    m.roi_start[d] = a.roi_start[d];
    m.roi_end[d] = a.roi_end[d];
  }
  m.mode = uint8_t(a.mode);
  m.coordinates = uint8_t(a.coordinates);
  m.nearest = uint8_t(a.nearest);
  m.exclude_outside = a.exclude_outside;
  m.cubic_a = a.cubic_a;
  m.extrapolation = a.extrapolation_value;
  return m;
}

}  // namespace fusebox
