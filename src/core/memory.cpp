#include "fusebox/core/memory.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "fusebox/core/error.h"

namespace fusebox {

std::optional<TensorSize> checked_tensor_size(const Shape& shape, size_t elem_size,
                                              uint64_t max_bytes) {
  uint64_t bytes = elem_size;
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      empty = true;
      continue;
    }
    if (uint64_t(d) > max_bytes / bytes) return std::nullopt;
    bytes *= uint64_t(d);
  }
  if (bytes > max_bytes) return std::nullopt;
  if (empty) return TensorSize{0, 0};
  return TensorSize{int64_t(bytes / elem_size), bytes};
}

TensorSize tensor_size_or_throw(const Shape& shape, DType dtype, const std::string& where,
                                const std::string& what) {
  if (auto size = checked_tensor_size(shape, dtype_size(dtype))) return *size;
  for (int64_t d : shape)
    FUSEBOX_CHECK(d >= 0, where, what, " would be ", dtype_name(dtype), shape_str(shape),
                  ", which has a negative extent");
  // The size as a double: the exact product may not fit in 64 bits. A zero extent does not
  // excuse the others (checked_tensor_size), so the product is of the nonzero ones.
  double bytes = double(dtype_size(dtype));
  bool has_zero = false;
  for (int64_t d : shape) {
    has_zero = has_zero || d == 0;
    bytes *= d == 0 ? 1.0 : double(d);
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", bytes);
  throw Error(where, cat(what, " would be ", dtype_name(dtype), shape_str(shape), ": about ", text,
                         " bytes", has_zero ? " over its nonzero extents" : "", ", more than the ",
                         format_bytes(kMaxTensorBytes), " one tensor may hold"));
}

size_t parse_byte_count(std::string_view text, std::string_view setting, const std::string& where) {
  std::string_view digits = text;
  int shift = 0;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      case 't':
      case 'T':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift != 0) digits.remove_suffix(1);
  }
  size_t value = 0;
  bool ok = !digits.empty();
  for (char c : digits) {
    ok = ok && c >= '0' && c <= '9' &&
         value <= (std::numeric_limits<size_t>::max() - size_t(c - '0')) / 10;
    if (!ok) break;
    value = value * 10 + size_t(c - '0');
  }
  ok = ok && value <= (std::numeric_limits<size_t>::max() >> shift);
  FUSEBOX_CHECK(ok, where, setting, "='", text,
                "' is not a byte count: expected digits with an optional K, M, G or T suffix "
                "(powers of 1024), e.g. 4096, 512M or 2G");
  FUSEBOX_CHECK(value > 0, where, setting, "='", text, "' must be more than 0 bytes");
  return value << shift;
}

std::string format_bytes(uint64_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return cat(bytes, " B");
  double value = double(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  return text;
}

namespace {

// The memory this process may use: physical memory, or its cgroup's limit when lower.
size_t usable_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  size_t usable = pages > 0 && page > 0 ? size_t(pages) * size_t(page) : SIZE_MAX;
  for (const char* path : {"/sys/fs/cgroup/memory.max",                       // cgroup v2
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {  // v1
    std::ifstream in(path);
    unsigned long long limit = 0;
    if (in >> limit && limit > 0) usable = std::min<size_t>(usable, size_t(limit));
  }
  return usable;
}

struct HostBudget {
  std::atomic<size_t> in_use{0};
  std::atomic<size_t> peak{0};
  std::atomic<size_t> limit{0};
  std::once_flag initialised;

  size_t current_limit() {
    std::call_once(initialised, [this] {
      if (limit.load() == 0) limit = default_limit();
    });
    return limit.load();
  }

  static size_t default_limit() {
    const char* text = std::getenv("FUSEBOX_CPU_MEMORY_LIMIT");
    if (text != nullptr && *text != '\0') return parse_byte_count(text, "FUSEBOX_CPU_MEMORY_LIMIT");
    return usable_memory() / 10 * 9;
  }
};

HostBudget& budget() {
  static auto* b = new HostBudget();  // never destroyed: tensors may be freed during exit
  return *b;
}

}  // namespace

HostMemoryStats host_memory_stats() {
  HostBudget& b = budget();
  return {b.in_use.load(), b.peak.load(), b.current_limit()};
}

void set_host_memory_limit(std::optional<size_t> bytes) {
  HostBudget& b = budget();
  b.current_limit();  // so that a later first use does not replace what is set here
  b.limit = bytes ? *bytes : HostBudget::default_limit();
}

std::string host_memory_summary() {
  const HostMemoryStats s = host_memory_stats();
  return cat("in use ", format_bytes(s.in_use), " of the ", format_bytes(s.limit),
             " host memory limit (--memory-limit, or FUSEBOX_CPU_MEMORY_LIMIT)");
}

namespace {

// Counts `bytes` against the budget, or throws OutOfMemory naming `what`.
void reserve_host(size_t bytes, const std::string& what) {
  HostBudget& b = budget();
  const size_t limit = b.current_limit();
  const size_t before = b.in_use.fetch_add(bytes);
  if (before > limit || bytes > limit - before) {
    b.in_use.fetch_sub(bytes);
    throw OutOfMemory("host memory",
                      cat("out of host memory: ", what, " needs ", format_bytes(bytes), " (", bytes,
                          " bytes) with ", host_memory_summary()));
  }
  size_t peak = b.peak.load();
  while (before + bytes > peak && !b.peak.compare_exchange_weak(peak, before + bytes)) {
  }
}

}  // namespace

std::shared_ptr<std::byte[]> allocate_host(size_t bytes, const std::string& what) {
  bytes = std::max<size_t>(bytes, 1);
  reserve_host(bytes, what);
  std::byte* p = new (std::nothrow) std::byte[bytes];
  if (p == nullptr) {
    budget().in_use.fetch_sub(bytes);
    throw OutOfMemory("host memory",
                      cat("out of host memory: the system refused ", format_bytes(bytes), " (",
                          bytes, " bytes) for ", what, ", ", host_memory_summary()));
  }
  return std::shared_ptr<std::byte[]>(p, [bytes](std::byte* q) {
    delete[] q;
    budget().in_use.fetch_sub(bytes);
  });
}

std::shared_ptr<std::byte[]> adopt_host_bytes(std::string bytes, const std::string& what) {
  const size_t counted = std::max<size_t>(bytes.size(), 1);
  // The string object on the heap, so that its data (inline for a short string) stays put.
  auto owner = std::make_unique<std::string>(std::move(bytes));
  reserve_host(counted, what);
  std::string* held = owner.release();
  return std::shared_ptr<std::byte[]>(reinterpret_cast<std::byte*>(held->data()),
                                      [held, counted](std::byte*) {
                                        delete held;
                                        budget().in_use.fetch_sub(counted);
                                      });
}

}  // namespace fusebox
