// Device memory for the CUDA backend: a caching allocator and the DeviceBuffer handle.
//
//   CachingAllocator& memory = CachingAllocator::for_device(0);
//   DeviceBuffer x = memory.allocate(n * sizeof(float));   // may come from the cache
//   float* p = x.as<float>();
//   // ... record work on x through a CommandEncoder, which keeps x alive until that
//   // work has finished; dropping the last handle returns the block to the cache.
//
// Sizes. A request of up to 1 MiB rounds up to a multiple of 512 B; a larger one rounds up
// to a multiple of 2 MiB. Why: the driver backs large allocations with 2 MiB pages, so a
// large block already occupies whole pages and rounding costs little memory while making
// blocks of nearby sizes interchangeable; small requests are many and varied, and 512 B
// steps keep their waste small (and every block 512-byte aligned, enough for any vector
// access). A cached block serves a request when it is at least the rounded size and at most
// 25% larger (the smallest such block wins), so a repeated step reuses its blocks exactly
// and a slightly different shape still hits.
//
// Limit. FUSEBOX_CUDA_MEMORY_LIMIT (bytes, or with a K/M/G suffix) caps what the
// allocator holds from the device, in use plus cached. Unset: no cap but the device's.
//
// Out of memory. When a request cannot be met (the limit, or cudaMalloc failing), the
// allocator waits for in-flight work to hand back its buffers (the encoders' reclaimers),
// frees its whole cache, and tries once more; then it throws an Error stating the bytes
// asked for, the bytes in use and cached, the device's free memory and the limit.
//
// Memory comes from plain cudaMalloc, never managed memory. A freed block goes back to the
// cache at once: keeping it alive while GPU work still uses it is the owner's job (a
// CommandEncoder holds every buffer its recorded work touches until that work completes).
// Threads: all members are safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

namespace fusebox::cuda {

namespace detail {
struct Pool;
struct Block;
}  // namespace detail

// Shared handle to a block of device memory (like Tensor: copies share the bytes). The
// block returns to its allocator's cache when the last handle goes. An empty handle
// (default, or a 0-byte allocation) has data() == nullptr and size() == 0.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;

  void* data() const;
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }
  size_t size() const;      // bytes asked for
  size_t capacity() const;  // bytes of the block behind it (>= size(), a rounded size)
  int device() const;       // -1 when empty
  explicit operator bool() const { return block_ != nullptr; }
  long use_count() const { return block_.use_count(); }
  bool same_block(const DeviceBuffer& other) const { return block_ == other.block_; }

 private:
  friend class CachingAllocator;
  explicit DeviceBuffer(std::shared_ptr<const detail::Block> block) : block_(std::move(block)) {}
  std::shared_ptr<const detail::Block> block_;
};

// Bytes [offset, offset + bytes) of a buffer: what an operation reads or writes.
// A DeviceBuffer converts to its whole range.
struct BufferRange {
  DeviceBuffer buffer;
  size_t offset = 0;
  size_t bytes = 0;

  BufferRange(DeviceBuffer whole);                                // NOLINT: implicit on purpose
  BufferRange(DeviceBuffer buffer, size_t offset, size_t bytes);  // checked against size()
  void* data() const { return static_cast<char*>(buffer.data()) + offset; }
};

struct AllocatorStats {
  size_t bytes_in_use = 0;       // block bytes behind live DeviceBuffers
  size_t bytes_cached = 0;       // block bytes in the free lists
  size_t peak_bytes_in_use = 0;  // high-water mark of bytes_in_use
  size_t blocks_in_use = 0;
  size_t blocks_cached = 0;
  uint64_t allocations = 0;     // allocate() calls for more than 0 bytes
  uint64_t cache_hits = 0;      // ... served from the cache
  uint64_t device_mallocs = 0;  // successful cudaMalloc calls
  uint64_t cache_releases = 0;  // times the whole cache was freed
};

class CachingAllocator {
 public:
  static constexpr size_t kNoLimit = SIZE_MAX;
  static constexpr size_t kSmallStep = 512;              // rounding step up to kSmallMax
  static constexpr size_t kSmallMax = size_t(1) << 20;   // 1 MiB
  static constexpr size_t kLargeStep = size_t(2) << 20;  // 2 MiB

  // An allocator of its own for `device` (tests, or a separate budget). Touches no CUDA
  // API until the first allocation.
  explicit CachingAllocator(int device, size_t limit_bytes = kNoLimit);
  // The process-wide allocator of `device`, its limit from FUSEBOX_CUDA_MEMORY_LIMIT
  // (a malformed value throws here, on first use).
  static CachingAllocator& for_device(int device);

  // Buffers outlive the allocator safely: its state lives until the last one is gone.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  DeviceBuffer allocate(size_t bytes);
  // cudaFree every cached block (cudaFree synchronises the device).
  void release_cache();

  AllocatorStats stats() const;
  // Starts a new high-water mark at the bytes in use now.
  void reset_peak();
  int device() const;
  size_t limit() const;

  // The block size a request of `bytes` gets (see the rules above).
  static size_t round_size(size_t bytes);

  // Reclaimers let the owners of in-flight work (encoders) hand buffers back when the
  // allocator runs short: called with wait=false on a cache miss (release what has
  // already completed) and with wait=true before failing (wait for the work, then release).
  // They run on the allocating thread, without the allocator's lock held. The reclaimer
  // stays registered while the returned registration lives (it may outlive the allocator).
  using Reclaimer = std::function<void(bool wait)>;
  class Registration;
  [[nodiscard]] Registration add_reclaimer(Reclaimer reclaimer);

 private:
  std::shared_ptr<detail::Pool> pool_;
};

class CachingAllocator::Registration {
 public:
  Registration() = default;
  Registration(Registration&& other) noexcept { *this = std::move(other); }
  Registration& operator=(Registration&& other) noexcept;
  ~Registration() { reset(); }
  // Unregisters now; waits for a call of the reclaimer in progress on another thread.
  void reset();

 private:
  friend class CachingAllocator;
  std::weak_ptr<detail::Pool> pool_;
  int id_ = -1;
};

}  // namespace fusebox::cuda
