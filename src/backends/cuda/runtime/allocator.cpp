#include "backends/cuda/runtime/allocator.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/device.h"
#include "backends/cuda/runtime/settings.h"
#include "fusebox/core/error.h"
#include "fusebox/core/memory.h"

namespace fusebox::cuda {
namespace detail {

// The allocator's state, shared with every live block so that a block can return home
// even after the CachingAllocator object is gone.
struct Pool {
  Pool(int device, size_t limit) : device(device), limit(limit) {}
  ~Pool() {
    // Status ignored: a destructor must not throw, and at exit the runtime may be gone.
    for (auto& [bytes, ptr] : free_blocks) (void)cudaFree(ptr);
  }

  // A cached block of at least `bytes` and at most 25% more, smallest first; null if none.
  // Caller holds `mutex`.
  void* take_cached(size_t bytes, size_t& block_bytes) {
    auto it = free_blocks.lower_bound(bytes);
    if (it == free_blocks.end() || it->first > bytes + bytes / 4) return nullptr;
    void* ptr = it->second;
    block_bytes = it->first;
    free_blocks.erase(it);
    stats.bytes_cached -= block_bytes;
    --stats.blocks_cached;
    ++stats.cache_hits;
    return ptr;
  }

  // cudaMalloc within the limit; null when the limit or the device says no (`failure`
  // then describes why). Any other CUDA error throws. Caller holds `mutex`.
  void* device_malloc(size_t bytes, std::string& failure) {
    size_t held = stats.bytes_in_use + stats.bytes_cached;
    if (limit != CachingAllocator::kNoLimit && (held > limit || bytes > limit - held)) {
      failure = cat("the request would take the allocator past its limit of ", format_bytes(limit));
      return nullptr;
    }
    DeviceGuard guard(device);
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    std::string call = cat("cudaMalloc(", bytes, " bytes)");
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // out of memory is recoverable: clear it
      failure = cat(call, " failed: ", cuda_error_text(err));
      return nullptr;
    }
    FUSEBOX_CUDA_CHECK_AS(err, call);
    ++stats.device_mallocs;
    return ptr;
  }

  // Caller holds `mutex`.
  void release_cache() {
    if (free_blocks.empty()) return;
    DeviceGuard guard(device);
    while (!free_blocks.empty()) {
      auto it = free_blocks.begin();
      FUSEBOX_CUDA_CHECK_AS(cudaFree(it->second), cat("cudaFree(", it->first, " bytes)"));
      stats.bytes_cached -= it->first;
      --stats.blocks_cached;
      free_blocks.erase(it);
    }
    ++stats.cache_releases;
  }

  // Caller holds `mutex`.
  void note_in_use(size_t block_bytes) {
    stats.bytes_in_use += block_bytes;
    ++stats.blocks_in_use;
    if (stats.bytes_in_use > stats.peak_bytes_in_use) {
      stats.peak_bytes_in_use = stats.bytes_in_use;
    }
  }

  void give_back(void* ptr, size_t block_bytes) {
    std::lock_guard lock(mutex);
    stats.bytes_in_use -= block_bytes;
    --stats.blocks_in_use;
    stats.bytes_cached += block_bytes;
    ++stats.blocks_cached;
    free_blocks.emplace(block_bytes, ptr);
  }

  void run_reclaimers(bool wait) {
    std::lock_guard lock(reclaimers_mutex);  // also keeps a reclaimer from being removed mid-call
    for (auto& [id, reclaimer] : reclaimers) reclaimer(wait);
  }

  std::string out_of_memory_message(size_t asked, size_t block_bytes,
                                    const std::string& failure) const {
    DeviceGuard guard(device);
    size_t free_bytes = 0, total_bytes = 0;
    std::string device_text = "unknown (cudaMemGetInfo failed)";
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      device_text = cat(format_bytes(free_bytes), " free of ", format_bytes(total_bytes));
    } else {
      (void)cudaGetLastError();
    }
    std::string limit_text = limit == CachingAllocator::kNoLimit
                                 ? std::string("none")
                                 : cat(format_bytes(limit), " (", limit, " bytes)");
    return cat("out of memory on device ", device, ": asked for ", asked, " bytes (a ",
               format_bytes(block_bytes), " block) and ", failure,
               ", even after releasing the cache. In use: ", format_bytes(stats.bytes_in_use),
               "; cached: ", format_bytes(stats.bytes_cached), "; device: ", device_text,
               "; limit: ", limit_text, ". Set FUSEBOX_CUDA_MEMORY_LIMIT to change the limit.");
  }

  const int device;
  const size_t limit;
  mutable std::mutex mutex;
  std::multimap<size_t, void*> free_blocks;  // block bytes -> pointer
  AllocatorStats stats;

  std::mutex reclaimers_mutex;
  std::map<int, CachingAllocator::Reclaimer> reclaimers;
  int next_reclaimer_id = 0;
};

struct Block {
  Block(void* ptr, size_t capacity, size_t size, std::shared_ptr<Pool> pool)
      : ptr(ptr), capacity(capacity), size(size), pool(std::move(pool)) {}
  ~Block() { pool->give_back(ptr, capacity); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  void* const ptr;
  const size_t capacity;
  const size_t size;
  const std::shared_ptr<Pool> pool;
};

}  // namespace detail

void* DeviceBuffer::data() const {
  return block_ ? block_->ptr : nullptr;
}
size_t DeviceBuffer::size() const {
  return block_ ? block_->size : 0;
}
size_t DeviceBuffer::capacity() const {
  return block_ ? block_->capacity : 0;
}
int DeviceBuffer::device() const {
  return block_ ? block_->pool->device : -1;
}

BufferRange::BufferRange(DeviceBuffer whole) : buffer(std::move(whole)), bytes(buffer.size()) {}

BufferRange::BufferRange(DeviceBuffer buf, size_t off, size_t n)
    : buffer(std::move(buf)), offset(off), bytes(n) {
  FUSEBOX_CHECK(offset <= buffer.size() && bytes <= buffer.size() - offset, "cuda", "byte range [",
                offset, ", ", offset + bytes, ") lies outside a buffer of ", buffer.size(),
                " bytes");
}

size_t CachingAllocator::round_size(size_t bytes) {
  size_t step = bytes <= kSmallMax ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::CachingAllocator(int device, size_t limit_bytes)
    : pool_(std::make_shared<detail::Pool>(device, limit_bytes)) {}

CachingAllocator::~CachingAllocator() = default;

CachingAllocator& CachingAllocator::for_device(int device) {
  // Never destroyed (see Device::get): blocks may be freed during exit.
  static std::mutex mutex;
  static auto* allocators = new std::map<int, std::unique_ptr<CachingAllocator>>();
  std::lock_guard lock(mutex);
  auto& slot = (*allocators)[device];
  if (!slot) {
    Device::get(device);  // a clear error for a device that does not exist
    slot = std::make_unique<CachingAllocator>(device, settings().memory_limit.value_or(kNoLimit));
  }
  return *slot;
}

DeviceBuffer CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  FUSEBOX_CHECK(bytes <= SIZE_MAX - kLargeStep, "cuda", "cannot allocate ", bytes, " bytes");
  detail::Pool& pool = *pool_;
  size_t rounded = round_size(bytes);
  auto hand_out = [&](void* ptr, size_t block_bytes) {
    pool.note_in_use(block_bytes);
    return DeviceBuffer(std::make_shared<const detail::Block>(ptr, block_bytes, bytes, pool_));
  };
  size_t block_bytes = 0;
  {
    std::lock_guard lock(pool.mutex);
    ++pool.stats.allocations;
    if (void* ptr = pool.take_cached(rounded, block_bytes)) return hand_out(ptr, block_bytes);
  }
  // A miss: first take back what finished work no longer needs.
  pool.run_reclaimers(/*wait=*/false);
  std::string failure;
  {
    std::lock_guard lock(pool.mutex);
    if (void* ptr = pool.take_cached(rounded, block_bytes)) return hand_out(ptr, block_bytes);
    if (void* ptr = pool.device_malloc(rounded, failure)) return hand_out(ptr, rounded);
  }
  // Short of memory: wait for in-flight work, free the whole cache, try once more.
  pool.run_reclaimers(/*wait=*/true);
  std::lock_guard lock(pool.mutex);
  if (void* ptr = pool.take_cached(rounded, block_bytes)) return hand_out(ptr, block_bytes);
  pool.release_cache();
  if (void* ptr = pool.device_malloc(rounded, failure)) return hand_out(ptr, rounded);
  throw OutOfMemory("cuda", pool.out_of_memory_message(bytes, rounded, failure));
}

void CachingAllocator::release_cache() {
  std::lock_guard lock(pool_->mutex);
  pool_->release_cache();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(pool_->mutex);
  return pool_->stats;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(pool_->mutex);
  pool_->stats.peak_bytes_in_use = pool_->stats.bytes_in_use;
}

int CachingAllocator::device() const {
  return pool_->device;
}
size_t CachingAllocator::limit() const {
  return pool_->limit;
}

CachingAllocator::Registration CachingAllocator::add_reclaimer(Reclaimer reclaimer) {
  std::lock_guard lock(pool_->reclaimers_mutex);
  Registration registration;
  registration.pool_ = pool_;
  registration.id_ = pool_->next_reclaimer_id++;
  pool_->reclaimers.emplace(registration.id_, std::move(reclaimer));
  return registration;
}

CachingAllocator::Registration& CachingAllocator::Registration::operator=(
    Registration&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::move(other.pool_);
    id_ = other.id_;
    other.id_ = -1;
  }
  return *this;
}

void CachingAllocator::Registration::reset() {
  if (auto pool = pool_.lock()) {
    std::lock_guard lock(pool->reclaimers_mutex);
    pool->reclaimers.erase(id_);
  }
  pool_.reset();
  id_ = -1;
}

}  // namespace fusebox::cuda
