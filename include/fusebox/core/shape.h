// Shapes are plain vectors of extents; strides are in elements, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusebox {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);                  // 1 for a scalar (rank 0)
Shape contiguous_strides(const Shape& s);       // row-major, in elements
std::string shape_str(const Shape& s);          // "[2, 3, 4]"

// numpy broadcasting of two shapes; returns false when they do not broadcast.
bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out);

// Normalises a possibly negative axis against `rank`; returns false when out of range.
bool normalize_axis(int64_t axis, int64_t rank, int64_t* out);

}  // namespace fusebox
