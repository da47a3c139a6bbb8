// The per-device cuBLASLt handle, the per-(device, thread) cuDNN handles, and the checks
// for those libraries.
// Kept apart from runtime/device.cpp so that code using only the runtime API does not pull
// cuBLASLt and cuDNN into its link.
#include <dlfcn.h>

#include <mutex>
#include <unordered_map>

#include "backends/cuda/runtime/device.h"
#include "fusebox/core/compile_trace.h"
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

// cuDNN 9 encodes major * 10000 + minor * 100 + patch.
std::string version_string(int64_t v) {
  return cat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

// Where the loaded libcudnn lives, for the error: the file that defines cudnnGetVersion.
std::string loaded_cudnn_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudnnGetVersion), &info) != 0 && info.dli_fname != nullptr)
    return info.dli_fname;
  return "an unknown path";
}

// Once per process, before the first handle: a cuDNN older than the headers fusebox was built
// with is refused here, not discovered as corrupted memory later.
void check_loaded_cudnn() {
  static std::once_flag once;
  static std::string problem;
  std::call_once(once, [] {
    problem = cudnn_version_mismatch(CUDNN_VERSION, int64_t(cudnnGetVersion()));
    if (!problem.empty()) problem += cat(" (loaded from ", loaded_cudnn_path(), ")");
  });
  if (!problem.empty()) throw Error("cuda", problem);
}

}  // namespace

std::string cudnn_version_mismatch(int64_t compiled, int64_t loaded) {
  if (loaded / 10000 == compiled / 10000 && loaded / 100 >= compiled / 100) return "";
  return cat("fusebox was built against cuDNN ", version_string(compiled), " but cuDNN ",
             version_string(loaded),
             " was loaded: put the matching libcudnn (same major, minor at least ",
             compiled / 10000, ".", compiled / 100 % 100,
             ") first on LD_LIBRARY_PATH; an older one can corrupt memory");
}

// cuBLASLt hands every thread the same context for a device: the first GPU run saw two
// threads' cublasLtCreate return one pointer, so a per-thread handle destroyed at its
// thread's exit destroyed the other threads' handle too (a use after free, and likely the
// SIGFPE later in that run). One handle per device, never destroyed, is what cuBLASLt
// gives anyway.
cublasLtHandle_t Device::cublaslt_handle() const {
  std::call_once(cublaslt_once_, [this] {  // a throw leaves it unset: the next call retries
    DeviceGuard guard(id_);                // cublasLtCreate ties the context to the current device
    const TracePhase trace("cuda create the cuBLASLt handle");
    FUSEBOX_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  });
  return cublaslt_;
}

cudnnHandle_t Device::cudnn_handle(cudaStream_t stream) const {
  thread_local ThreadCudnnHandles handles;
  auto it = handles.by_device.find(id_);
  if (it == handles.by_device.end()) {
    check_loaded_cudnn();
    DeviceGuard guard(id_);  // cudnnCreate binds the handle to the current device
    cudnnHandle_t handle = nullptr;
    const TracePhase trace("cuda create a cuDNN handle");
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
