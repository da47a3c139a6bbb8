// Kernels generated at run time (CUDA C source made by the backend, e.g. a fused pointwise
// program: kernels/pointwise/fused_codegen.h), compiled with NVRTC for the device's
// architecture, loaded as a library (cudaLibraryLoadData) and launched by handle through
// CommandEncoder::launch_handle, so they are recorded into the step's CUDA graph like every
// other kernel.
//
//   GeneratedKernel k = generated_kernel(device, source, "fusebox_fused", 256, node_label(n));
//   ctx.encoder.launch_handle(k.kernel, grid, 256, args, reads, writes);
//
// When. A kernel entry asks for its kernel while it records its node: at an executable's
// compile time, before any stream capture (never inside capture_library_call), as cuDNN
// plans are built. A replayed step only launches.
//
// Caches. In memory: one library per (source, target, NVRTC version), for the process's
// life (a recorded graph names its kernels; libraries are never unloaded). On disk: the
// compiled image in a DiskPlanCache (runtime/plan_cache.h: checksummed, atomically replaced)
// under <cache dir>/nvrtc/<sm90-nvrtc13.0>, the file named by a hash of the key; the key
// (the full source, the target, NVRTC's version and the options) is stored in the file and
// compared whole. A corrupt or stale file is a miss with one warning; the image is compiled
// again and the file replaced; an image that the driver refuses to load is treated likewise.
// FUSEBOX_CACHE_DIR moves the disk cache (runtime/settings.h), empty: memory only.
//
// Options: --gpu-architecture=sm_XX (a cubin; compute_XX and PTX when this NVRTC does not
// know the device's architecture), -default-device, -std=c++17, --fmad=true (as nvcc
// compiles the backend's own kernels). A compile failure is an Error naming the caller's
// `where` with NVRTC's log.
//
// The key, compile and disk functions need no GPU (NVRTC is a compiler library); only
// generated_kernel loads onto a device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/runtime/device.h"
#include "backends/cuda/runtime/plan_cache.h"

namespace fusebox::cuda {

// What NVRTC compiles for.
struct NvrtcTarget {
  int arch = 0;              // 90: sm_90 or compute_90
  bool cubin = true;         // false: PTX for the virtual architecture, finished by the driver
  std::string name() const;  // "sm_90" / "compute_90"
};

// The target for a device of compute capability `sm` (major * 10 + minor): sm_XX when NVRTC
// supports it, else the newest architecture it supports below (PTX runs on later GPUs).
// Throws when NVRTC supports nothing at or below `sm`.
NvrtcTarget nvrtc_target(int sm);
// NVRTC's version, "13.0".
std::string nvrtc_version();
// The options every generated kernel is compiled with.
std::vector<std::string> nvrtc_options(const NvrtcTarget& target);
// The cache key (memory and disk): the source, the target, NVRTC's version, the options.
std::string nvrtc_cache_key(const std::string& source, const NvrtcTarget& target);

// The compiled image (cubin or PTX) of `source`; an Error naming `where`, with NVRTC's log,
// when it does not compile.
std::vector<uint8_t> nvrtc_compile(const std::string& source, const NvrtcTarget& target,
                                   const std::string& where);

// The disk cache of compiled images under `root` (the settings' cache dir) / "nvrtc";
// nullptr when root is empty.
std::unique_ptr<DiskPlanCache> nvrtc_disk_cache(const std::filesystem::path& root,
                                                const NvrtcTarget& target);

// The image of `source`: from `disk` (may be null) when it holds a valid one, else compiled
// and stored there. `from_disk` (optional) says which.
std::vector<uint8_t> nvrtc_image(const std::string& source, const NvrtcTarget& target,
                                 DiskPlanCache* disk, const std::string& where,
                                 bool* from_disk = nullptr);

// A loaded kernel, and how many blocks of the size it was asked for fit on one SM at once
// (so that a grid-stride kernel can launch exactly one wave of resident blocks).
struct GeneratedKernel {
  cudaKernel_t kernel = nullptr;
  int blocks_per_sm = 0;
};

// The kernel `name` (declared extern "C" in `source`) for `device`, for blocks of
// `block_threads`: from the memory cache, else from the disk cache or NVRTC, loaded once.
// Throws an Error naming `where`.
GeneratedKernel generated_kernel(Device& device, const std::string& source, const std::string& name,
                                 int block_threads, const std::string& where);

// Counters of the process-wide cache (tests and reports).
struct GeneratedKernelStats {
  uint64_t memory_hits = 0;
  uint64_t disk_hits = 0;
  uint64_t compiles = 0;
  uint64_t load_failures = 0;  // images the driver refused (then compiled again)
};
GeneratedKernelStats generated_kernel_stats();

}  // namespace fusebox::cuda
