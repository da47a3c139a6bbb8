// Helpers shared by the CPU reference kernels: the compute type of each dtype,
// one conversion rule between any two element types, dtype dispatch that
// rejects unsupported types with an error naming the node, and a strided loop
// nest (broadcasting, transposes, slices) that runs in parallel.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/common/dtype_dispatch.h"
#include "backends/common/strided_walk.h"
#include "fusebox/core/parallel.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cpu {

// Elements per parallel_for chunk for cheap per-element work.
constexpr int64_t kGrain = int64_t(1) << 14;

template <class T>
constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The type arithmetic runs in: f64 for f64; f32 for f32, f16 and bf16; the type
// itself for integers and bool.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<Half> {
  using type = float;
};
template <>
struct compute_type<BFloat16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

// The one conversion rule between element types (used by cast and by every
// store of a computed value):
//   float narrowing rounds to nearest even (f64 -> f16/bf16 without double rounding);
//   float -> integer truncates toward zero, NaN gives 0, out-of-range saturates;
//   integer -> integer wraps (two's complement); anything -> bool is (v != 0).
template <class To, class From>
To convert(From v) {
  if constexpr (is_half_v<From>) {
    return convert<To>(float(v));
  } else if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (is_half_v<To>) {
    if constexpr (std::is_floating_point_v<From>)
      return To(v);
    else
      return To(double(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    if (std::isnan(v)) return 0;
    if (v >= From(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    if (v <= From(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    return To(v);
  } else {
    return static_cast<To>(v);
  }
}

template <class T>
compute_t<T> to_compute(T v) {
  return convert<compute_t<T>>(v);
}

// ---- strided loop nest -------------------------------------------------------
// A row-major walk over `shape` carrying, for each of N operands, the element
// offset sum(coord[d] * strides[k][d]). A stride of 0 broadcasts; a negative
// stride walks backwards. Kernels hand it a body(offsets, count) that handles
// one run of `count` elements along the innermost dim, where operand k's
// elements are at offsets[k] + j * inner_stride(k).
template <size_t N>
struct StridedNest {
  Shape shape;
  std::array<Shape, N> strides;

  int64_t inner_stride(size_t k) const { return strides[k].back(); }

  // Drops extent-1 dims and merges neighbours that every operand walks as one
  // dim, so that e.g. a same-shape elementwise op becomes a single flat run
  // (backends/common/strided_walk.h, as the CUDA layouts do). Leaves at least one dim.
  void simplify() { simplify_strided_walk(shape, strides); }

  // Calls body(offsets, count) over the runs covering flat elements [begin, end).
  template <class F>
  void for_each_run(int64_t begin, int64_t end, F&& body) const {
    if (begin >= end) return;
    const size_t r = shape.size();
    std::vector<int64_t> coord(r);
    std::array<int64_t, N> off{};
    int64_t rem = begin;
    for (size_t d = r; d-- > 0;) {
      coord[d] = rem % shape[d];
      rem /= shape[d];
      for (size_t k = 0; k < N; ++k) off[k] += coord[d] * strides[k][d];
    }
    for (int64_t i = begin; i < end;) {
      int64_t count = std::min(shape[r - 1] - coord[r - 1], end - i);
      body(off, count);
      i += count;
      coord[r - 1] += count;
      for (size_t k = 0; k < N; ++k) off[k] += count * strides[k][r - 1];
      for (size_t d = r - 1; d > 0 && coord[d] == shape[d]; --d) {  // carry
        coord[d] = 0;
        ++coord[d - 1];
        for (size_t k = 0; k < N; ++k) off[k] += strides[k][d - 1] - shape[d] * strides[k][d];
      }
    }
  }

  // The whole nest, split across threads by flat element index.
  template <class F>
  void parallel_runs(int64_t grain, F&& body) const {
    parallel_for(numel(shape), grain,
                 [&](int64_t begin, int64_t end) { for_each_run(begin, end, body); });
  }
};

// The strides of an operand of shape `in` broadcast (numpy rules) to `out`:
// aligned at the back, 0 along every dim it broadcasts over.
inline Shape broadcast_strides(const Shape& in, const Shape& out) {
  Shape st(out.size(), 0);
  Shape own = contiguous_strides(in);
  size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) st[lead + d] = in[d] == 1 ? 0 : own[d];
  return st;
}

// The values of `t` (any dtype) broadcast to `to` as a flat row-major vector of
// C; the caller has checked that t's shape broadcasts to `to`.
template <class C>
std::vector<C> broadcast_values(const Tensor& t, const Shape& to) {
  std::vector<C> out(size_t(numel(to)));
  StridedNest<2> nest{to, {contiguous_strides(to), broadcast_strides(t.shape(), to)}};
  nest.simplify();
  const int64_t stride = nest.inner_stride(1);
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = t.data<T>();
    nest.parallel_runs(kGrain, [&](const std::array<int64_t, 2>& off, int64_t count) {
      C* dst = out.data() + off[0];
      for (int64_t j = 0; j < count; ++j) dst[j] = convert<C>(src[off[1] + j * stride]);
    });
  });
  return out;
}

// `full` (row-major over `full_shape`) summed down to `to`, a shape that broadcasts to
// full_shape: each element adds into the element of `to` it was broadcast from.
inline std::vector<double> sum_to_shape(const std::vector<double>& full, const Shape& full_shape,
                                        const Shape& to) {
  std::vector<double> out(size_t(numel(to)), 0.0);
  StridedNest<2> nest{full_shape,
                      {contiguous_strides(full_shape), broadcast_strides(to, full_shape)}};
  nest.simplify();
  const int64_t s = nest.inner_stride(1);
  nest.for_each_run(0, numel(full_shape), [&](const std::array<int64_t, 2>& off, int64_t count) {
    for (int64_t j = 0; j < count; ++j) out[size_t(off[1] + j * s)] += full[size_t(off[0] + j)];
  });
  return out;
}

// Writes `values` (flat, row-major) into `t`, converting to t's dtype.
template <class C>
void store_values(Tensor& t, const std::vector<C>& values) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* dst = t.data<T>();
    parallel_for(int64_t(values.size()), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = convert<T>(values[size_t(i)]);
    });
  });
}

}  // namespace fusebox::cpu
