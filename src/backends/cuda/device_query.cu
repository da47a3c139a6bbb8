// The CUDA backend starts here: for now, whether a usable GPU is present.
// (Issue 4 adds the device layer, allocator, command encoder and kernels.)
#include <cuda_runtime.h>

namespace fusebox::cuda {

// True when the CUDA runtime loads and reports at least one device. Never throws:
// a machine without a driver (CI) simply has no GPU.
bool device_present() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

}  // namespace fusebox::cuda
