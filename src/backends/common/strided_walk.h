// The simplification of a strided walk, shared by the CPU loop nest (cpu/kernel_util.h,
// StridedNest) and the CUDA layouts (cuda/kernels/common/indexing.cuh, make_layout).
//
// A walk goes row-major over `shape` carrying, for each of N operands, the element offset
// sum(coord[d] * strides[k][d]) (a stride of 0 broadcasts, a negative one walks
// backwards). Dropping extent-1 dims and merging neighbours that every operand walks as
// one dim keeps every offset, and turns e.g. a same-shape elementwise op into one flat
// run: fewer dims, fewer divisions per element.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/core/shape.h"

namespace fusebox {

// Simplifies the walk in place (outermost dim first, as Shape is). Leaves at least one dim:
// a walk over a single element becomes extent 1 with stride 0 for every operand.
template <size_t N>
void simplify_strided_walk(Shape& shape, std::array<Shape, N>& strides) {
  size_t kept = 0;  // dims [0, kept) are the simplified walk so far
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    // For every operand, a step of the last kept dim is a step past all of dim d: the
    // two are one dim.
    bool merge = kept > 0;
    for (size_t k = 0; k < N && merge; ++k)
      merge = strides[k][kept - 1] == strides[k][d] * shape[d];
    if (merge) {
      shape[kept - 1] *= shape[d];
      for (size_t k = 0; k < N; ++k) strides[k][kept - 1] = strides[k][d];
    } else {
      shape[kept] = shape[d];
      for (size_t k = 0; k < N; ++k) strides[k][kept] = strides[k][d];
      ++kept;
    }
  }
  if (kept == 0) {
    shape.assign(1, 1);
    for (Shape& s : strides) s.assign(1, 0);
    return;
  }
  shape.resize(kept);
  for (Shape& s : strides) s.resize(kept);
}

}  // namespace fusebox
