// The window arithmetic of the windowed pools (max_pool, avg_pool and their gradients),
// shared by the CPU reference (cpu/pool_window.h) and the CUDA kernels
// (cuda/kernels/pool/window.cuh), host and device. Includes only standard headers, so CUDA
// device code may include it.
//
// Along spatial dim d, output position o's window has taps j < kernel[d] at input position
//   o * stride[d] - pad_lo[d] + j * dilation[d].
// Its in-bounds taps are consecutive in j (a TapRange). avg_pool divides by the number of
// in-bounds taps, or with count_include_pad by the taps inside [-pad_lo, D + pad_hi):
// padding counts, but the positions past the end padding that ceil_mode's last window may
// reach do not (ONNX / PyTorch). O itself (floor or ceil mode) is shape inference's.
// Rank-agnostic: 1-D and 2-D pools are 3-D ones with leading extents of 1 (kernel 1,
// stride 1, dilation 1, pads 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/common/index_math.h"

namespace fusebox {

struct PoolAttrs;  // fusebox/ir/ops.h; not included here, to keep this header device-safe

// Plain arrays, not std::array: CUDA kernels take it by value and index it on the device.
struct PoolWindow {
  int64_t batch = 0, channels = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0}, pad_hi[3] = {0, 0, 0};

  FUSEBOX_HOST_DEVICE int64_t planes() const { return batch * channels; }
  FUSEBOX_HOST_DEVICE int64_t in_size() const { return in[0] * in[1] * in[2]; }
  FUSEBOX_HOST_DEVICE int64_t out_size() const { return out[0] * out[1] * out[2]; }
};

// The window of a pool from x [N, C, D...] to y [N, C, O...] (dx and dy for the backward
// ops), checking the shapes and the normalised attributes; a mismatch is an Error naming
// `where` (the node). Host only (pool_window.cpp).
PoolWindow make_pool_window(const PoolAttrs& attrs, const std::vector<int64_t>& x,
                            const std::vector<int64_t>& y, const std::string& where);

// The taps of one output position along one dim.
struct TapRange {
  int64_t first = 0;   // input position of the first in-bounds tap
  int64_t count = 0;   // in-bounds taps, at first + i * dilation
  int64_t padded = 0;  // taps inside [-pad_lo, D + pad_hi)
};

// Taps j of a window starting at `start` whose position start + j * dilation is below
// `bound`, clamped to the kernel's [0, kernel].
FUSEBOX_HOST_DEVICE inline int64_t taps_below(int64_t start, int64_t dilation, int64_t kernel,
                                              int64_t bound) {
  return clamp_index(ceil_div(bound - start, dilation), 0, kernel);
}

// The taps of output position o along dim d.
FUSEBOX_HOST_DEVICE inline TapRange window_taps(const PoolWindow& w, int d, int64_t o) {
  const int64_t start = o * w.stride[d] - w.pad_lo[d], dil = w.dilation[d], k = w.kernel[d];
  const int64_t j_first = taps_below(start, dil, k, 0);
  const int64_t j_end = taps_below(start, dil, k, w.in[d]);
  TapRange t;
  t.first = start + j_first * dil;
  t.count = j_end > j_first ? j_end - j_first : 0;
  t.padded =
      taps_below(start, dil, k, w.in[d] + w.pad_hi[d]) - taps_below(start, dil, k, -w.pad_lo[d]);
  return t;
}

// avg_pool's divisor of the output whose taps along the three dims are t0, t1, t2; >= 1
// (shape inference keeps the pads smaller than the window).
FUSEBOX_HOST_DEVICE inline int64_t window_divisor(const TapRange& t0, const TapRange& t1,
                                                  const TapRange& t2, bool count_include_pad) {
  return count_include_pad ? t0.padded * t1.padded * t2.padded : t0.count * t1.count * t2.count;
}

// The outputs along one dim whose windows may hold an input position: [first, last]
// (empty when first > last); those that do are the ones with is_window_tap.
struct OutputSpan {
  int64_t first = 0, last = -1;
};

// o * stride = i + pad_lo - j * dilation for a tap j < kernel, so o lies in
// [ceil((i + pad_lo - (kernel - 1) * dilation) / stride), floor((i + pad_lo) / stride)],
// clipped to the output.
FUSEBOX_HOST_DEVICE inline OutputSpan windows_holding(const PoolWindow& w, int d, int64_t i) {
  const int64_t reach = i + w.pad_lo[d];
  OutputSpan s;
  const int64_t lowest = ceil_div(reach - (w.kernel[d] - 1) * w.dilation[d], w.stride[d]);
  s.first = lowest > 0 ? lowest : 0;
  const int64_t highest = reach / w.stride[d];  // reach >= 0: i >= 0, pad_lo >= 0
  s.last = highest < w.out[d] - 1 ? highest : w.out[d] - 1;
  return s;
}

// Whether input position i is a tap of output o's window along dim d (o from windows_holding).
FUSEBOX_HOST_DEVICE inline bool is_window_tap(const PoolWindow& w, int d, int64_t i, int64_t o) {
  return (i + w.pad_lo[d] - o * w.stride[d]) % w.dilation[d] == 0;
}

}  // namespace fusebox
