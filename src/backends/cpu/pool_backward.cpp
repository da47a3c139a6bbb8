// Gradients of the windowed pools, over the forward's window geometry (pool_window.h).
//
// max_pool_backward: each output's dy goes to its window's max, found exactly as the
//   forward finds it (the first of equal maxima in row-major window order; a window
//   with no in-bounds tap sends nowhere).
// avg_pool_backward: each output's dy / divisor goes to every in-bounds tap of its
//   window (the divisor as the forward's, count_include_pad or not).
// Windows overlap, so each (n, c) plane is one task scattering into its own dx plane
// (no races); the shares are computed in compute_t and summed in an f64 scratch plane,
// rounded once.
#include <algorithm>
#include <vector>

#include "kernel_util.h"
#include "kernels.h"
#include "pool_window.h"

namespace fusebox::cpu {

namespace {

// Calls scatter(plane, o0, o1, o2, o, dx_plane) for every output o of every plane, with
// dx_plane a zeroed f64 plane that is then rounded into dx.
template <class T, class F>
void for_each_plane_scatter(const PoolGeometry& g, Tensor& dx, F&& scatter) {
  T* pdx = dx.data<T>();
  const int64_t in_size = g.in_size();
  parallel_for(g.planes(), 1, [&](int64_t p0, int64_t p1) {
    std::vector<double> plane(static_cast<size_t>(in_size));
    for (int64_t p = p0; p < p1; ++p) {
      std::fill(plane.begin(), plane.end(), 0.0);
      int64_t o = p * g.out_size();
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2, ++o) scatter(p, o0, o1, o2, o, plane.data());
      for (int64_t i = 0; i < in_size; ++i) pdx[p * in_size + i] = convert<T>(plane[size_t(i)]);
    }
  });
}

const PoolAttrs& checked_pool(const Node& n, const Tensor& dy, const Tensor& dx) {
  FUSEBOX_CHECK(dy.dtype() == dx.dtype(), node_label(n), "dy is ", dtype_name(dy.dtype()),
                " but dx is ", dtype_name(dx.dtype()));
  return std::get<PoolBackwardAttrs>(n.attrs).pool;
}

}  // namespace

// (dy, x) -> dx
void max_pool_backward(const Node& n, Inputs in, Outputs out) {
  const Tensor &dy = *in[0], &x = *in[1];
  Tensor& dx = out[0];
  const PoolAttrs& attrs = checked_pool(n, dy, dx);
  FUSEBOX_CHECK(x.shape() == dx.shape() && x.dtype() == dx.dtype(), node_label(n), "x ",
                shape_str(x.shape()), " and dx ", shape_str(dx.shape()), " differ");
  const PoolGeometry g = make_pool_geometry(attrs, dx.shape(), dy.shape(), node_label(n));
  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (std::is_floating_point_v<C>) {
      const T* px = x.data<T>();
      const T* pdy = dy.data<T>();
      for_each_plane_scatter<T>(
          g, dx, [&](int64_t p, int64_t o0, int64_t o1, int64_t o2, int64_t o, double* plane) {
            C best;
            const int64_t at = window_argmax(g, px + p * g.in_size(), o0, o1, o2, &best);
            if (at >= 0) plane[at] += double(to_compute(pdy[o]));
          });
    }
  });
}

// (dy) -> dx
void avg_pool_backward(const Node& n, Inputs in, Outputs out) {
  const Tensor& dy = *in[0];
  Tensor& dx = out[0];
  const PoolAttrs& attrs = checked_pool(n, dy, dx);
  const PoolGeometry g = make_pool_geometry(attrs, dx.shape(), dy.shape(), node_label(n));
  visit_float(n, dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (std::is_floating_point_v<C>) {
      const T* pdy = dy.data<T>();
      for_each_plane_scatter<T>(
          g, dx, [&](int64_t, int64_t o0, int64_t o1, int64_t o2, int64_t o, double* plane) {
            // The divisor is >= 1: shape inference keeps the pads smaller than the window.
            const C share = to_compute(pdy[o]) / C(g.divisor(o0, o1, o2, attrs.count_include_pad));
            for_each_tap(g, o0, o1, o2, [&](int64_t i) { plane[i] += double(share); });
          });
    }
  });
}

}  // namespace fusebox::cpu
