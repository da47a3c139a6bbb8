// Window geometry and layout-aware indexing shared by the CUDA pools (pool.cu) and their
// backward passes (pool_backward.cu); include from .cu files only.
//
// Geometry (the CPU kernel's, backends/cpu/pool_window.h): along spatial dim d, output
// position o's window has taps j < kernel[d] at input position
//   o * stride[d] - pad_lo[d] + j * dilation[d].
// 1-D and 2-D pools are 3-D ones with leading extents of 1, so a spatial position is the
// row-major offset sp = (p0 * ext[1] + p1) * ext[2] + p2 over the three (padded) dims.
//
// Layouts: a node's activation operands (x, y, dy, dx) are all contiguous NCHW or all
// channels-last (N, D..., C), decided once per launch (pool_layout). A kernel instance is
// compiled for one layout (kCL) and a channel vector width V: each thread owns V
// consecutive channels at one (n, spatial) position, so in channels-last neighbouring
// threads touch neighbouring 16-byte chunks (V = kVecWidth<T>, when C % V == 0 and every
// pointer is 16-byte aligned) or neighbouring elements (V = 1). The contiguous layout
// always runs V = 1, one thread per element in row-major order. Threads walk their work
// items in the operand's physical order, so the stores are coalesced in either layout.
// Indices (max_pool's second output, max_pool_backward's input) always name elements of
// the flattened logical x (row-major over N, C, D...), whatever the layouts.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "backends/cuda/device_math.cuh"
#include "backends/cuda/indexing.cuh"
#include "backends/cuda/kernels.h"

namespace fusebox::cuda {

struct PoolShape {
  int64_t batch = 0, channels = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0}, pad_hi[3] = {0, 0, 0};

  __host__ __device__ int64_t in_size() const { return in[0] * in[1] * in[2]; }
  __host__ __device__ int64_t out_size() const { return out[0] * out[1] * out[2]; }
};

// The geometry of a pool from x [N, C, D...] to y [N, C, O...] (dx and dy for the
// backward passes), checking the shapes and the normalised attributes.
inline PoolShape make_pool_shape(const PoolAttrs& a, const Shape& x, const Shape& y,
                                 const std::string& where) {
  const int64_t rank = int64_t(x.size()) - 2;
  FUSEBOX_CHECK(rank >= 1 && rank <= 3 && y.size() == x.size() && y[0] == x[0] && y[1] == x[1],
                where, "input ", shape_str(x), " and output ", shape_str(y),
                " must be [N, C, D...] with 1 to 3 spatial dims");
  FUSEBOX_CHECK(int64_t(a.kernel.size()) == rank && int64_t(a.strides.size()) == rank &&
                    int64_t(a.dilations.size()) == rank && int64_t(a.pads_begin.size()) == rank &&
                    int64_t(a.pads_end.size()) == rank,
                where, "attributes are not normalised to ", rank, " spatial dims");
  PoolShape g;
  g.batch = x[0];
  g.channels = x[1];
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t i = 3 - rank + d;
    g.in[i] = x[2 + d];
    g.out[i] = y[2 + d];
    g.kernel[i] = a.kernel[d];
    g.stride[i] = a.strides[d];
    g.dilation[i] = a.dilations[d];
    g.pad_lo[i] = a.pads_begin[d];
    g.pad_hi[i] = a.pads_end[d];
    FUSEBOX_CHECK(g.kernel[i] >= 1 && g.stride[i] >= 1 && g.dilation[i] >= 1 && g.pad_lo[i] >= 0 &&
                      g.pad_hi[i] >= 0,
                  where, "bad window in spatial dim ", d, ": kernel ", g.kernel[i], ", stride ",
                  g.stride[i], ", dilation ", g.dilation[i], ", pads ", g.pad_lo[i], " and ",
                  g.pad_hi[i]);
  }
  return g;
}

// ---- layouts (host) ------------------------------------------------------------------------

// How a pool kernel walks its operands: channels-last or contiguous, and the channel
// vector width class (vectorised: V = kVecWidth<T>; else V = 1).
struct PoolLayout {
  bool channels_last = false;
  bool vectorised = false;
};

inline std::string layout_str(const DeviceTensor& t) {
  return cat(shape_str(t.shape), " with strides ", shape_str(t.strides));
}

// The layout of a node's activation operands (named for errors): contiguous when every
// one is, else channels-last when every one is (a tensor with C == 1 or all spatial extents
// 1 is both); anything else is an Error naming the node. Vectorised when channels-last,
// C % kVecWidth == 0 and every operand is 16-byte aligned.
inline PoolLayout pool_layout(
    const std::string& where,
    std::initializer_list<std::pair<const char*, const DeviceTensor*>> operands) {
  bool contiguous = true, channels_last = true;
  for (const auto& [name, t] : operands) {
    contiguous = contiguous && t->is_contiguous();
    channels_last = channels_last && t->rank() >= 3 && t->is_channels_last();
  }
  if (contiguous) return {};
  if (!channels_last) {
    std::string list;
    for (const auto& [name, t] : operands)
      list += cat(list.empty() ? "" : "; ", name, " ", layout_str(*t));
    throw Error(where, cat("operands must be all contiguous (N, C, D...) or all channels-last "
                           "(N, D..., C); got ",
                           list));
  }
  PoolLayout layout{true, true};
  const DeviceTensor& first = *operands.begin()->second;
  const int64_t width = kVecBytes / int64_t(dtype_size(first.dtype));
  layout.vectorised = first.shape[1] % width == 0;
  for (const auto& [name, t] : operands)
    layout.vectorised = layout.vectorised && is_aligned(t->data(), kVecBytes);
  return layout;
}

// Whether an i64 indices tensor is channels-last (else contiguous); an Error when neither.
inline bool indices_channels_last(const std::string& where, const DeviceTensor& indices) {
  if (indices.is_contiguous()) return false;
  FUSEBOX_CHECK(indices.rank() >= 3 && indices.is_channels_last(), where,
                "indices must be contiguous or channels-last; got ", layout_str(indices));
  return true;
}

// Calls f(std::integral_constant<int, V>, std::bool_constant<kCL>) for the layout.
template <class T, class F>
void visit_pool_layout(const PoolLayout& layout, F&& f) {
  if (!layout.channels_last)
    f(std::integral_constant<int, 1>{}, std::false_type{});
  else if (layout.vectorised)
    f(std::integral_constant<int, kVecWidth<T>>{}, std::true_type{});
  else
    f(std::integral_constant<int, 1>{}, std::true_type{});
}

inline void check_same_dtype(const DeviceTensor& a, const DeviceTensor& b,
                             const std::string& where) {
  FUSEBOX_CHECK(a.dtype == b.dtype, where, "input is ", dtype_name(a.dtype), " but output is ",
                dtype_name(b.dtype));
}

// Calls f(T{}) with T the device type of a floating dtype; other dtypes are an Error.
template <class F>
void visit_pool_float(const std::string& where, DType t, F&& f) {
  visit_device_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float_v<T>)
      f(T{});
    else
      throw Error(where, cat("expects a floating-point tensor, got ", dtype_name(t)));
  });
}

// max_pool's kernel (pool.cu) for x into y and/or indices (either may be null; the
// backward pass wants indices only). Indices may be contiguous or channels-last whatever
// the layout of x and y.
void launch_max_pool(Context& ctx, const std::string& where, const PoolShape& g,
                     const DeviceTensor& x, const DeviceTensor* y, const DeviceTensor* indices);

// ---- indexing (device) ---------------------------------------------------------------------

// Element (n, c, spatial offset sp) of a dense [N, C, D...] tensor with `size` = prod(D).
template <bool kCL>
__host__ __device__ __forceinline__ int64_t element_at(int64_t n, int64_t c, int64_t channels,
                                                       int64_t size, int64_t sp) {
  return kCL ? (n * size + sp) * channels + c : (n * channels + c) * size + sp;
}

// A thread's work item: batch n, channel unit (channels unit * V ... + V - 1), position p.
struct Site {
  int64_t n, unit, p[3];
};

// Work item w -> Site, in physical order: channels-last peels the channel unit first, the
// contiguous layout the spatial position first. Index is the type the divisions run in.
template <bool kCL, class Index>
__device__ __forceinline__ Site locate_as(Index w, Index units, const int64_t (&ext)[3]) {
  Site s;
  if constexpr (kCL) {
    s.unit = int64_t(w % units);
    w /= units;
  }
#pragma unroll
  for (int d = 2; d >= 0; --d) {
    s.p[d] = int64_t(w % Index(ext[d]));
    w /= Index(ext[d]);
  }
  if constexpr (kCL) {
    s.n = int64_t(w);
  } else {
    s.unit = int64_t(w % units);
    s.n = int64_t(w / units);
  }
  return s;
}

// `narrow`: the whole walk fits uint32_t (fits_u32), so the divisions run in 32 bits.
template <bool kCL>
__device__ __forceinline__ Site locate(int64_t w, int64_t units, const int64_t (&ext)[3],
                                       bool narrow) {
  return narrow ? locate_as<kCL>(uint32_t(w), uint32_t(units), ext)
                : locate_as<kCL>(uint64_t(w), uint64_t(units), ext);
}

__device__ __forceinline__ int64_t spatial_offset(const int64_t (&ext)[3], int64_t p0, int64_t p1,
                                                  int64_t p2) {
  return (p0 * ext[1] + p1) * ext[2] + p2;
}

// V consecutive elements from p + at into compute values (one 16-byte load when V > 1:
// the caller guarantees alignment), and back.
template <int V, class T>
__device__ __forceinline__ void load_lanes(const T* p, int64_t at, compute_t<T> (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = load_compute(p, at);
  } else {
    static_assert(V == kVecWidth<T>, "vector lanes are one 16-byte vector");
    const Vec<T> q = load_vec(p + at, 0);
#pragma unroll
    for (int l = 0; l < V; ++l) v[l] = convert<compute_t<T>>(q.v[l]);
  }
}
template <int V, class T>
__device__ __forceinline__ void store_lanes(T* p, int64_t at, const compute_t<T> (&v)[V]) {
  if constexpr (V == 1) {
    store_compute(p, at, v[0]);
  } else {
    Vec<T> q;
#pragma unroll
    for (int l = 0; l < V; ++l) q.v[l] = convert<T>(v[l]);
    store_vec(p + at, 0, q);
  }
}

// ---- window geometry (device) --------------------------------------------------------------

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {  // b > 0
  return a >= 0 ? (a + b - 1) / b : -(-a / b);
}

// The taps of output position o along dim d: the first in-bounds tap's input position,
// the in-bounds count (consecutive taps), and the taps inside the padded extent.
struct Taps {
  int64_t first, count, padded;
};

__device__ __forceinline__ Taps taps_of(const PoolShape& g, int d, int64_t o) {
  const int64_t start = o * g.stride[d] - g.pad_lo[d], dil = g.dilation[d];
  auto below = [&](int64_t hi) {  // taps j with start + j * dil < hi
    return min(max(ceil_div(hi - start, dil), int64_t(0)), g.kernel[d]);
  };
  const int64_t j_first = below(0);
  return {start + j_first * dil, max(below(g.in[d]) - j_first, int64_t(0)),
          below(g.in[d] + g.pad_hi[d]) - below(-g.pad_lo[d])};
}

// avg_pool's divisor of output (o0, o1, o2); >= 1 (shape inference keeps the pads smaller
// than the window).
__device__ __forceinline__ int64_t avg_divisor(const PoolShape& g, bool count_include_pad,
                                               int64_t o0, int64_t o1, int64_t o2) {
  const Taps t0 = taps_of(g, 0, o0), t1 = taps_of(g, 1, o1), t2 = taps_of(g, 2, o2);
  return count_include_pad ? t0.padded * t1.padded * t2.padded : t0.count * t1.count * t2.count;
}

// The outputs o along dim d whose windows hold input position i at some tap:
// o * stride = i + pad_lo - j * dilation for a tap j, so o in [lo, hi] (clipped to the
// output) with (i + pad_lo - o * stride) % dilation == 0.
__device__ __forceinline__ void windows_of(const PoolShape& g, int d, int64_t i, int64_t& lo,
                                           int64_t& hi) {
  const int64_t reach = i + g.pad_lo[d];
  lo = max(ceil_div(reach - (g.kernel[d] - 1) * g.dilation[d], g.stride[d]), int64_t(0));
  hi = min(reach / g.stride[d], g.out[d] - 1);
}

__device__ __forceinline__ bool on_tap(const PoolShape& g, int d, int64_t i, int64_t o) {
  return (i + g.pad_lo[d] - o * g.stride[d]) % g.dilation[d] == 0;
}

}  // namespace fusebox::cuda
