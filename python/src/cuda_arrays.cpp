// The CUDA side of the arrays (arrays.h): device pointers of DeviceArrays, which the public API
// does not expose, come from the executable layer's storage (src/executable/device_array.h);
// hence this file's own translation unit, the only one of the module on an internal header.
//
// Ordering is by whole-device synchronisation (correct whatever stream the caller's framework
// used, slower than following the caller's stream, which is a later slice: docs/python.md).
#include <cuda_runtime_api.h>

#include "arrays.h"
#include "executable/device_array.h"

namespace fusebox::python {

namespace {

void check_cuda(cudaError_t status, const char* what) {
  FUSEBOX_CHECK(status == cudaSuccess, "fusebox python: cuda", what, ": ",
                cudaGetErrorString(status));
}

void* device_pointer(const DeviceArray& a) {
  return a.storage()->tensor.data();
}

}  // namespace

DeviceArray cuda_feed(const InputArray& a, DType dtype) {
  DeviceArray staging = DeviceArray::empty(dtype, array_shape(a), Device::cuda);
  if (staging.nbytes() == 0) return staging;
  // The caller's kernels that wrote the array may still run on any of its streams.
  check_cuda(cudaDeviceSynchronize(), "waiting for the input's producer");
  check_cuda(
      cudaMemcpy(device_pointer(staging), a.data(), staging.nbytes(), cudaMemcpyDeviceToDevice),
      "copying an input");
  check_cuda(cudaDeviceSynchronize(), "copying an input");
  return staging;
}

std::vector<DeviceArray> own_copies(const std::vector<DeviceArray>& outputs) {
  std::vector<DeviceArray> copies;
  copies.reserve(outputs.size());
  // clone() writes a dense row-major array (the executable may keep an output channels-last).
  for (const DeviceArray& a : outputs) copies.push_back(a.clone());
  check_cuda(cudaDeviceSynchronize(), "copying the outputs");
  return copies;
}

nb::object to_dlpack(const DeviceArray& a) {
  auto* keep = new DeviceArray(a);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<DeviceArray*>(p); });
  const std::vector<size_t> shape(a.shape().begin(), a.shape().end());
  return nb::ndarray<nb::array_api>(device_pointer(a), shape.size(), shape.data(), owner, nullptr,
                                    dlpack_dtype(a.dtype()), nb::device::cuda::value, cuda_device())
      .cast();
}

}  // namespace fusebox::python
