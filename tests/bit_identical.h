// Byte equality of host tensors, element by element, for results that must be bit for bit
// the same (a fused op against the ops it replaces): -0 is not +0 and a NaN matches only
// its own bits, where all_close(a, b, 0, 0) would take both as equal. On failure it names
// the first element that differs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "fusebox/core/tensor.h"

namespace fusebox::testing {

inline ::testing::AssertionResult bit_identical(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return ::testing::AssertionFailure()
           << dtype_name(got.dtype()) << shape_str(got.shape()) << " vs "
           << dtype_name(want.dtype()) << shape_str(want.shape());
  const size_t elem = dtype_size(got.dtype());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(static_cast<const char*>(got.raw()) + size_t(i) * elem,
                    static_cast<const char*>(want.raw()) + size_t(i) * elem, elem) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got.get(i) << " vs " << want.get(i);
  }
  return ::testing::AssertionSuccess();
}

// bit_identical, except that any NaN matches any NaN: IEEE 754 leaves a NaN result's sign
// and payload to the implementation, and GPU kernels' follow their instruction order
// (dy * 0 with dy infinite, then a subtraction: -nan in one kernel, nan in another).
inline ::testing::AssertionResult same_values(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) return bit_identical(got, want);
  const size_t elem = dtype_size(got.dtype());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::isnan(got.get(i)) && std::isnan(want.get(i))) continue;
    if (std::memcmp(static_cast<const char*>(got.raw()) + size_t(i) * elem,
                    static_cast<const char*>(want.raw()) + size_t(i) * elem, elem) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got.get(i) << " vs " << want.get(i);
  }
  return ::testing::AssertionSuccess();
}

}  // namespace fusebox::testing
