// Error checks for CUDA runtime calls. A failed call throws
//   fusebox::Error("cuda", "cudaMalloc(&ptr, bytes) failed: out of memory
//                           (cudaErrorMemoryAllocation) at runtime/allocator.cpp:123")
// naming the call as written, the runtime's message, the error's name and the site.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

namespace fusebox::cuda {

// "out of memory (cudaErrorMemoryAllocation)"
std::string cuda_error_text(cudaError_t err);

// Throws the error described above. Clears the runtime's last error first, so that a
// recoverable failure (a bad argument, out of memory) does not resurface in a later check.
[[noreturn]] void throw_cuda_error(cudaError_t err, std::string_view call, const char* file,
                                   int line);

inline void check_cuda(cudaError_t err, std::string_view call, const char* file, int line) {
  if (err != cudaSuccess) throw_cuda_error(err, call, file, line);
}

// "runtime/allocator.cpp" from __FILE__'s full path.
const char* file_basename(const char* path);

}  // namespace fusebox::cuda

// FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(s)) throws fusebox::Error("cuda", ...) on failure.
#define FUSEBOX_CUDA_CHECK(call) ::fusebox::cuda::check_cuda((call), #call, __FILE__, __LINE__)
// Same, with the call described by a string (e.g. naming a byte count) instead of its text.
// The description is evaluated only on failure: call sites on hot paths build strings.
#define FUSEBOX_CUDA_CHECK_AS(call, description)                                               \
  do {                                                                                         \
    const cudaError_t fusebox_cuda_err_ = (call);                                              \
    if (fusebox_cuda_err_ != cudaSuccess)                                                      \
      ::fusebox::cuda::throw_cuda_error(fusebox_cuda_err_, (description), __FILE__, __LINE__); \
  } while (0)
