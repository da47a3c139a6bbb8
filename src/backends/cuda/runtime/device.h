// The CUDA device layer: what each GPU is (properties read from the device), its stream,
// and the per-thread cuBLASLt and cuDNN handles, plus the error checks for those libraries.
//
//   Device& gpu = Device::get(0);               // created on first use, lives until exit
//   int sms = gpu.properties().sm_count;
//   kernel<<<grid, block, 0, gpu.stream()>>>(...);  // (normally through a CommandEncoder)
//   FUSEBOX_CUBLAS_CHECK(cublasLtMatmul(gpu.cublaslt_handle(), ...));
//
// Threads: Device is safe to share. The cuBLASLt handle is per device, shared by every
// thread (cuBLASLt gives all threads of a process one context per device anyway, and takes
// the stream and workspace with each call); created on first use, never destroyed (the
// process's end reclaims it, as the Device itself). cuDNN handles are per (device, thread),
// since a handle carries the stream it is bound to: created on first use by each thread,
// destroyed when that thread exits.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>

#include "backends/cuda/runtime/check.h"

namespace fusebox::cuda {

// Number of CUDA devices; 0 when there is no driver or no device. Never throws.
int device_count();
// device_count() > 0 (runtime/device_query.cu; the runtime's check for a usable GPU). Never throws.
bool device_present();

// What a kernel author needs to size a launch. Read once per device from the device.
struct DeviceProperties {
  int id = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int sm_count = 0;
  size_t l2_cache_bytes = 0;
  size_t shared_memory_per_block = 0;        // a launch gets this much without opting in
  size_t shared_memory_per_block_optin = 0;  // ... up to this after cudaFuncSetAttribute
  size_t shared_memory_per_sm = 0;
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int registers_per_block = 0;
  int registers_per_sm = 0;
  int warp_size = 0;
  size_t total_memory_bytes = 0;

  int compute_capability() const { return compute_major * 10 + compute_minor; }  // 90 on H100
  // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 50.0 MiB L2, 79.1 GiB)"
  std::string describe() const;
};

class Device {
 public:
  // The device `id`, created on first use. Throws when there is no such device.
  static Device& get(int id);

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int id() const { return id_; }
  const DeviceProperties& properties() const { return properties_; }

  // The device's stream (non-blocking: it does not synchronise with the legacy default
  // stream). Created on first use.
  cudaStream_t stream();
  // Waits for everything queued on stream().
  void synchronize();

  // The device's cuBLASLt handle, the same for every thread (cuBLASLt takes the stream
  // per call).
  cublasLtHandle_t cublaslt_handle() const;
  // This thread's cuDNN handle for the device, bound to `stream` (cudnnSetStream on every
  // call, so the handle follows whichever stream, e.g. a capture stream, the caller uses).
  cudnnHandle_t cudnn_handle(cudaStream_t stream) const;

 private:
  explicit Device(int id);

  int id_;
  DeviceProperties properties_;
  std::once_flag stream_once_;
  cudaStream_t stream_ = nullptr;
  mutable std::once_flag cublaslt_once_;
  mutable cublasLtHandle_t cublaslt_ = nullptr;
};

// Makes `id` the current device for a scope and restores the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int id);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

[[noreturn]] void throw_cublas_error(cublasStatus_t status, std::string_view call, const char* file,
                                     int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, std::string_view call, const char* file,
                                    int line);

// Why the cuDNN loaded at run time (`loaded`, cudnnGetVersion()) cannot serve code built
// against `compiled` (CUDNN_VERSION), or "" when it can: same major and at least the compiled
// minor. An older minor is not safe: cudnn-frontend builds graphs with what the headers
// describe, and cuDNN 9.14 running graphs written for 9.19 corrupted memory in the fused
// attention's backward (illegal addresses, NaN losses; bench/results 2026-11-28 session 17).
std::string cudnn_version_mismatch(int64_t compiled, int64_t loaded);

inline void check_cublas(cublasStatus_t status, std::string_view call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas_error(status, call, file, line);
}
inline void check_cudnn(cudnnStatus_t status, std::string_view call, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS) throw_cudnn_error(status, call, file, line);
}

}  // namespace fusebox::cuda

// Throw fusebox::Error("cuda", "<call> failed: <status name> (<description>) at <file>:<line>").
#define FUSEBOX_CUBLAS_CHECK(call) ::fusebox::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#define FUSEBOX_CUDNN_CHECK(call) ::fusebox::cuda::check_cudnn((call), #call, __FILE__, __LINE__)
