// Sizes and budgets of memory, in one place:
// - the one checked element-count and byte-size computation every shape goes through (graph
//   values when they are made, tensor files, both backends' allocations), and the most bytes
//   a single tensor may hold;
// - the host memory budget every host tensor is counted against (the CPU backend's
//   --memory-limit; the CUDA allocator has its own, FUSEBOX_CUDA_MEMORY_LIMIT);
// - byte counts as people write and read them ("512M", "1.5 GiB").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "fusebox/core/dtype.h"
#include "fusebox/core/shape.h"

namespace fusebox {

// The most bytes one tensor may hold: 1 TiB, past any one device's or host's memory today and
// far enough below 2^63 that offset arithmetic on a tensor (an element index times the element
// size, the sum of a few such) cannot wrap. Element counts are bounded by it too (every element
// is at least a byte).
inline constexpr uint64_t kMaxTensorBytes = uint64_t(1) << 40;

struct TensorSize {
  int64_t elements = 0;
  uint64_t bytes = 0;
};

// The element count and byte size of a tensor of `shape` with `elem_size`-byte elements, or
// nullopt when an extent is negative or the bytes would pass `max_bytes`. A zero extent makes
// the size 0 but does not excuse the other extents: their product is held to the same bound,
// since strides and views multiply them all the same.
std::optional<TensorSize> checked_tensor_size(const Shape& shape, size_t elem_size,
                                              uint64_t max_bytes = kMaxTensorBytes);

// The same for a `dtype` tensor, or an Error at `where`: "<what> would be f32[2^44+1 ...]: about
// 7.4e+19 bytes, more than the 1.0 TiB one tensor may hold".
TensorSize tensor_size_or_throw(const Shape& shape, DType dtype, const std::string& where,
                                const std::string& what);

// "4096", "64K", "512M", "2G", "1T" (suffixes are powers of 1024, either case) -> bytes, > 0.
// `setting` names the source in the error ("FUSEBOX_CUDA_MEMORY_LIMIT='5X' is not ..."), thrown
// at `where` (the layer that reads the setting).
size_t parse_byte_count(std::string_view text, std::string_view setting,
                        const std::string& where = "settings");

// Human-readable size for messages: "512 B", "1.5 KiB", "256.0 MiB", "79.1 GiB".
std::string format_bytes(uint64_t bytes);

// --- The host memory budget ----------------------------------------------------------------
// Every host tensor's bytes (Tensor::empty) count while the tensor lives. An allocation that
// would take the count past the limit is refused before any memory is touched, with an
// OutOfMemory error naming what was asked for, what is in use and the limit, so that a model too
// large for the machine gets a message rather than the kernel's OOM killer or a bare
// std::bad_alloc. The limit: FUSEBOX_CPU_MEMORY_LIMIT (a byte count as parse_byte_count reads
// it; read at the first allocation), or set_host_memory_limit(), else 90% of the memory this
// process may use (the smaller of physical memory and its cgroup's memory.max).
struct HostMemoryStats {
  size_t in_use = 0;  // bytes of live host tensors
  size_t peak = 0;    // the most in use at once since the process started
  size_t limit = 0;
};
HostMemoryStats host_memory_stats();
// The budget's limit from now on; nullopt goes back to the default (the variable, else 90%).
void set_host_memory_limit(std::optional<size_t> bytes);

// `bytes` (at least 1) of uninitialised host memory, counted against the budget until the last
// handle goes. `what` says what it is for in the error ("f32[64, 3, 224, 224]").
std::shared_ptr<std::byte[]> allocate_host(size_t bytes, const std::string& what);
// Bytes that exist already (a parsed model's weights) as host tensor storage, without a copy:
// counted against the budget as allocate_host counts (OutOfMemory where they do not fit),
// released with the last handle. Aligned as allocate_host's memory (operator new's).
std::shared_ptr<std::byte[]> adopt_host_bytes(std::string bytes, const std::string& what);

// "in use 1.2 GiB of the 20.1 GiB host memory limit (FUSEBOX_CPU_MEMORY_LIMIT or
// --memory-limit)", for messages about host memory.
std::string host_memory_summary();

}  // namespace fusebox
