// Element movement shared by the shape ops (shape_ops.cpp) and the gradients that
// move elements back (backward.cpp: slice, pad, expand), so that both walk the same
// positions.
#pragma once

#include <cstdint>

#include "fusebox/ir/graph.h"

namespace fusebox::cpu {

// dst[dst_offset + sum(c[d] * dst_strides[d])] = src[src_offset + sum(c[d] * src_strides[d])]
// for every coordinate c of `shape` (offsets and strides in elements; a stride may be
// 0 or negative); any dtype, src's and dst's being the same. Defined in shape_ops.cpp.
void copy_strided(const Shape& shape, Tensor& dst, Shape dst_strides, int64_t dst_offset,
                  const Tensor& src, Shape src_strides, int64_t src_offset);

// Source index along one dim of length `len` for padded position `o`, where
// `before` elements were added in front; -1 for a constant-padded position.
inline int64_t pad_source(PadMode mode, int64_t o, int64_t before, int64_t len) {
  int64_t i = o - before;
  if (i >= 0 && i < len) return i;
  switch (mode) {
    case PadMode::constant:
      return -1;
    case PadMode::edge:
      return i < 0 ? 0 : len - 1;
    case PadMode::reflect: {  // mirror without repeating the edge: period 2 (len - 1)
      if (len == 1) return 0;
      const int64_t period = 2 * (len - 1);
      i %= period;
      if (i < 0) i += period;
      return i < len ? i : period - i;
    }
  }
  return -1;
}

}  // namespace fusebox::cpu
