// The window geometry of the windowed pools, shared by the forward kernels (pool.cpp)
// and their gradients (pool_backward.cpp), so both walk exactly the same taps: the
// backends' window arithmetic (backends/common/pool_window.h, which defines the windows
// and avg_pool's divisor) with each output's taps tabulated once per dim.
// Rank-agnostic like conv: 1-D and 2-D pools are 3-D ones with leading extents of 1.
#pragma once

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/common/pool_window.h"
#include "kernel_util.h"

namespace fusebox::cpu {

struct PoolGeometry : PoolWindow {
  std::array<std::vector<TapRange>, 3> taps;  // taps[d][o]

  // avg_pool's divisor for output (o0, o1, o2).
  int64_t divisor(int64_t o0, int64_t o1, int64_t o2, bool count_include_pad) const {
    return window_divisor(taps[0][size_t(o0)], taps[1][size_t(o1)], taps[2][size_t(o2)],
                          count_include_pad);
  }
};

// The geometry of a pool from x [N, C, D...] to y [N, C, O...] (for the backward ops:
// dx and dy), checked by make_pool_window; `where` names the node in errors.
PoolGeometry make_pool_geometry(const PoolAttrs& a, const Shape& x, const Shape& y,
                                const std::string& where);

// Calls tap(i) with the plane offset i = (i0 * in[1] + i1) * in[2] + i2 of every
// in-bounds tap of output (o0, o1, o2), in row-major order within the window.
template <class F>
void for_each_tap(const PoolGeometry& g, int64_t o0, int64_t o1, int64_t o2, F&& tap) {
  const TapRange &t0 = g.taps[0][size_t(o0)], &t1 = g.taps[1][size_t(o1)],
                 &t2 = g.taps[2][size_t(o2)];
  for (int64_t a = 0; a < t0.count; ++a) {
    const int64_t i0 = t0.first + a * g.dilation[0];
    for (int64_t b = 0; b < t1.count; ++b) {
      const int64_t row = (i0 * g.in[1] + t1.first + b * g.dilation[1]) * g.in[2] + t2.first;
      for (int64_t c = 0; c < t2.count; ++c) tap(row + c * g.dilation[2]);
    }
  }
}

// max_pool's choice in one window of x_plane: the largest value (padding never wins),
// the first of equal maxima in row-major window order, a NaN winning and staying.
// Returns its plane offset, or -1 for a window with no in-bounds tap (possible only
// with dilation), and sets `best` (-inf for such a window).
template <class T, class C = compute_t<T>>
int64_t window_argmax(const PoolGeometry& g, const T* x_plane, int64_t o0, int64_t o1, int64_t o2,
                      C* best) {
  C value = -std::numeric_limits<C>::infinity();
  int64_t at = -1;
  for_each_tap(g, o0, o1, o2, [&](int64_t i) {
    const C v = to_compute(x_plane[i]);
    // Take v when it is larger or NaN, unless a NaN is already held.
    if (at < 0 || (!std::isnan(value) && !(v <= value))) {
      value = v;
      at = i;
    }
  });
  *best = value;
  return at;
}

}  // namespace fusebox::cpu
