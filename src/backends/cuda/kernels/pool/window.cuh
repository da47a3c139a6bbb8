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
// backward pass wants indices only), or, with `taps`, into its tap codes alone (below: bytes,
// dy.numel() of them, in x's layout; y and indices null). Indices may be contiguous or
// channels-last whatever the layout of x and y.
void launch_max_pool(Context& ctx, const std::string& where, const PoolWindow& g,
                     const DeviceTensor& x, const DeviceTensor* y, const DeviceTensor* indices,
                     const BufferRange* taps = nullptr);

// Tap codes: max_pool_backward's compact form of the forward's choice. Per output element
// (indexed as an element of dy, in x's layout), one byte: the kernel tap its window's max
// sits at, (j0 * kernel[1] + j1) * kernel[2] + j2 with j_d < kernel[d] (padding taps
// counted, so the code is the same whichever taps are in bounds), or kNoTap for a window
// with no in-bounds tap. For kernels of fewer than kNoTap taps (fits_tap_codes): the
// temporary is an eighth of i64 indices' (ResNet-50's stem pool at bf16 batch 256: 51 MB
// instead of 411). The node's time was not in those bytes but in the window arithmetic below
// (unit_windows).
inline constexpr int kNoTap = 255;
inline bool fits_tap_codes(const PoolWindow& g) {
  return g.kernel[0] * g.kernel[1] * g.kernel[2] < kNoTap;
}

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

// ---- window arithmetic, fast where every dilation is 1 ---------------------------------------
// pool_window.h's forms divide by the dilation and the stride in 64 bits, a few times per
// output (and per window holding an input in the backward): in kernels that do a few loads
// per element that division was the cost (ResNet-50's stem pool, bf16 batch 256 on an H200:
// backward 1.92 ms, forward 0.49 ms for 0.5 GB moved). Where every dilation is 1 and every
// extent fits 32 bits (unit_windows, the kernels' kUnit), the taps take no division and the
// windows holding a position one 32-bit division by the stride (none for stride 1). Same
// results as the generic forms.
inline bool unit_windows(const PoolWindow& g) {
  constexpr int64_t kMost = int64_t(1) << 30;
  for (int d = 0; d < 3; ++d)
    if (g.dilation[d] != 1 || g.in[d] + g.pad_lo[d] + g.pad_hi[d] >= kMost ||
        g.out[d] * g.stride[d] >= kMost || g.kernel[d] >= kMost)
      return false;
  return true;
}

// Calls f(std::bool_constant<unit_windows(g)>).
template <class F>
void visit_unit_windows(const PoolWindow& g, F&& f) {
  if (unit_windows(g))
    f(std::true_type{});
  else
    f(std::false_type{});
}

// window_taps (pool_window.h).
template <bool kUnit>
__device__ __forceinline__ TapRange taps_of(const PoolWindow& g, int d, int64_t o) {
  if constexpr (!kUnit) {
    return window_taps(g, d, o);
  } else {
    const int64_t start = o * g.stride[d] - g.pad_lo[d], k = g.kernel[d];
    const int64_t j_first = clamp_index(-start, 0, k), j_end = clamp_index(g.in[d] - start, 0, k);
    TapRange t;
    t.first = start + j_first;
    t.count = j_end > j_first ? j_end - j_first : 0;
    t.padded =
        clamp_index(g.in[d] + g.pad_hi[d] - start, 0, k) - clamp_index(-g.pad_lo[d] - start, 0, k);
    return t;
  }
}

// windows_holding (pool_window.h).
template <bool kUnit>
__device__ __forceinline__ OutputSpan holding(const PoolWindow& g, int d, int64_t i) {
  if constexpr (!kUnit) {
    return windows_holding(g, d, i);
  } else {
    const int reach = int(i + g.pad_lo[d]), below = int(g.kernel[d]) - 1, s = int(g.stride[d]);
    const int low = reach - below;  // o * s >= low
    int lowest = s == 1 ? low : (low >= 0 ? (low + s - 1) / s : -(-low / s));
    const int highest = s == 1 ? reach : reach / s;  // reach >= 0
    OutputSpan span;
    span.first = lowest > 0 ? lowest : 0;
    span.last = highest < g.out[d] - 1 ? highest : g.out[d] - 1;
    return span;
  }
}

// is_window_tap (pool_window.h): always, with unit dilation.
template <bool kUnit>
__device__ __forceinline__ bool holds(const PoolWindow& g, int d, int64_t i, int64_t o) {
  if constexpr (kUnit)
    return true;
  else
    return is_window_tap(g, d, i, o);
}

// ---- small 2-D windows, channels-last -------------------------------------------------------
// The pools networks use (ResNet's and DenseNet's 3x3 stride 2 stems, 2x2 and 3x3 pools) with
// 16-byte channel vectors get kernels of their own (max_pool_small_kernel, the tap codes'
// gather): every tap of a window (every window holding an input, in the backward) is loaded
// before the first comparison, in 32-bit positions. The generic kernels' tap-by-tap loops over
// 64-bit ranges held ~80 registers (16 warps per SM) and waited one L2 round trip per tap:
// ResNet-50's stem pool (bf16, batch 256, H200) took 0.53 ms forward and 1.03 ms backward for
// 0.5 and 1 GB moved. Small: dim 0 one position and one tap (a 1-D or 2-D pool), dims 1 and 2
// at most kSmallTaps taps each, every dilation 1 (unit_windows), the work fits 31 bits.
inline constexpr int kSmallTaps = 3;
inline bool small_windows(const PoolWindow& g, int64_t work) {
  return unit_windows(g) && g.in[0] == 1 && g.out[0] == 1 && g.kernel[0] == 1 &&
         g.kernel[1] <= kSmallTaps && g.kernel[2] <= kSmallTaps && work <= int64_t(INT32_MAX);
}

// The tap of output o's window along dim d at input position i (holds(g, d, i, o)).
template <bool kUnit>
__device__ __forceinline__ int64_t tap_along(const PoolWindow& g, int d, int64_t i, int64_t o) {
  const int64_t offset = i + g.pad_lo[d] - o * g.stride[d];
  return kUnit ? offset : offset / g.dilation[d];
}
__device__ __forceinline__ int tap_code(const PoolWindow& g, int64_t j0, int64_t j1, int64_t j2) {
  return int((j0 * g.kernel[1] + j1) * g.kernel[2] + j2);
}

__device__ __forceinline__ int64_t spatial_offset(const int64_t (&ext)[3], int64_t p0, int64_t p1,
                                                  int64_t p2) {
  return (p0 * ext[1] + p1) * ext[2] + p2;
}

// max_pool's rule, one lane at a time in the window's row-major tap order: take v when it is
// larger or NaN, unless a NaN is held (so the first of equal maxima and the first NaN stay).
// best_at < 0 before the first tap.
template <class C, class I>
__device__ __forceinline__ void keep_max(C& best, I& best_at, C v, I at) {
  if (best_at < 0 || (!(best != best) && !(v <= best))) {
    best = v;
    best_at = at;
  }
}

// Lane l of a 16-byte vector as a compute value: bf16 by moving its bits into the high half of
// an f32 (exact), read from the 32-bit word holding it. Why: convert<float> of a bf16 lane is
// cvt.f32.bf16 on a 16-bit register of its own, so a kernel holding a window of vectors keeps
// every lane unpacked: the small max pool's forward took 126 registers in bf16 (64 this way)
// and ran the stem pool of ResNet-50 at b256 in 0.363 ms (0.225 this way, H200).
template <class C, class T>
__device__ __forceinline__ C lane_value(const Vec<T>& v, int l) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t word = reinterpret_cast<const uint32_t*>(&v)[l / 2];
    return __uint_as_float(l % 2 == 0 ? word << 16 : word & 0xffff0000u);
  } else {
    return convert<C>(v.v[l]);
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
