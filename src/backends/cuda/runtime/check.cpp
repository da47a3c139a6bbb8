#include "backends/cuda/runtime/check.h"

#include <cstring>

#include "fusebox/core/error.h"

namespace fusebox::cuda {

std::string cuda_error_text(cudaError_t err) {
  return cat(cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
}

const char* file_basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

void throw_cuda_error(cudaError_t err, std::string_view call, const char* file, int line) {
  (void)cudaGetLastError();  // reset a non-sticky error; a sticky one stays, as it must
  throw Error("cuda",
              cat(call, " failed: ", cuda_error_text(err), " at ", file_basename(file), ":", line));
}

}  // namespace fusebox::cuda
