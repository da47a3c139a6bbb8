// Whether a kernel launches with a block and dynamic shared memory, and how many of its blocks
// fit on the device at once: the occupancy checks the planners of persistent and wave-sized
// grids share (norm rows, depthwise rings). Host code.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/device.h"

namespace fusebox::cuda {

// A kernel with the largest block it is compiled for: the value of its __launch_bounds__
// (kUnbounded for a kernel without one), taken from the same constexpr that sets the
// bound, so that a planner cannot ask for a block the kernel does not accept.
constexpr int kUnbounded = 1024;
template <class Kernel>
struct BoundKernel {
  Kernel fn = nullptr;
  int max_block = 0;
  explicit operator bool() const { return fn != nullptr; }
};

// What the loaded kernel needs (cudaFuncGetAttributes on `device`, which must be current),
// queried once per kernel and device.
struct KernelLimits {
  int max_threads = 0;       // maxThreadsPerBlock
  int registers = 0;         // per thread
  size_t static_shared = 0;  // bytes
  size_t local_bytes = 0;    // per thread (register spills, local arrays)
};
inline KernelLimits kernel_limits(const void* fn, int device) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, KernelLimits> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = cache.try_emplace({fn, device});
  if (fresh) {
    cudaFuncAttributes attributes{};
    const cudaError_t status = cudaFuncGetAttributes(&attributes, fn);
    if (status != cudaSuccess) {
      cache.erase(it);
      FUSEBOX_CUDA_CHECK(status);
    }
    it->second = {attributes.maxThreadsPerBlock, attributes.numRegs, attributes.sharedSizeBytes,
                  attributes.localSizeBytes};
  }
  return it->second;
}

// Whether `kernel` launches with `block` threads and `shared_bytes` of dynamic shared
// memory on a device with `props`: the block within the kernel's __launch_bounds__ and
// the loaded kernel's maxThreadsPerBlock, its registers (allocated per warp in units of
// 256, i.e. per thread in units of 8) within the block's register file, its static plus
// dynamic shared memory within the opt-in limit. A launch outside any of these fails
// (cudaErrorInvalidValue or cudaErrorLaunchOutOfResources); the occupancy calculator
// counts registers and shared memory but is not relied on to know the __launch_bounds__
// (a 61-register kernel bounded at 512 threads "fits" 1024 by its registers), so each
// limit is checked here.
// Opts the kernel in to more than the default dynamic shared memory when it needs it.
template <class Kernel>
bool launchable(const BoundKernel<Kernel>& kernel, int block, size_t shared_bytes,
                const DeviceProperties& props) {
  if (!kernel || block < 1 || block > kernel.max_block || block > props.max_threads_per_block) {
    return false;
  }
  const void* fn = reinterpret_cast<const void*>(kernel.fn);
  const DeviceGuard guard(props.id);
  const KernelLimits limits = kernel_limits(fn, props.id);
  if (block > limits.max_threads) return false;
  const int64_t warps = (block + 31) / 32;
  const int64_t registers = warps * 32 * ((limits.registers + 7) / 8 * 8);
  if (registers > props.registers_per_block) return false;
  if (limits.static_shared + shared_bytes > props.shared_memory_per_block_optin) return false;
  if (shared_bytes > props.shared_memory_per_block) {
    // The most the kernel may use, so that no later opt-in (the encoder's) is undone.
    const size_t most = props.shared_memory_per_block_optin - limits.static_shared;
    FUSEBOX_CUDA_CHECK(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)));
  }
  return true;
}

// Blocks for a persistent grid over `work_items` items (rows or row groups): as many as
// fit on the device at once (from the occupancy calculator), never more than items;
// 0 when the kernel cannot launch with this block and shared memory (launchable).
template <class Kernel>
unsigned persistent_grid(const BoundKernel<Kernel>& kernel, int block, size_t shared_bytes,
                         const DeviceProperties& props, int64_t work_items) {
  if (!launchable(kernel, block, shared_bytes, props)) return 0;
  const DeviceGuard guard(props.id);
  int per_sm = 0;
  const cudaError_t status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, reinterpret_cast<const void*>(kernel.fn), block, shared_bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // not a sticky error: this layout is simply not used
    return 0;
  }
  if (per_sm == 0) return 0;
  const int64_t resident = int64_t(per_sm) * props.sm_count;
  return unsigned(std::clamp<int64_t>(work_items, 1, resident));
}

// Register spills up to this many bytes per thread are accepted (a word or two saved once);
// more are not: such a layout is skipped.
constexpr size_t kMaxSpillBytes = 16;

// Whether the loaded kernel keeps (nearly) everything in registers: local memory of at
// most kMaxSpillBytes per thread.
template <class Kernel>
bool spill_free(const BoundKernel<Kernel>& k, const DeviceProperties& props) {
  const DeviceGuard guard(props.id);
  const void* fn = reinterpret_cast<const void*>(k.fn);
  return kernel_limits(fn, props.id).local_bytes <= kMaxSpillBytes;
}

// The persistent grid of a kernel compiled with __cluster_dims__(cluster): `cluster` times
// the clusters that can be resident at once (at most cluster_work of them), or 0 when it
// does not launch (cudaOccupancyMaxActiveClusters: clusters must fit in one GPC).
template <class Kernel>
unsigned persistent_cluster_grid(const BoundKernel<Kernel>& kernel, int block, size_t shared_bytes,
                                 const DeviceProperties& props, int cluster, int64_t cluster_work) {
  if (!launchable(kernel, block, shared_bytes, props)) return 0;
  const DeviceGuard guard(props.id);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(cluster * props.sm_count));
  config.blockDim = dim3(unsigned(block));
  config.dynamicSmemBytes = shared_bytes;
  int clusters = 0;
  const void* fn = reinterpret_cast<const void*>(kernel.fn);
  if (cudaOccupancyMaxActiveClusters(&clusters, fn, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // not a sticky error: this layout is simply not used
    return 0;
  }
  if (clusters == 0) return 0;
  return unsigned(cluster * std::clamp<int64_t>(cluster_work, 1, clusters));
}

}  // namespace fusebox::cuda
