// Host tensor: a dtype, a shape and a contiguous row-major buffer.
//
// Ownership: the buffer is reference counted. Copying a Tensor makes a second
// handle to the same bytes (cheap, like a shared_ptr); clone() makes an
// independent copy. Nothing else aliases a buffer, so a Tensor you created and
// did not copy is yours alone.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "fusebox/core/dtype.h"
#include "fusebox/core/error.h"
#include "fusebox/core/shape.h"

namespace fusebox {

class Tensor {
 public:
  Tensor() = default;  // an empty handle: defined() is false

  static Tensor empty(DType dtype, Shape shape);  // uninitialised contents
  static Tensor zeros(DType dtype, Shape shape);
  static Tensor full(DType dtype, Shape shape, double value);
  template <class T>
  static Tensor from_vector(Shape shape, const std::vector<T>& values) {
    Tensor t = empty(dtype_of<T>::value, std::move(shape));
    FUSEBOX_CHECK(int64_t(values.size()) == t.numel(), "tensor", "from_vector: ", values.size(),
                  " values for shape ", shape_str(t.shape()));
    if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size() * sizeof(T));
    return t;
  }
  // Values given as doubles, converted (rounding to nearest even) to `dtype`.
  static Tensor from_doubles(DType dtype, Shape shape, const std::vector<double>& values);
  static Tensor scalar(DType dtype, double value) { return full(dtype, {}, value); }
  // A tensor over bytes allocated elsewhere (page-locked host memory, say: at least
  // nbytes()), freed by `storage`'s deleter with the last handle.
  static Tensor adopt(DType dtype, Shape shape, std::shared_ptr<std::byte[]> storage);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return int64_t(shape_.size()); }
  int64_t dim(int64_t i) const;  // negative i counts from the back
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }

  void* raw() { return buffer_.get(); }
  const void* raw() const { return buffer_.get(); }
  template <class T>
  T* data() {
    check_type(dtype_of<T>::value);
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>::value);
    return static_cast<const T*>(raw());
  }
  template <class T>
  std::span<const T> values() const {
    return {data<T>(), size_t(numel_)};
  }

  // Element i (flat, row-major) converted to/from double, whatever the dtype.
  double get(int64_t i) const;
  void set(int64_t i, double v);
  std::vector<double> to_doubles() const;

  Tensor clone() const;
  Tensor cast(DType to) const;  // round-to-nearest-even for narrowing floats
  // Same bytes, another shape of the same element count (shares the buffer).
  Tensor reshaped(Shape shape) const;
  // Fills with a byte pattern that decodes to NaN for float types (0xFF bytes):
  // used to poison outputs before a kernel writes them.
  void poison();

 private:
  void check_type(DType t) const;
  DType dtype_ = DType::f32;
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<std::byte[]> buffer_;
};

}  // namespace fusebox
