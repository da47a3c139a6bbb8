// Window geometry and layout-aware indexing shared by the CUDA pools (kernels/pool/pool.cu) and
// their backward passes (kernels/pool/backward.cu); include from .cu files only.
//
// Geometry: the backends' shared PoolWindow (backends/common/pool_window.h, the CPU
// kernel's too): along spatial dim d, output position o's window has taps j < kernel[d] at
// input position
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

#include "backends/common/pool_window.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/indexing.cuh"

namespace fusebox::cuda {

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

// max_pool's kernel (kernels/pool/pool.cu) for x into y and/or indices (either may be null; the
// backward pass wants indices only). Indices may be contiguous or channels-last whatever
// the layout of x and y.
void launch_max_pool(Context& ctx, const std::string& where, const PoolWindow& g,
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

// max_pool's rule, one lane at a time in the window's row-major tap order: take v when it is
// larger or NaN, unless a NaN is held (so the first of equal maxima and the first NaN stay).
// best_at < 0 before the first tap.
template <class C>
__device__ __forceinline__ void keep_max(C& best, int64_t& best_at, C v, int64_t at) {
  if (best_at < 0 || (!(best != best) && !(v <= best))) {
    best = v;
    best_at = at;
  }
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

}  // namespace fusebox::cuda
