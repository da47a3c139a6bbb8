// Error checks and environment settings of the CUDA backend. These run without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "backends/cuda/runtime/allocator.h"
#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/device.h"
#include "backends/cuda/runtime/encoder.h"
#include "backends/cuda/runtime/env.h"
#include "backends/cuda/runtime/settings.h"
#include "fusebox/core/error.h"
#include "testing.h"

namespace fusebox::cuda {
namespace {

// The message of the Error that `action` throws ("" if it throws none).
template <class F>
std::string error_of(F&& action) {
  try {
    action();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "cuda");
    return e.what();
  }
  return "";
}

using fusebox::testing::ScopedEnv;

TEST(CudaCheck, NamesCallErrorAndSite) {
  EXPECT_NO_THROW(FUSEBOX_CUDA_CHECK(cudaSuccess));
  int line = __LINE__ + 1;
  std::string message = error_of([] { FUSEBOX_CUDA_CHECK(cudaErrorInvalidValue); });
  EXPECT_EQ(message,
            "[cuda] cudaErrorInvalidValue failed: invalid argument "
            "(cudaErrorInvalidValue) at test_check_env.cpp:" +
                std::to_string(line));
  message = error_of(
      [] { FUSEBOX_CUDA_CHECK_AS(cudaErrorMemoryAllocation, "cudaMalloc(268435456 bytes)"); });
  EXPECT_NE(message.find("[cuda] cudaMalloc(268435456 bytes) failed: out of memory "
                         "(cudaErrorMemoryAllocation) at test_check_env.cpp:"),
            std::string::npos)
      << message;
}

TEST(CudaCheck, LibraryStatusesAreNamed) {
  std::string message = error_of([] { FUSEBOX_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED); });
  EXPECT_NE(message.find("CUBLAS_STATUS_NOT_SUPPORTED failed: CUBLAS_STATUS_NOT_SUPPORTED"),
            std::string::npos)
      << message;
  EXPECT_NO_THROW(FUSEBOX_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
  message = error_of([] { FUSEBOX_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); });
  EXPECT_NE(message.find("CUDNN_STATUS_BAD_PARAM failed: CUDNN_STATUS_BAD_PARAM"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(" at test_check_env.cpp:"), std::string::npos) << message;
  EXPECT_NO_THROW(FUSEBOX_CUDNN_CHECK(CUDNN_STATUS_SUCCESS));
}

// Byte counts (parse_byte_count, format_bytes) are core's: tests/unit/core/test_memory.cpp.
TEST(CudaEnv, CountsAndSwitches) {
  EXPECT_EQ(parse_count("0", "X"), 0u);
  EXPECT_EQ(parse_count("64", "X"), 64u);
  EXPECT_FALSE(error_of([] { parse_count("-1", "X"); }).empty());
  EXPECT_FALSE(error_of([] { parse_count("6 4", "X"); }).empty());
  EXPECT_TRUE(parse_switch("1", "X"));
  EXPECT_FALSE(parse_switch("0", "X"));
  EXPECT_NE(error_of([] {
              parse_switch("yes", "FUSEBOX_CUDA_GRAPHS");
            }).find("FUSEBOX_CUDA_GRAPHS='yes' must be 0 or 1"),
            std::string::npos);
}

TEST(CudaEnv, MemoryLimitFromEnvironment) {
  {
    ScopedEnv unset("FUSEBOX_CUDA_MEMORY_LIMIT", "");
    EXPECT_EQ(settings().memory_limit, std::nullopt);
  }
  {
    ScopedEnv limit("FUSEBOX_CUDA_MEMORY_LIMIT", "512M");
    EXPECT_EQ(settings().memory_limit, std::optional<size_t>(size_t(512) << 20));
  }
  ScopedEnv bad("FUSEBOX_CUDA_MEMORY_LIMIT", "lots");
  EXPECT_NE(error_of([] { settings(); }).find("'lots' is not a byte count"), std::string::npos);
}

TEST(CudaEnv, EncoderOptionsFromEnvironment) {
  {
    ScopedEnv graphs("FUSEBOX_CUDA_GRAPHS", "");
    ScopedEnv cache("FUSEBOX_CUDA_GRAPH_CACHE", "");
    CommandEncoder::Options options = CommandEncoder::Options::from_env();
    EXPECT_TRUE(options.use_graphs);
    EXPECT_EQ(options.graph_cache_capacity, 64u);
  }
  {
    ScopedEnv graphs("FUSEBOX_CUDA_GRAPHS", "0");
    ScopedEnv cache("FUSEBOX_CUDA_GRAPH_CACHE", "8");
    CommandEncoder::Options options = CommandEncoder::Options::from_env();
    EXPECT_FALSE(options.use_graphs);
    EXPECT_EQ(options.graph_cache_capacity, 8u);
  }
  {
    ScopedEnv graphs("FUSEBOX_CUDA_GRAPHS", "off");
    EXPECT_NE(error_of([] { CommandEncoder::Options::from_env(); }).find("FUSEBOX_CUDA_GRAPHS"),
              std::string::npos);
  }
  ScopedEnv cache("FUSEBOX_CUDA_GRAPH_CACHE", "many");
  EXPECT_NE(
      error_of([] { CommandEncoder::Options::from_env(); }).find("FUSEBOX_CUDA_GRAPH_CACHE='many'"),
      std::string::npos);
}

TEST(CudaAllocator, RoundsSmallTo512AndLargeTo2MiB) {
  constexpr size_t MiB = size_t(1) << 20;
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(MiB - 1), MiB);
  EXPECT_EQ(CachingAllocator::round_size(MiB), MiB);
  EXPECT_EQ(CachingAllocator::round_size(MiB + 1), 2 * MiB);
  EXPECT_EQ(CachingAllocator::round_size(2 * MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocator::round_size(3 * MiB + 1), 4 * MiB);
}

TEST(CudaAllocator, ZeroBytesNeedNoDevice) {
  CachingAllocator allocator(0);  // touches no CUDA API until a real allocation
  DeviceBuffer empty = allocator.allocate(0);
  EXPECT_FALSE(empty);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.device(), -1);
  EXPECT_EQ(allocator.stats().allocations, 0u);
}

TEST(CudaDevice, CountNeverThrows) {
  int count = -1;
  EXPECT_NO_THROW(count = device_count());
  EXPECT_GE(count, 0);
  EXPECT_EQ(device_present(), count > 0);
  if (count == 0) {
    EXPECT_NE(error_of([] { Device::get(0); }).find("no CUDA device"), std::string::npos);
  }
}

}  // namespace
}  // namespace fusebox::cuda
