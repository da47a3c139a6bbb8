#include "backends/cuda/runtime/tensor.h"

#include "fusebox/core/memory.h"

namespace fusebox::cuda {

DeviceTensor DeviceTensor::empty(CachingAllocator& alloc, DType dtype, Shape shape,
                                 MemoryFormat format) {
  const TensorSize size = tensor_size_or_throw(shape, dtype, "cuda", "a device tensor");
  DeviceTensor t;
  t.dtype = dtype;
  t.strides = strides_for(shape, format);
  t.shape = std::move(shape);
  // A zero-size tensor still gets a (tiny) buffer so that ranges and pointers are valid.
  t.buffer = alloc.allocate(std::max<size_t>(size.bytes, 1));
  return t;
}

DeviceTensor DeviceTensor::over(const BufferRange& range, DType dtype, Shape shape,
                                MemoryFormat format) {
  DeviceTensor t;
  t.dtype = dtype;
  t.strides = strides_for(shape, format);
  t.shape = std::move(shape);
  const size_t element = dtype_size(dtype);
  FUSEBOX_CHECK(range.offset % element == 0 && range.bytes >= t.nbytes(), "cuda", "a ", t.nbytes(),
                "-byte ", dtype_name(dtype), " tensor does not fit the ", range.bytes,
                "-byte range at offset ", range.offset);
  t.buffer = range.buffer;
  t.offset = int64_t(range.offset / element);
  return t;
}

DeviceTensor DeviceTensor::permuted(const std::vector<int>& order) const {
  Shape s(order.size()), st(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    s[i] = shape.at(size_t(order[i]));
    st[i] = strides.at(size_t(order[i]));
  }
  return view(offset, std::move(s), std::move(st));
}

bool DeviceTensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

BufferRange DeviceTensor::range() const {
  const int64_t elem = int64_t(dtype_size(dtype));
  if (numel() == 0) return BufferRange(buffer, size_t(offset * elem), 0);
  int64_t lo = offset, hi = offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t span = (shape[i] - 1) * strides[i];
    if (span < 0)
      lo += span;
    else
      hi += span;
  }
  return BufferRange(buffer, size_t(lo * elem), size_t((hi - lo + 1) * elem));
}

}  // namespace fusebox::cuda
