// gather's index view, shared by both backends: data as [outer, extent, inner] around the
// axis, the indices flattened to [count], so y (and gather_backward's dy) is
// [outer, count, inner] and y[o, j, i] = data[o, indices[j], i].
#pragma once

#include <cstdint>

#include "fusebox/core/shape.h"

namespace fusebox {

struct GatherView {
  int64_t outer, extent, count, inner;
};

inline GatherView gather_view(const Shape& data, int64_t axis, int64_t count) {
  GatherView v{1, data[size_t(axis)], count, 1};
  for (int64_t d = 0; d < axis; ++d) v.outer *= data[size_t(d)];
  for (size_t d = size_t(axis) + 1; d < data.size(); ++d) v.inner *= data[d];
  return v;
}

}  // namespace fusebox
