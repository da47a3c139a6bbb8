// The caching allocator on a real GPU: reuse, statistics, the limit and out-of-memory.
#include <gtest/gtest.h>

#include <string>

#include "backends/cuda/runtime/allocator.h"
#include "cuda_test_util.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

constexpr size_t MiB = size_t(1) << 20;

std::string allocation_error(CachingAllocator& allocator, size_t bytes) {
  try {
    DeviceBuffer buffer = allocator.allocate(bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaAllocatorGpu, ReusesFreedBlocks) {
  FUSEBOX_REQUIRE_GPU();
  CachingAllocator allocator(0);
  void* first = nullptr;
  {
    DeviceBuffer a = allocator.allocate(1000);
    ASSERT_TRUE(a);
    first = a.data();
    EXPECT_EQ(a.size(), 1000u);
    EXPECT_EQ(a.capacity(), 1024u);
    EXPECT_EQ(a.device(), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 512, 0u);
    AllocatorStats s = allocator.stats();
    EXPECT_EQ(s.bytes_in_use, 1024u);
    EXPECT_EQ(s.bytes_cached, 0u);
    EXPECT_EQ(s.device_mallocs, 1u);
    EXPECT_EQ(s.cache_hits, 0u);
    DeviceBuffer copy = a;  // shared: the block stays in use while either handle lives
    a = DeviceBuffer();
    EXPECT_EQ(allocator.stats().bytes_in_use, 1024u);
  }
  AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.bytes_cached, 1024u);
  EXPECT_EQ(s.blocks_cached, 1u);

  DeviceBuffer b = allocator.allocate(900);  // rounds to the same 1024-byte bucket
  EXPECT_EQ(b.data(), first);
  DeviceBuffer c = allocator.allocate(900);  // the cache is empty now: a new block
  EXPECT_NE(c.data(), first);
  s = allocator.stats();
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.device_mallocs, 2u);
  EXPECT_EQ(s.bytes_in_use, 2048u);
  EXPECT_EQ(s.peak_bytes_in_use, 2048u);
}

TEST(CudaAllocatorGpu, BestFitWithinAQuarter) {
  FUSEBOX_REQUIRE_GPU();
  CachingAllocator allocator(0);
  void* eight = allocator.allocate(8 * MiB).data();  // freed at once: cached 8 MiB
  void* ten = allocator.allocate(10 * MiB).data();   // a miss: cached 8 and 10 MiB
  EXPECT_EQ(allocator.stats().bytes_cached, 18 * MiB);
  DeviceBuffer a = allocator.allocate(7 * MiB + 1);  // rounds to 8 MiB: exact fit
  EXPECT_EQ(a.data(), eight);
  DeviceBuffer b = allocator.allocate(6 * MiB);  // 10 MiB is more than 25% larger: miss
  EXPECT_NE(b.data(), ten);
  DeviceBuffer c = allocator.allocate(8 * MiB + 1);  // rounds to 10 MiB: exact fit
  EXPECT_EQ(c.data(), ten);
  EXPECT_EQ(c.capacity(), 10 * MiB);
  AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.cache_hits, 2u);
  EXPECT_EQ(s.device_mallocs, 3u);
  EXPECT_EQ(s.peak_bytes_in_use, 24 * MiB);
}

TEST(CudaAllocatorGpu, LimitReleasesCacheBeforeFailing) {
  FUSEBOX_REQUIRE_GPU();
  CachingAllocator allocator(0, 4 * MiB);
  EXPECT_EQ(allocator.limit(), 4 * MiB);
  { DeviceBuffer two = allocator.allocate(2 * MiB); }  // cached: 2 MiB
  // 4 MiB more would hold 6 MiB: release the cache, then it fits.
  DeviceBuffer four = allocator.allocate(4 * MiB);
  AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.cache_releases, 1u);
  EXPECT_EQ(s.bytes_cached, 0u);
  EXPECT_EQ(s.bytes_in_use, 4 * MiB);

  std::string message = allocation_error(allocator, 1000);
  ASSERT_FALSE(message.empty()) << "an allocation past the limit succeeded";
  for (const char* part : {"[cuda] out of memory on device 0", "asked for 1000 bytes",
                           "limit of 4.0 MiB", "In use: 4.0 MiB", "cached: 0 B", " free of ",
                           "limit: 4.0 MiB (4194304 bytes)", "FUSEBOX_CUDA_MEMORY_LIMIT"}) {
    EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in " << message;
  }
  four = DeviceBuffer();
  EXPECT_NO_THROW(allocator.allocate(4 * MiB));  // fits again, from the cache
}

TEST(CudaAllocatorGpu, DeviceOutOfMemoryIsReported) {
  FUSEBOX_REQUIRE_GPU();
  CachingAllocator allocator(0);
  { DeviceBuffer small = allocator.allocate(MiB); }
  size_t too_much = Device::get(0).properties().total_memory_bytes * 2;
  std::string message = allocation_error(allocator, too_much);
  ASSERT_FALSE(message.empty());
  for (const std::string& part :
       {std::string("asked for ") + std::to_string(too_much) + " bytes",
        std::string("cudaMalloc(") + std::to_string(CachingAllocator::round_size(too_much)) +
            " bytes) failed: out of memory (cudaErrorMemoryAllocation)",
        std::string("In use: 0 B"), std::string("cached: 0 B"), std::string(" free of "),
        std::string("limit: none")}) {
    EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in " << message;
  }
  EXPECT_EQ(allocator.stats().cache_releases, 1u);
  // The failure left no error behind: the next allocation works.
  DeviceBuffer fine = allocator.allocate(MiB);
  EXPECT_TRUE(fine);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaAllocatorGpu, BuffersMayOutliveTheirAllocator) {
  FUSEBOX_REQUIRE_GPU();
  DeviceBuffer survivor;
  {
    CachingAllocator allocator(0);
    survivor = allocator.allocate(4096);
  }
  ASSERT_TRUE(survivor);
  EXPECT_EQ(cudaMemset(survivor.data(), 0, survivor.size()), cudaSuccess);
  survivor = DeviceBuffer();  // returns to the orphaned pool, which then frees it
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaAllocatorGpu, RangesAreChecked) {
  FUSEBOX_REQUIRE_GPU();
  CachingAllocator allocator(0);
  DeviceBuffer b = allocator.allocate(100);
  BufferRange whole = b;
  EXPECT_EQ(whole.offset, 0u);
  EXPECT_EQ(whole.bytes, 100u);
  BufferRange part(b, 40, 60);
  EXPECT_EQ(part.data(), static_cast<char*>(b.data()) + 40);
  EXPECT_THROW(BufferRange(b, 40, 61), Error);
  EXPECT_THROW(BufferRange(b, 101, 0), Error);
}

}  // namespace
}  // namespace fusebox::cuda
