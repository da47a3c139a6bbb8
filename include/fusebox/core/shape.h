// Shapes are plain vectors of extents; strides are in elements, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusebox {

using Shape = std::vector<int64_t>;

// 1 for a scalar (rank 0); an Error for a negative extent or a count past int64 (sizes with a
// bound and bytes: checked_tensor_size, core/memory.h).
int64_t numel(const Shape& s);
Shape contiguous_strides(const Shape& s);  // row-major, in elements
std::string shape_str(const Shape& s);     // "[2, 3, 4]"
// The position of flat (row-major) index i in `shape`, as "[1, 0, 2]" (for messages).
std::string position_str(int64_t i, const Shape& shape);

// The physical order of a tensor's elements. Logical dims stay N, C, spatial... (as ONNX and
// PyTorch); channels_last stores them N, spatial..., C (NLC, NHWC, NDHWC) for rank >= 3 and
// is the same as contiguous below rank 3.
enum class MemoryFormat : uint8_t { contiguous, channels_last };
const char* memory_format_name(MemoryFormat f);  // "contiguous", "channels_last"
// The logical dims in physical order, outermost first: contiguous 0, 1, ..., r-1;
// channels_last 0, 2, ..., r-1, 1.
std::vector<int> physical_order(size_t rank, MemoryFormat f);
Shape strides_for(const Shape& s, MemoryFormat f);  // dense strides of `s` in format f
// Whether `strides` lay `s` out densely in format f. Dims of extent 1 are ignored, so a
// tensor can be both (e.g. [N, C, 1, 1], or C == 1).
bool is_dense_in(const Shape& s, const Shape& strides, MemoryFormat f);

// numpy broadcasting of two shapes; returns false when they do not broadcast.
bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out);

// Normalises a possibly negative axis against `rank`; returns false when out of range.
bool normalize_axis(int64_t axis, int64_t rank, int64_t* out);

}  // namespace fusebox
