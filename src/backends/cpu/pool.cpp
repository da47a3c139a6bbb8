// Pooling: max_pool (with optional indices), avg_pool and global_avg_pool.
//
// Windowed pools, for each (n, c) plane and output position o:
//   window along each spatial dim d: taps j < kernel[d] at input position
//     o[d] * stride[d] - pad_begin[d] + j * dilation[d]
//   max_pool: the largest in-bounds value (padding never wins) and, optionally, its
//     index into the flattened x (row-major over N, C, D...; the first of equal
//     maxima; a NaN wins and stays). A window with no in-bounds tap (possible only
//     with dilation) gives -inf and index -1.
//   avg_pool: the sum of the in-bounds values divided by the number of in-bounds taps,
//     or with count_include_pad by the taps inside [-pad_begin, D + pad_end): padding
//     counts, but the positions past the end padding that ceil_mode's last window
//     may reach do not (ONNX / PyTorch).
// Rank-agnostic like conv: 1-D and 2-D pools are 3-D ones with leading extents of 1.
// The window geometry (shared with the gradients and the CUDA kernels) is in pool_window.h.
// Values are compared / summed in the compute type (f32 for f16/bf16) and rounded once.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "kernel_util.h"
#include "kernels.h"
#include "pool_window.h"

namespace fusebox::cpu {

PoolGeometry make_pool_geometry(const PoolAttrs& a, const Shape& x, const Shape& y,
                                const std::string& where) {
  PoolGeometry g{make_pool_window(a, x, y, where)};
  for (int d = 0; d < 3; ++d) {
    g.taps[size_t(d)].resize(size_t(g.out[d]));
    for (int64_t o = 0; o < g.out[d]; ++o) g.taps[size_t(d)][size_t(o)] = window_taps(g, d, o);
  }
  return g;
}

namespace {

// Calls body(plane, o0, o1) for every row of innermost outputs, in parallel.
template <class F>
void for_each_output_row(const PoolGeometry& g, F&& body) {
  const int64_t rows_per_plane = g.out[0] * g.out[1];
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(g.out[2], 1));
  parallel_for(g.planes() * rows_per_plane, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      body(r / rows_per_plane, r % rows_per_plane / g.out[1], r % g.out[1]);
  });
}

template <class T>
void max_pool_impl(const PoolGeometry& g, const T* x, T* y, int64_t* indices) {
  for_each_output_row(g, [&](int64_t plane, int64_t o0, int64_t o1) {
    const T* x_plane = x + plane * g.in_size();
    const int64_t at = ((plane * g.out[0] + o0) * g.out[1] + o1) * g.out[2];
    for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
      compute_t<T> best;
      const int64_t best_at = window_argmax(g, x_plane, o0, o1, o2, &best);
      y[at + o2] = convert<T>(best);
      if (indices) indices[at + o2] = best_at < 0 ? -1 : plane * g.in_size() + best_at;
    }
  });
}

template <class T>
void avg_pool_impl(const PoolGeometry& g, bool count_include_pad, const T* x, T* y) {
  using C = compute_t<T>;
  for_each_output_row(g, [&](int64_t plane, int64_t o0, int64_t o1) {
    const T* x_plane = x + plane * g.in_size();
    const int64_t at = ((plane * g.out[0] + o0) * g.out[1] + o1) * g.out[2];
    for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
      C sum = 0;
      for_each_tap(g, o0, o1, o2, [&](int64_t i) { sum += to_compute(x_plane[i]); });
      // The divisor is >= 1: shape inference keeps the pads smaller than the window.
      y[at + o2] = convert<T>(sum / C(g.divisor(o0, o1, o2, count_include_pad)));
    }
  });
}

}  // namespace

// x [N, C, D...] -> y [N, C, O...], indices [N, C, O...] (i64) with return_indices.
void max_pool(const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const auto& attrs = std::get<PoolAttrs>(n.attrs);
  const Tensor& x = *in[0];
  Tensor& y = out[0];
  FUSEBOX_CHECK(x.dtype() == y.dtype(), where, "input is ", dtype_name(x.dtype()),
                " but output is ", dtype_name(y.dtype()));
  const PoolGeometry g = make_pool_geometry(attrs, x.shape(), y.shape(), where);
  int64_t* indices = nullptr;
  if (out.size() > 1) {
    FUSEBOX_CHECK(out[1].dtype() == DType::i64 && out[1].shape() == y.shape(), where,
                  "indices must be i64 ", shape_str(y.shape()));
    indices = out[1].data<int64_t>();
  }
  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<compute_t<T>>)
      max_pool_impl(g, x.data<T>(), y.data<T>(), indices);
  });
}

// x [N, C, D...] -> y [N, C, O...]
void avg_pool(const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const auto& attrs = std::get<PoolAttrs>(n.attrs);
  const Tensor& x = *in[0];
  Tensor& y = out[0];
  FUSEBOX_CHECK(x.dtype() == y.dtype(), where, "input is ", dtype_name(x.dtype()),
                " but output is ", dtype_name(y.dtype()));
  const PoolGeometry g = make_pool_geometry(attrs, x.shape(), y.shape(), where);
  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<compute_t<T>>)
      avg_pool_impl(g, attrs.count_include_pad, x.data<T>(), y.data<T>());
  });
}

// x [N, C, D...] -> y [N, C, 1...]: the mean of each (n, c) plane.
void global_avg_pool(const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const Tensor& x = *in[0];
  Tensor& y = out[0];
  FUSEBOX_CHECK(x.dtype() == y.dtype() && x.rank() >= 3 && y.rank() == x.rank() &&
                    y.dim(0) == x.dim(0) && y.dim(1) == x.dim(1) &&
                    y.numel() == x.dim(0) * x.dim(1),
                where, "input ", shape_str(x.shape()), " (", dtype_name(x.dtype()), ") and output ",
                shape_str(y.shape()), " (", dtype_name(y.dtype()), ") do not match");
  const int64_t planes = y.numel();
  FUSEBOX_CHECK(planes == 0 || x.numel() / planes >= 1, where, "input ", shape_str(x.shape()),
                " has an empty spatial dim");
  const int64_t plane_size = planes == 0 ? 0 : x.numel() / planes;
  visit_float(n, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (std::is_floating_point_v<C>) {
      const T* xs = x.data<T>();
      T* ys = y.data<T>();
      parallel_for(planes, std::max<int64_t>(1, kGrain / std::max<int64_t>(plane_size, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t p = begin; p < end; ++p) {
                       C sum = 0;
                       const T* plane = xs + p * plane_size;
                       for (int64_t i = 0; i < plane_size; ++i) sum += to_compute(plane[i]);
                       ys[p] = convert<T>(sum / C(plane_size));
                     }
                   });
    }
  });
}

}  // namespace fusebox::cpu
