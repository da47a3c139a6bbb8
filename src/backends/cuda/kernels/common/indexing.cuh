// Host side of the strided and broadcast index math (include from .cu files only): builds
// the device/strided_layout.cuh walks from shapes and strides.
//
// A StridedLayout<N> describes a walk over a shape (rank <= kMaxDims after simplification)
// in row-major order, carrying for each of N operands the element offset
// sum(coord[d] * strides[k][d]). A stride of 0 broadcasts, a negative stride walks
// backwards (a slice with a negative step). Kernels map a flat index i of the walk to the
// N offsets with offsets(); the host builds the layout with make_layout(), which drops
// extent-1 dims and merges neighbours that every operand walks as one (so a same-shape
// elementwise op becomes rank 1) by the CPU backend's rule (backends/common/strided_walk.h).
//
// Dims are stored innermost first (dim 0 is the fastest-varying): the device loop peels
// coordinates off the flat index from the inside out.
//
//   StridedLayout<2> L = make_layout<2>(where, y.shape, {y.strides, x.strides});
//   ... in a kernel: int64_t off[2]; L.offsets(i, off);  y[off[0]] = f(x[off[1]]);
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "backends/common/strided_walk.h"
#include "backends/common/where.h"
#include "backends/cuda/device/strided_layout.cuh"
#include "fusebox/core/error.h"
#include "fusebox/core/shape.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {

// Builds the layout of a walk over `shape` (outermost first, as Shape is) where operand k
// has `strides[k]` (outermost first, same rank as shape). Throws an Error naming `where`
// when more than kMaxDims dims remain after merging.
template <int N>
StridedLayout<N> make_layout(const Where& where, const Shape& shape,
                             const std::array<Shape, N>& strides) {
  Shape merged = shape;
  std::array<Shape, N> merged_strides = strides;
  simplify_strided_walk(merged, merged_strides);
  FUSEBOX_CHECK(merged.size() <= size_t(kMaxDims), where.str(), "a strided walk over ",
                shape_str(shape), " keeps ", merged.size(),
                " dims after merging; the CUDA kernels handle at most ", kMaxDims);
  StridedLayout<N> layout;
  layout.rank = int(merged.size());
  for (int d = 0; d < layout.rank; ++d) {  // innermost first
    const size_t from = merged.size() - 1 - size_t(d);
    layout.extent[d] = merged[from];
    for (int k = 0; k < N; ++k) layout.stride[k][d] = merged_strides[k][from];
  }
  return layout;
}

// The strides of an operand of `shape` with `strides` broadcast (numpy rules) to `to`:
// aligned at the back, 0 along every dim where the operand has extent 1.
inline Shape broadcast_strides(const Shape& shape, const Shape& strides, const Shape& to) {
  Shape out(to.size(), 0);
  const size_t lead = to.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) out[lead + d] = shape[d] == 1 ? 0 : strides[d];
  return out;
}

}  // namespace fusebox::cuda
