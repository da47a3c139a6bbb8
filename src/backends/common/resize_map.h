// The sampling arithmetic of resize and resize_backward (ops.h), shared by the CPU reference
// (cpu/resize.cpp) and the CUDA kernels (cuda/kernels/shape/resize.cu), host and device.
// Includes only standard headers and index_math.h, so CUDA device code may include it.
//
// Every dim is resampled on its own: output index o of dim d reads source coordinate c (in
// x's index space, f64), and c gives that dim's taps: 1 (nearest), 2 (linear) or 4 (cubic)
// input indices with weights. An output element is the sum over every combination of its
// dims' taps of the product of their weights times x at those indices; the backward adds
// dy times the same products into dx. Taps of weight 0 are dropped, so a dim whose
// coordinate is integral (an unscaled N or C dim) costs one tap, not two or four.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/common/index_math.h"

namespace fusebox {

struct ResizeAttrs;  // fusebox/ir/ops.h; not included here, to keep this header device-safe

inline constexpr int kResizeMaxRank = 8;

// ops.h's ResizeMode / ResizeCoordinates / ResizeNearest values (checked in resize_map.cpp).
enum ResizeModeCode : uint8_t { kResizeNearest, kResizeLinear, kResizeCubic };
enum ResizeCoordinatesCode : uint8_t {
  kHalfPixel,
  kHalfPixelSymmetric,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfCropAndResize,
  kTfHalfPixelForNn
};
enum ResizeNearestCode : uint8_t {
  kRoundPreferFloor,
  kRoundPreferCeil,
  kNearestFloor,
  kNearestCeil
};

// Plain arrays: CUDA kernels take it by value.
struct ResizeMap {
  int rank = 0;
  int64_t in[kResizeMaxRank] = {}, out[kResizeMaxRank] = {};
  double scale[kResizeMaxRank] = {}, roi_start[kResizeMaxRank] = {}, roi_end[kResizeMaxRank] = {};
  uint8_t mode = kResizeNearest, coordinates = kHalfPixel, nearest = kRoundPreferFloor;
  bool exclude_outside = false;
  double cubic_a = -0.75, extrapolation = 0.0;

  FUSEBOX_HOST_DEVICE int64_t out_size() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= out[d];
    return n;
  }
  FUSEBOX_HOST_DEVICE int64_t in_size() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= in[d];
    return n;
  }
};

// From the node's normalised attributes and x's shape; an Error naming `where` when the
// rank passes kResizeMaxRank. Host only (resize_map.cpp).
ResizeMap make_resize_map(const ResizeAttrs& attrs, const std::vector<int64_t>& x,
                          const std::string& where);

// The source coordinate of output index o along dim d (ops.h's table).
FUSEBOX_HOST_DEVICE inline double resize_source(const ResizeMap& m, int d, int64_t o) {
  const double in = double(m.in[d]), out = double(m.out[d]), s = m.scale[d], x = double(o);
  // L of ops.h: align_corners and tf_crop_and_resize divide by it where it is not 1.
  const double length = s * in;  // unrounded, as ONNX's reference
  switch (m.coordinates) {
    case kHalfPixelSymmetric: {
      const double adjustment = out / (s * in);
      return in / 2 * (1 - adjustment) + (x + 0.5) / s - 0.5;
    }
    case kPytorchHalfPixel:
      return out > 1 ? (x + 0.5) / s - 0.5 : 0.0;
    case kAlignCorners:
      return length != 1 ? x * (in - 1) / (length - 1) : 0.0;
    case kAsymmetric:
      return x / s;
    case kTfCropAndResize: {
      const double r0 = m.roi_start[d], r1 = m.roi_end[d];
      return length != 1 ? r0 * (in - 1) + x * (r1 - r0) * (in - 1) / (length - 1)
                         : 0.5 * (r0 + r1) * (in - 1);
    }
    case kTfHalfPixelForNn:
      return (x + 0.5) / s;
    default:  // kHalfPixel
      return (x + 0.5) / s - 0.5;
  }
}

// One dim's taps for one output index.
struct ResizeTaps {
  int count = 0;
  bool outside = false;  // tf_crop_and_resize read outside [0, in - 1]: extrapolation_value
  int64_t index[4] = {};
  double weight[4] = {};
};

// Keys' cubic convolution weight at distance t (0 <= |t| < 2) with coefficient a.
FUSEBOX_HOST_DEVICE inline double cubic_weight(double t, double a) {
  t = ::fabs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0;
}

// Where one dim's taps start for output index o: the source coordinate's floor `base` (the
// coordinate first clamped to [-3, last + 3]: far outside, every tap clamps to the edge or is
// excluded all the same, and int64_t(f) stays defined for tiny scales) and its fraction t;
// `outside` when tf_crop_and_resize reads outside [0, in - 1] (extrapolation_value).
struct ResizeTapStart {
  bool outside = false;
  int64_t base = 0;
  double t = 0;
};

FUSEBOX_HOST_DEVICE inline ResizeTapStart resize_tap_start(const ResizeMap& m, int d, int64_t o) {
  ResizeTapStart start;
  const double c = resize_source(m, d, o);
  const int64_t last = m.in[d] - 1;
  if (m.coordinates == kTfCropAndResize && (c < 0 || c > double(last))) {
    start.outside = true;
    return start;
  }
  const double cc = ::fmin(::fmax(c, -3.0), double(last) + 3);
  const double f = ::floor(cc);
  start.base = int64_t(f), start.t = cc - f;
  return start;
}

// Nearest's rounding of a start to the one index it reads (before clamping).
FUSEBOX_HOST_DEVICE inline int64_t resize_nearest_index(const ResizeMap& m,
                                                        const ResizeTapStart& s) {
  switch (m.nearest) {
    case kRoundPreferFloor:
      return s.t > 0.5 ? s.base + 1 : s.base;
    case kRoundPreferCeil:
      return s.t >= 0.5 ? s.base + 1 : s.base;
    case kNearestCeil:
      return s.t > 0 ? s.base + 1 : s.base;
    default:  // kNearestFloor
      return s.base;
  }
}

FUSEBOX_HOST_DEVICE inline ResizeTaps resize_taps(const ResizeMap& m, int d, int64_t o) {
  ResizeTaps taps;
  const ResizeTapStart start = resize_tap_start(m, d, o);
  if (start.outside) {
    taps.outside = true;
    return taps;
  }
  const int64_t last = m.in[d] - 1, base = start.base;
  const double t = start.t;
  if (m.mode == kResizeNearest) {
    taps.count = 1;
    taps.index[0] = clamp_index(resize_nearest_index(m, start), 0, last);
    taps.weight[0] = 1;
    return taps;
  }
  int n = 0;
  int64_t idx[4];
  double w[4];
  if (m.mode == kResizeLinear) {
    idx[0] = base, w[0] = 1 - t;
    idx[1] = base + 1, w[1] = t;
    n = 2;
  } else {
    for (int j = 0; j < 4; ++j) {
      idx[j] = base - 1 + j;
      w[j] = cubic_weight(t - double(j - 1), m.cubic_a);
    }
    n = 4;
  }
  if (m.exclude_outside) {
    double sum = 0;
    for (int j = 0; j < n; ++j) {
      if (idx[j] < 0 || idx[j] > last) w[j] = 0;
      sum += w[j];
    }
    for (int j = 0; j < n; ++j) w[j] = sum != 0 ? w[j] / sum : 0;
  }
  for (int j = 0; j < n; ++j) {
    if (w[j] == 0) continue;
    taps.index[taps.count] = clamp_index(idx[j], 0, last);
    taps.weight[taps.count] = w[j];
    ++taps.count;
  }
  return taps;
}

// Nearest and linear taps (exclude_outside off, no crop) in two fixed slots: resize_taps's
// taps in its order, with weight 0 where resize_taps drops one (nearest's second slot always),
// so a caller that skips weight-0 slots sums the same terms in the same order. No running
// count indexes the arrays, which keeps them in registers on the GPU (resize_taps's
// compaction puts its arrays in local memory).
struct ResizeTaps2 {
  static constexpr int count = 2;
  int64_t index[2] = {};
  double weight[2] = {};
};

FUSEBOX_HOST_DEVICE inline bool resize_has_taps2(const ResizeMap& m) {
  return (m.mode == kResizeNearest || (m.mode == kResizeLinear && !m.exclude_outside)) &&
         m.coordinates != kTfCropAndResize;
}

FUSEBOX_HOST_DEVICE inline ResizeTaps2 resize_taps2(const ResizeMap& m, int d, int64_t o) {
  ResizeTaps2 taps;
  const ResizeTapStart start = resize_tap_start(m, d, o);
  const int64_t last = m.in[d] - 1;
  if (m.mode == kResizeNearest) {
    taps.index[0] = clamp_index(resize_nearest_index(m, start), 0, last);
    taps.weight[0] = 1;
    return taps;
  }
  taps.index[0] = clamp_index(start.base, 0, last), taps.weight[0] = 1 - start.t;
  taps.index[1] = clamp_index(start.base + 1, 0, last), taps.weight[1] = start.t;
  return taps;
}

// The output indices of dim d whose taps may read input index i: a superset, [first, last]
// (callers check each one's taps). The coordinates of the modes resize's GPU kernels gather
// with are affine in the output index, c(o) = a o + b, and a tap reads within 2 of its
// coordinate (1 for nearest and linear); the edge indices also take every clamped tap beyond.
struct ResizeOutputRange {
  int64_t first = 0, last = -1;
};

FUSEBOX_HOST_DEVICE inline ResizeOutputRange resize_outputs_reading(const ResizeMap& m, int d,
                                                                    int64_t i) {
  const int64_t out = m.out[d], in_last = m.in[d] - 1;
  ResizeOutputRange r{0, out - 1};
  if (out <= 1) return r;
  const double b = resize_source(m, d, 0), a = resize_source(m, d, 1) - b;
  if (!(a > 0)) return r;
  const double reach = m.mode == kResizeCubic ? 2 : 1;
  // Bounded before the conversion: a tiny a (a huge downscale) leaves int64_t's range.
  const double first = ::floor((double(i) - reach - b) / a) - 1;
  const double last = ::ceil((double(i) + reach - b) / a) + 1;
  if (i > 0 && first > 0) r.first = first < double(out) ? int64_t(first) : out;
  if (i < in_last && last < double(out - 1)) r.last = last >= 0 ? int64_t(last) : -1;
  return r;
}

// Calls f(input offset, weight) for every tap combination of output element `e` (x
// contiguous); returns false (and calls nothing) when some dim reads outside the crop.
template <class F>
FUSEBOX_HOST_DEVICE inline bool for_each_resize_tap(const ResizeMap& m, int64_t e, F&& f) {
  ResizeTaps taps[kResizeMaxRank];
  for (int d = m.rank - 1; d >= 0; --d) {
    const int64_t o = e % m.out[d];
    e /= m.out[d];
    taps[d] = resize_taps(m, d, o);
    if (taps[d].outside) return false;
  }
  // Every tap excluded (exclude_outside far outside the input): the sum is 0.
  for (int d = 0; d < m.rank; ++d)
    if (taps[d].count == 0) return true;
  int pick[kResizeMaxRank] = {};
  while (true) {
    int64_t offset = 0;
    double weight = 1;
    for (int d = 0; d < m.rank; ++d) {
      offset = offset * m.in[d] + taps[d].index[pick[d]];
      weight *= taps[d].weight[pick[d]];
    }
    f(offset, weight);
    int d = m.rank - 1;  // the next combination, innermost dim fastest
    while (d >= 0 && ++pick[d] == taps[d].count) pick[d--] = 0;
    if (d < 0) return true;
  }
}

}  // namespace fusebox
