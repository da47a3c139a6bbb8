#include "backends/cuda/runtime/nvrtc.h"

#include <nvrtc.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/settings.h"
#include "fusebox/core/compile_trace.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {

namespace {

std::string nvrtc_text(nvrtcResult r) {
  return nvrtcGetErrorString(r);
}

// An NVRTC call that cannot fail for a well-formed program; a failure is a broken toolkit.
void check_nvrtc(nvrtcResult r, const char* call) {
  if (r != NVRTC_SUCCESS) throw Error("nvrtc", cat(call, " failed: ", nvrtc_text(r)));
}

// Destroys the program on every path.
class Program {
 public:
  Program(const std::string& source, const char* name) {
    check_nvrtc(nvrtcCreateProgram(&prog_, source.c_str(), name, 0, nullptr, nullptr),
                "nvrtcCreateProgram");
  }
  ~Program() { (void)nvrtcDestroyProgram(&prog_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return prog_; }

  std::string log() const {
    size_t size = 0;
    if (nvrtcGetProgramLogSize(prog_, &size) != NVRTC_SUCCESS || size == 0) return "";
    std::string text(size, '\0');
    if (nvrtcGetProgramLog(prog_, text.data()) != NVRTC_SUCCESS) return "";
    while (!text.empty() && (text.back() == '\0' || text.back() == '\n')) text.pop_back();
    return text;
  }

 private:
  nvrtcProgram prog_ = nullptr;
};

int nvrtc_version_number() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return major * 1000 + minor * 10;  // as CUDART_VERSION: 13000
}

// A loaded library and the kernels looked up in it (by name and block size).
struct Loaded {
  cudaLibrary_t library = nullptr;
  std::map<std::pair<std::string, int>, GeneratedKernel> kernels;
};

// The process-wide cache (never destroyed: recorded graphs name its kernels until exit).
struct Cache {
  std::mutex mutex;
  std::unordered_map<std::string, Loaded> loaded;                        // by nvrtc_cache_key
  std::map<std::pair<int, bool>, std::unique_ptr<DiskPlanCache>> disks;  // by target
  std::filesystem::path disk_root;  // the root the disks were made for
  GeneratedKernelStats stats;
};

Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

DiskPlanCache* disk_for(Cache& c, const NvrtcTarget& target) {
  const std::filesystem::path& root = settings().cache_dir;
  if (root != c.disk_root) {  // the settings were read again (tests): start over
    c.disks.clear();
    c.disk_root = root;
  }
  std::unique_ptr<DiskPlanCache>& disk = c.disks[{target.arch, target.cubin}];
  if (!disk) disk = nvrtc_disk_cache(root, target);
  return disk.get();
}

// The image loaded as a library, or nullptr with `why` set.
cudaLibrary_t load(const std::vector<uint8_t>& image, std::string& why) {
  cudaLibrary_t library = nullptr;
  const cudaError_t err =
      cudaLibraryLoadData(&library, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (err == cudaSuccess) return library;
  (void)cudaGetLastError();
  why = cuda_error_text(err);
  return nullptr;
}

}  // namespace

std::string NvrtcTarget::name() const {
  return cat(cubin ? "sm_" : "compute_", arch);
}

NvrtcTarget nvrtc_target(int sm) {
  int count = 0;
  check_nvrtc(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(size_t(count), 0);
  if (count > 0) check_nvrtc(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  if (std::find(archs.begin(), archs.end(), sm) != archs.end()) return {sm, true};
  int best = 0;
  for (int a : archs)
    if (a <= sm) best = std::max(best, a);
  FUSEBOX_CHECK(best > 0, "nvrtc", "NVRTC ", nvrtc_version(),
                " compiles for no architecture at or below sm_", sm);
  return {best, false};
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return cat(major, ".", minor);
}

std::vector<std::string> nvrtc_options(const NvrtcTarget& target) {
  return {"--gpu-architecture=" + target.name(), "-default-device", "-std=c++17", "--fmad=true"};
}

std::string nvrtc_cache_key(const std::string& source, const NvrtcTarget& target) {
  CacheKeyBuilder key;
  key.add("kind", "nvrtc-image").add("target", target.name()).add("nvrtc", nvrtc_version());
  for (const std::string& option : nvrtc_options(target)) key.add("option", option);
  key.add("source", source);
  return key.bytes();
}

std::vector<uint8_t> nvrtc_compile(const std::string& source, const NvrtcTarget& target,
                                   const std::string& where) {
  const TracePhase trace("nvrtc compile");
  Program prog(source, "fusebox_generated.cu");
  const std::vector<std::string> options = nvrtc_options(target);
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());
  const nvrtcResult compiled = nvrtcCompileProgram(prog.get(), int(argv.size()), argv.data());
  if (compiled != NVRTC_SUCCESS) {
    throw Error(where,
                cat("NVRTC ", nvrtc_version(), " could not compile the generated kernel for ",
                    target.name(), " (", nvrtc_text(compiled), "). NVRTC's log:\n", prog.log()));
  }
  size_t size = 0;
  std::vector<uint8_t> image;
  if (target.cubin) {
    check_nvrtc(nvrtcGetCUBINSize(prog.get(), &size), "nvrtcGetCUBINSize");
    image.resize(size);
    check_nvrtc(nvrtcGetCUBIN(prog.get(), reinterpret_cast<char*>(image.data())), "nvrtcGetCUBIN");
  } else {
    check_nvrtc(nvrtcGetPTXSize(prog.get(), &size), "nvrtcGetPTXSize");  // with its NUL
    image.resize(size);
    check_nvrtc(nvrtcGetPTX(prog.get(), reinterpret_cast<char*>(image.data())), "nvrtcGetPTX");
  }
  return image;
}

std::unique_ptr<DiskPlanCache> nvrtc_disk_cache(const std::filesystem::path& root,
                                                const NvrtcTarget& target) {
  if (root.empty()) return nullptr;
  // The identity's fields hold NVRTC's: the target's name, its architecture, NVRTC's version
  // number (where a plan holds cuDNN's) and version text.
  PlanCacheIdentity identity{target.name(), target.arch, nvrtc_version_number(),
                             "nvrtc " + nvrtc_version()};
  const std::string subdirectory =
      cat(target.cubin ? "sm" : "compute", target.arch, "-nvrtc", nvrtc_version());
  return std::make_unique<DiskPlanCache>(root / "nvrtc", std::move(identity), subdirectory);
}

std::vector<uint8_t> nvrtc_image(const std::string& source, const NvrtcTarget& target,
                                 DiskPlanCache* disk, const std::string& where, bool* from_disk) {
  const std::string key = nvrtc_cache_key(source, target);
  if (disk != nullptr) {
    if (std::optional<std::vector<uint8_t>> stored = disk->load(key)) {
      if (from_disk) *from_disk = true;
      return std::move(*stored);
    }
  }
  std::vector<uint8_t> image = nvrtc_compile(source, target, where);
  if (disk != nullptr) disk->store(key, image);  // a failure warns; the image stays in memory
  if (from_disk) *from_disk = false;
  return image;
}

GeneratedKernel generated_kernel(Device& device, const std::string& source, const std::string& name,
                                 int block_threads, const std::string& where) {
  const NvrtcTarget target = nvrtc_target(device.properties().compute_capability());
  const std::string key = nvrtc_cache_key(source, target);
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  DeviceGuard guard(device.id());
  auto found = c.loaded.find(key);
  if (found != c.loaded.end()) {
    ++c.stats.memory_hits;
  } else {  // compiled or loaded, then cached (nothing is cached when this throws)
    DiskPlanCache* disk = disk_for(c, target);
    bool from_disk = false;
    std::vector<uint8_t> image = nvrtc_image(source, target, disk, where, &from_disk);
    std::string why;
    cudaLibrary_t library = load(image, why);
    if (library == nullptr && from_disk) {
      // A valid file the driver refuses (another driver wrote it, say): compile again.
      ++c.stats.load_failures;
      plan_cache_warning(cat("NVRTC image cache: the driver refused the stored image for a ",
                             "generated kernel (", why, "); compiling it again and replacing ",
                             disk->path_of(key).string()));
      image = nvrtc_compile(source, target, where);
      disk->store(key, image);
      from_disk = false;
      library = load(image, why);
    }
    if (library == nullptr) {
      throw Error(where, cat("cudaLibraryLoadData refused the generated kernel compiled for ",
                             target.name(), ": ", why));
    }
    ++(from_disk ? c.stats.disk_hits : c.stats.compiles);
    found = c.loaded.emplace(key, Loaded{library, {}}).first;
  }
  Loaded& entry = found->second;
  GeneratedKernel& kernel = entry.kernels[{name, block_threads}];
  if (kernel.kernel == nullptr) {
    cudaKernel_t handle = nullptr;
    FUSEBOX_CUDA_CHECK_AS(cudaLibraryGetKernel(&handle, entry.library, name.c_str()),
                          cat("cudaLibraryGetKernel(", name, ")"));
    int blocks = 0;
    FUSEBOX_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, reinterpret_cast<const void*>(handle), block_threads, 0));
    kernel = {handle, std::max(blocks, 1)};
  }
  return kernel;
}

GeneratedKernelStats generated_kernel_stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.stats;
}

}  // namespace fusebox::cuda
