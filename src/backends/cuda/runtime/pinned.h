// Page-locked (pinned) host memory: what a copy needs to run asynchronously, and at full
// PCIe speed (a pageable copy is staged by the driver through a pinned buffer of its own,
// synchronously).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cuda/runtime/encoder.h"

namespace fusebox::cuda {

// `bytes` of pinned host memory, freed (cudaFreeHost) with the last handle. An Error states
// the bytes when the driver refuses.
std::shared_ptr<std::byte[]> allocate_pinned(size_t bytes);

// A pinned buffer and the fence after the last copy that used it.
struct PinnedSlot {
  std::shared_ptr<std::byte[]> bytes;
  size_t size = 0;
  Fence last_use;
};

// Reuses pinned buffers: acquire() returns a slot that nobody else holds and whose last
// copy has completed, of at least `bytes`, or a new one. So a caller that holds a slot
// until it has read it (a pending output), or that sets last_use after each copy (a
// staged input), never sees its bytes overwritten; and a loop feeding batch after batch
// cycles through two or three slots, filling one while the device copies another.
class PinnedPool {
 public:
  // With max_slots, never more slots than that: when all are busy, waits for the one
  // whose last copy was issued first (back-pressure: the host runs at most that many
  // copies ahead of the device).
  std::shared_ptr<PinnedSlot> acquire(size_t bytes, size_t max_slots = SIZE_MAX);

 private:
  std::vector<std::shared_ptr<PinnedSlot>> slots_;
};

// A stream of its own for copies between the host and the device: the copy of the next
// batch in, or of the last run's outputs out, overlaps the device stream's work.
class CopyStream {
 public:
  explicit CopyStream(int device);
  ~CopyStream();  // waits for its copies
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  // Copies pinned host bytes into `dst` once `after` is done (the last reader of dst, on
  // another stream); returns the fence after the copy (for the reader to wait on).
  Fence copy_to_device(const BufferRange& dst, const void* pinned_host, const Fence& after);
  // Copies `src` into pinned host bytes once `after` is done (its writer, on another
  // stream); returns nothing: take fence() after the last of a batch of copies.
  void copy_to_host(void* pinned_host, const BufferRange& src, const Fence& after);
  // After the copies issued so far.
  Fence fence();

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace fusebox::cuda
