// Dtype dispatch shared by the CPU and CUDA backends (host code): call a generic lambda
// with the element type of a dtype, instantiating it only for the types the kernel takes.
// The CUDA backend maps the host types to its device types on top of these
// (cuda/kernels/common/dtype_dispatch.cuh); fusebox/core/dtype.h has visit_dtype for all.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/common/where.h"
#include "fusebox/core/dtype.h"
#include "fusebox/core/error.h"
#include "fusebox/ir/graph.h"

namespace fusebox {

// Calls f(T{}) for a floating dtype (double, float, Half, BFloat16); any other dtype is an
// Error naming `where`.
template <class F>
decltype(auto) visit_float(const Where& where, DType t, F&& f) {
  switch (t) {
    case DType::f64:
      return f(double{});
    case DType::f32:
      return f(float{});
    case DType::f16:
      return f(Half{});
    case DType::bf16:
      return f(BFloat16{});
    default:
      break;
  }
  throw Error(where.str(), cat("expects a floating-point tensor, got ", dtype_name(t)));
}

// Calls f(T{}) with T an unsigned integer of `bytes` bytes: for kernels that only move
// elements and never look at their values (copies, transposes, concat, slice, pad).
template <class F>
decltype(auto) visit_bytes(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint64_t{});
  }
}

}  // namespace fusebox
