// Host-side dtype dispatch of the CUDA kernels: maps fusebox's element types to CUDA's and
// calls a generic lambda with the device type (include from .cu files only).
//
//   device_t<T>        the device element type of a host type (Half -> __half, ...)
//   visit_device_dtype(t, f) / visit_device_float(n, t, f)
//                      call f(T{}) with T the *device* type of dtype t
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/common/dtype_dispatch.h"
#include "backends/cuda/device/math.cuh"
#include "fusebox/core/dtype.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {

template <class T>
struct device_type {
  using type = T;
};
template <>
struct device_type<Half> {
  using type = __half;
};
template <>
struct device_type<BFloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using device_t = typename device_type<T>::type;

// Calls f(T{}) with T the device type of `t` (double, float, __half, __nv_bfloat16,
// int64_t, int32_t, bool). Host code.
template <class F>
decltype(auto) visit_device_dtype(DType t, F&& f) {
  return visit_dtype(t, [&](auto host_tag) { return f(device_t<decltype(host_tag)>{}); });
}

// The same for floating dtypes only (instantiates f for those only); any other dtype is
// an Error naming `where` (a Node, or a name for a kernel called directly).
template <class F>
decltype(auto) visit_device_float(const Where& where, DType t, F&& f) {
  return visit_float(where, t, [&](auto host_tag) { return f(device_t<decltype(host_tag)>{}); });
}

}  // namespace fusebox::cuda
