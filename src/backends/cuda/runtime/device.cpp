#include "backends/cuda/runtime/device.h"

#include <memory>
#include <vector>

#include "fusebox/backends/cuda.h"
#include "fusebox/core/error.h"
#include "fusebox/core/memory.h"

namespace fusebox::cuda {
namespace {

DeviceProperties read_properties(int id) {
  cudaDeviceProp prop{};
  FUSEBOX_CUDA_CHECK(cudaGetDeviceProperties(&prop, id));
  DeviceProperties p;
  p.id = id;
  p.name = prop.name;
  p.compute_major = prop.major;
  p.compute_minor = prop.minor;
  p.sm_count = prop.multiProcessorCount;
  p.l2_cache_bytes = size_t(prop.l2CacheSize);
  p.shared_memory_per_block = prop.sharedMemPerBlock;
  p.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  p.shared_memory_per_sm = prop.sharedMemPerMultiprocessor;
  p.max_threads_per_block = prop.maxThreadsPerBlock;
  p.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
  p.registers_per_block = prop.regsPerBlock;
  p.registers_per_sm = prop.regsPerMultiprocessor;
  p.warp_size = prop.warpSize;
  p.total_memory_bytes = prop.totalGlobalMem;
  return p;
}

}  // namespace

int device_count() {
  // The count cannot change while the process runs; ask the runtime once.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: not an error here
      return 0;
    }
    return n;
  }();
  return count;
}

std::string DeviceProperties::describe() const {
  return cat(name, " (sm_", compute_major, compute_minor, ", ", sm_count, " SMs, ",
             format_bytes(l2_cache_bytes), " L2, ", format_bytes(total_memory_bytes), ")");
}

Device& Device::get(int id) {
  // Devices are never destroyed: streams and handles must not be torn down after the
  // CUDA runtime has unloaded at exit, and the driver reclaims them with the process.
  static std::mutex mutex;
  static auto* devices = new std::vector<std::unique_ptr<Device>>();
  int count = device_count();
  FUSEBOX_CHECK(count > 0, "cuda", "no CUDA device is available (cudaGetDeviceCount found none)");
  FUSEBOX_CHECK(id >= 0 && id < count, "cuda", "device ", id, " does not exist: ", count,
                " CUDA device(s) present");
  std::lock_guard lock(mutex);
  if (devices->empty()) devices->resize(size_t(count));
  auto& slot = (*devices)[size_t(id)];
  if (!slot) slot.reset(new Device(id));
  return *slot;
}

Device::Device(int id) : id_(id), properties_(read_properties(id)) {}

cudaStream_t Device::stream() {
  std::call_once(stream_once_, [this] {
    DeviceGuard guard(id_);
    FUSEBOX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  });
  return stream_;
}

void Device::synchronize() {
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

DeviceGuard::DeviceGuard(int id) {
  FUSEBOX_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != id) {
    FUSEBOX_CUDA_CHECK(cudaSetDevice(id));
  } else {
    previous_ = -1;  // nothing to restore
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // a destructor must not throw
}

std::string device_name(int device) {
  return Device::get(device).properties().name;
}

}  // namespace fusebox::cuda
