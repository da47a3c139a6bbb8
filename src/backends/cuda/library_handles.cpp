// Per-(device, thread) cuBLASLt and cuDNN handles, and the checks for those libraries.
// Kept apart from device.cpp so that code using only the runtime API does not pull
// cuBLASLt and cuDNN into its link.
#include <unordered_map>

#include "backends/cuda/device.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

// A thread's handles, one per device, destroyed when the thread exits. The library
// handles are not thread-safe to share (cuDNN binds a stream to its handle).
struct ThreadHandles {
  std::unordered_map<int, cublasLtHandle_t> cublaslt;
  std::unordered_map<int, cudnnHandle_t> cudnn;

  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    // Status ignored: at process exit the libraries may already be shutting down.
    for (auto& [device, handle] : cublaslt) (void)cublasLtDestroy(handle);
    for (auto& [device, handle] : cudnn) (void)cudnnDestroy(handle);
  }
};

ThreadHandles& thread_handles() {
  thread_local ThreadHandles handles;
  return handles;
}

}  // namespace

cublasLtHandle_t Device::cublaslt_handle() const {
  auto& handles = thread_handles().cublaslt;
  auto it = handles.find(id_);
  if (it != handles.end()) return it->second;
  DeviceGuard guard(id_);
  cublasLtHandle_t handle = nullptr;
  FUSEBOX_CUBLAS_CHECK(cublasLtCreate(&handle));
  handles.emplace(id_, handle);
  return handle;
}

cudnnHandle_t Device::cudnn_handle(cudaStream_t stream) const {
  auto& handles = thread_handles().cudnn;
  auto it = handles.find(id_);
  if (it == handles.end()) {
    DeviceGuard guard(id_);  // cudnnCreate binds the handle to the current device
    cudnnHandle_t handle = nullptr;
    FUSEBOX_CUDNN_CHECK(cudnnCreate(&handle));
    it = handles.emplace(id_, handle).first;
  }
  FUSEBOX_CUDNN_CHECK(cudnnSetStream(it->second, stream));
  return it->second;
}

void throw_cublas_error(cublasStatus_t status, std::string_view call, const char* file, int line) {
  throw Error("cuda",
              cat(call, " failed: ", cublasLtGetStatusName(status), " (",
                  cublasLtGetStatusString(status), ") at ", file_basename(file), ":", line));
}

void throw_cudnn_error(cudnnStatus_t status, std::string_view call, const char* file, int line) {
  // cuDNN 9 keeps a detailed message for the last failure on this thread.
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string message = cat(call, " failed: ", cudnnGetErrorString(status));
  if (detail[0] != '\0') message += cat(" (", detail, ")");
  throw Error("cuda", cat(message, " at ", file_basename(file), ":", line));
}

}  // namespace fusebox::cuda
