// A tensor on the GPU: a buffer, an element offset, a dtype, a shape and strides (in
// elements). Tensors the executor makes are dense, contiguous or channels-last (the
// layout pass, passes/layout.h, chooses per value); views (a transpose, a broadcast with
// stride 0, a slice) are expressed by strides, and the kernels that accept them say so.
#pragma once

#include <utility>

#include "backends/cuda/runtime/allocator.h"
#include "fusebox/core/tensor.h"

namespace fusebox::cuda {

struct DeviceTensor {
  DeviceBuffer buffer;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  Shape shape;
  Shape strides;  // in elements

  static DeviceTensor empty(CachingAllocator& alloc, DType dtype, Shape shape,
                            MemoryFormat format = MemoryFormat::contiguous);
  // A dense tensor over `range` (at least its bytes; the offset a multiple of the element
  // size), e.g. a temporary from CommandEncoder::temporary.
  static DeviceTensor over(const BufferRange& range, DType dtype, Shape shape,
                           MemoryFormat format = MemoryFormat::contiguous);
  // A view of the same buffer (and dtype): element `offset` from the buffer's start, with
  // the given shape and strides.
  DeviceTensor view(int64_t offset, Shape shape, Shape strides) const {
    DeviceTensor v;
    v.buffer = buffer;
    v.offset = offset;
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.strides = std::move(strides);
    return v;
  }
  int64_t numel() const { return fusebox::numel(shape); }
  int64_t rank() const { return int64_t(shape.size()); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  bool is_channels_last() const {  // dense N, spatial..., C (true for contiguous rank < 3)
    return is_dense_in(shape, strides, MemoryFormat::channels_last);
  }
  // The same elements with the dims reordered: dim i of the result is dim order[i] of this.
  DeviceTensor permuted(const std::vector<int>& order) const;
  void* data() const {
    return static_cast<char*>(buffer.data()) + offset * int64_t(dtype_size(dtype));
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }
  // The bytes this tensor can touch (from its lowest to its highest element), for the
  // encoder's hazard tracking.
  BufferRange range() const;
};

}  // namespace fusebox::cuda
