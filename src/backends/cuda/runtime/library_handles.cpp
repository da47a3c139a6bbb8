// The per-device cuBLASLt handle, the per-(device, thread) cuDNN handles, and the checks
// for those libraries.
// Kept apart from runtime/device.cpp so that code using only the runtime API does not pull
// cuBLASLt and cuDNN into its link.
#include <unordered_map>

#include "backends/cuda/runtime/device.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

// A thread's cuDNN handles, one per device, destroyed when the thread exits (before the
// process's static destructors, so the libraries are still there). A cuDNN handle is bound
// to one stream at a time, so threads cannot share one.
struct ThreadCudnnHandles {
  std::unordered_map<int, cudnnHandle_t> by_device;

  ThreadCudnnHandles() = default;
  ThreadCudnnHandles(const ThreadCudnnHandles&) = delete;
  ThreadCudnnHandles& operator=(const ThreadCudnnHandles&) = delete;
  ~ThreadCudnnHandles() {
    // Status ignored: a destructor must not throw.
    int current = -1;
    bool restore = cudaGetDevice(&current) == cudaSuccess;
    for (auto& [device, handle] : by_device) {
      (void)cudaSetDevice(device);  // the handle's device
      (void)cudnnDestroy(handle);
    }
    if (restore) (void)cudaSetDevice(current);
  }
};

}  // namespace

// cuBLASLt hands every thread the same context for a device: the first GPU run saw two
// threads' cublasLtCreate return one pointer, so a per-thread handle destroyed at its
// thread's exit destroyed the other threads' handle too (a use after free, and likely the
// SIGFPE later in that run). One handle per device, never destroyed, is what cuBLASLt
// gives anyway.
cublasLtHandle_t Device::cublaslt_handle() const {
  std::call_once(cublaslt_once_, [this] {  // a throw leaves it unset: the next call retries
    DeviceGuard guard(id_);                // cublasLtCreate ties the context to the current device
    FUSEBOX_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  });
  return cublaslt_;
}

cudnnHandle_t Device::cudnn_handle(cudaStream_t stream) const {
  thread_local ThreadCudnnHandles handles;
  auto it = handles.by_device.find(id_);
  if (it == handles.by_device.end()) {
    DeviceGuard guard(id_);  // cudnnCreate binds the handle to the current device
    cudnnHandle_t handle = nullptr;
    FUSEBOX_CUDNN_CHECK(cudnnCreate(&handle));
    it = handles.by_device.emplace(id_, handle).first;
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
