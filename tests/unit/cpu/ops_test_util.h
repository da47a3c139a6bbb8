// Helpers for the CPU op tests: per-dtype tolerances, the float dtypes to sweep,
// expected tensors built from f64 reference values, and naive index arithmetic
// for reference loops.
#pragma once

#include <string>
#include <vector>

#include "testing.h"

namespace fusebox::testing {

inline const std::vector<DType> kFloatTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

struct Tolerance {
  double rtol, atol;
};

// For a result computed in f32 (f64 for f64) and rounded once to `t`: a couple
// of ulps of `t` relative, and a small absolute floor for values near 0.
inline Tolerance tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return {1e-12, 1e-13};
    case DType::f32:
      return {2e-6, 1e-6};
    case DType::f16:
      return {2e-3, 1e-4};
    case DType::bf16:
      return {1.6e-2, 1e-3};
    default:
      return {0, 0};
  }
}

// The reference values, rounded to `t` as the kernel's single rounding does.
inline Tensor expected(DType t, Shape shape, const std::vector<double>& values) {
  return Tensor::from_doubles(t, std::move(shape), values);
}

inline ::testing::AssertionResult close_to(const Tensor& actual, DType t, const Shape& shape,
                                           const std::vector<double>& values, double slack = 1.0) {
  const Tolerance tol = tolerance(t);
  return all_close(actual, expected(t, shape, values), tol.rtol * slack, tol.atol * slack);
}

// Row-major coordinates of flat index i in `shape`, and back.
inline std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}
inline int64_t ravel(const std::vector<int64_t>& c, const Shape& shape) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + c[d];
  return i;
}

// The flat index into an operand of shape `in` (numpy-broadcast to the output)
// for output coordinates `out_coord`.
inline int64_t broadcast_index(const std::vector<int64_t>& out_coord, const Shape& in) {
  const size_t lead = out_coord.size() - in.size();
  std::vector<int64_t> c(in.size());
  for (size_t d = 0; d < in.size(); ++d) c[d] = in[d] == 1 ? 0 : out_coord[lead + d];
  return ravel(c, in);
}

inline std::string dtype_label(DType t) {
  return std::string("dtype ") + dtype_name(t);
}

}  // namespace fusebox::testing
