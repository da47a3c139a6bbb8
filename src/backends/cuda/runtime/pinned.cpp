#include "backends/cuda/runtime/pinned.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "backends/cuda/runtime/check.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {

std::shared_ptr<std::byte[]> allocate_pinned(size_t bytes) {
  void* p = nullptr;
  FUSEBOX_CUDA_CHECK_AS(cudaMallocHost(&p, std::max<size_t>(bytes, 1)),
                        cat("cudaMallocHost(", bytes, " bytes of pinned host memory)"));
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p),
                                      [](std::byte* q) { (void)cudaFreeHost(q); });
}

std::shared_ptr<PinnedSlot> PinnedPool::acquire(size_t bytes, size_t max_slots) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    const auto& slot = slots_[i];
    if (slot.use_count() == 1 && slot->size >= bytes && slot->last_use.done()) {
      // Most recently used last: the wait below then picks the oldest copy.
      std::rotate(slots_.begin() + std::ptrdiff_t(i), slots_.begin() + std::ptrdiff_t(i) + 1,
                  slots_.end());
      return slots_.back();
    }
  }
  if (slots_.size() >= max_slots) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].use_count() != 1 || slots_[i]->size < bytes) continue;
      slots_[i]->last_use.wait();
      std::rotate(slots_.begin() + std::ptrdiff_t(i), slots_.begin() + std::ptrdiff_t(i) + 1,
                  slots_.end());
      return slots_.back();
    }
  }
  // Drop idle slots too small to serve (a shape that changed), then make a new one.
  std::erase_if(slots_, [&](const auto& s) {
    return s.use_count() == 1 && s->size < bytes && s->last_use.done();
  });
  auto slot = std::make_shared<PinnedSlot>();
  slot->bytes = allocate_pinned(bytes);
  slot->size = bytes;
  slots_.push_back(slot);
  return slot;
}

CopyStream::CopyStream(int device) : device_(device) {
  DeviceGuard guard(device_);
  FUSEBOX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CopyStream::~CopyStream() {
  DeviceGuard guard(device_);
  (void)cudaStreamSynchronize(stream_);
  (void)cudaStreamDestroy(stream_);
}

Fence CopyStream::copy_to_device(const BufferRange& dst, const void* pinned_host,
                                 const Fence& after) {
  DeviceGuard guard(device_);
  if (after) after.wait_on(stream_);
  FUSEBOX_CUDA_CHECK_AS(
      cudaMemcpyAsync(dst.data(), pinned_host, dst.bytes, cudaMemcpyHostToDevice, stream_),
      cat("cudaMemcpyAsync(", dst.bytes, " bytes, pinned host to device, copy stream)"));
  return Fence::record(stream_, device_);
}

void CopyStream::copy_to_host(void* pinned_host, const BufferRange& src, const Fence& after) {
  DeviceGuard guard(device_);
  if (after) after.wait_on(stream_);
  FUSEBOX_CUDA_CHECK_AS(
      cudaMemcpyAsync(pinned_host, src.data(), src.bytes, cudaMemcpyDeviceToHost, stream_),
      cat("cudaMemcpyAsync(", src.bytes, " bytes, device to pinned host, copy stream)"));
}

Fence CopyStream::fence() {
  return Fence::record(stream_, device_);
}

}  // namespace fusebox::cuda
