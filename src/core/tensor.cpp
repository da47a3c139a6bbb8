#include "fusebox/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "fusebox/core/memory.h"
#include "fusebox/core/parallel.h"

namespace fusebox {

namespace {

template <class T>
double load(const void* p, int64_t i) {
  const T v = static_cast<const T*>(p)[i];
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return double(float(v));
  else
    return double(v);
}

// Saturating-free conversion of a double into an integer type: truncates toward
// zero (NaN and out-of-range values are undefined in C++, so they map to 0 / the bound).
template <class I>
I to_integer(double v) {
  if (std::isnan(v)) return 0;
  if (v >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  if (v <= double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  return I(v);
}

template <class T>
void store(void* p, int64_t i, double v) {
  T* d = static_cast<T*>(p);
  if constexpr (std::is_same_v<T, bool>)
    d[i] = v != 0.0;
  else if constexpr (std::is_integral_v<T>)
    d[i] = to_integer<T>(v);
  else if constexpr (std::is_same_v<T, float>)
    d[i] = float(v);
  else
    d[i] = T(v);
}

}  // namespace

Tensor Tensor::adopt(DType dtype, Shape shape, std::shared_ptr<std::byte[]> storage) {
  FUSEBOX_CHECK(storage != nullptr, "tensor", "adopt: no storage");
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = fusebox::numel(shape);
  t.shape_ = std::move(shape);
  t.buffer_ = std::move(storage);
  return t;
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  const TensorSize size = tensor_size_or_throw(shape, dtype, "tensor", "a tensor");
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = size.elements;
  // At least one byte, so that defined() holds for empty tensors; counted by the host budget.
  t.buffer_ = allocate_host(size.bytes, cat(dtype_name(dtype), shape_str(shape)));
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(DType dtype, Shape shape, double value) {
  Tensor t = empty(dtype, std::move(shape));
  if (t.numel() == 0) return t;
  // The first element converted once, its bytes then doubled into the rest (set() per element
  // converted each: seconds for the masks of a large model's Dropout nodes).
  t.set(0, value);
  std::byte* bytes = static_cast<std::byte*>(t.raw());
  const size_t total = t.nbytes();
  for (size_t filled = dtype_size(dtype); filled < total; filled *= 2)
    std::memcpy(bytes + filled, bytes, std::min(filled, total - filled));
  return t;
}

Tensor Tensor::from_doubles(DType dtype, Shape shape, const std::vector<double>& values) {
  Tensor t = empty(dtype, std::move(shape));
  FUSEBOX_CHECK(int64_t(values.size()) == t.numel(), "tensor", "from_doubles: ", values.size(),
                " values for shape ", shape_str(t.shape()));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, values[size_t(i)]);
  return t;
}

int64_t Tensor::dim(int64_t i) const {
  int64_t a;
  FUSEBOX_CHECK(normalize_axis(i, rank(), &a), "tensor", "dim ", i, " out of range for shape ",
                shape_str(shape_));
  return shape_[size_t(a)];
}

void Tensor::check_type(DType t) const {
  FUSEBOX_CHECK(defined(), "tensor", "access to an undefined tensor");
  FUSEBOX_CHECK(t == dtype_, "tensor", "accessed as ", dtype_name(t), " but holds ",
                dtype_name(dtype_));
}

double Tensor::get(int64_t i) const {
  return visit_dtype(dtype_, [&](auto tag) { return load<decltype(tag)>(raw(), i); });
}

void Tensor::set(int64_t i, double v) {
  visit_dtype(dtype_, [&](auto tag) { store<decltype(tag)>(raw(), i, v); });
}

std::vector<double> Tensor::to_doubles() const {
  std::vector<double> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[size_t(i)] = get(i);
  return out;
}

Tensor Tensor::clone() const {
  Tensor t = empty(dtype_, shape_);
  std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

Tensor Tensor::cast(DType to) const {
  if (to == dtype_) return clone();
  Tensor t = empty(to, shape_);
  // The dtype pair is dispatched once, not per element (get/set: ~8 ns an element, 1.3 s for
  // GPT-2's weights folded to bf16 at compile), and large tensors are split over the pool.
  // Every pair converts as set(get(i)) does; f32 -> f16/bf16 rounds from the float, which
  // gives the same bits as the double path (its round-to-odd keeps one rounding).
  visit_dtype(dtype_, [&](auto from_tag) {
    using From = decltype(from_tag);
    visit_dtype(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      const From* src = data<From>();
      To* dst = t.data<To>();
      auto convert = [&](int64_t begin, int64_t end) {
        if constexpr (std::is_same_v<From, float> &&
                      (std::is_same_v<To, BFloat16> || std::is_same_v<To, Half>)) {
          for (int64_t i = begin; i < end; ++i) dst[i] = To(src[i]);
        } else {
          for (int64_t i = begin; i < end; ++i) store<To>(dst, i, load<From>(src, i));
        }
      };
      constexpr int64_t kGrain = int64_t(1) << 18;
      if (numel_ < 2 * kGrain)
        convert(0, numel_);  // the pool is not woken for a small cast
      else
        parallel_for(numel_, kGrain, convert);
    });
  });
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  FUSEBOX_CHECK(fusebox::numel(shape) == numel_, "tensor", "cannot view ", shape_str(shape_),
                " as ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::poison() {
  if (defined()) std::memset(raw(), 0xff, nbytes());
}

}  // namespace fusebox
