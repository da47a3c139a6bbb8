// Helpers for the CUDA backend's tests: skipping without a GPU, small test kernels (in
// test_kernels.cu), and host <-> device copies of float buffers.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/encoder.h"
#include "test_kernels.h"

namespace fusebox::cuda::testing {

// Why no device can run the tests ("" when one can).
inline std::string cuda_device_missing() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return "cudaGetDeviceCount failed: " + cuda_error_text(err);
  }
  return count == 0 ? "cudaGetDeviceCount found 0 devices" : "";
}

constexpr uint64_t kSpinNs = 20'000'000;  // 20 ms: far longer than any unordered kernel

inline std::vector<float> download(CommandEncoder& encoder, const BufferRange& src) {
  std::vector<float> values(src.bytes / sizeof(float));
  encoder.copy_to_host(values.data(), src);
  return values;
}

inline void upload(CommandEncoder& encoder, const BufferRange& dst,
                   const std::vector<float>& values) {
  EXPECT_EQ(values.size() * sizeof(float), dst.bytes);
  encoder.copy_to_device(dst, values.data());
}

// NaN bytes, so that an element nobody wrote cannot pass for a result.
inline void poison(CommandEncoder& encoder, const BufferRange& dst) {
  std::vector<unsigned char> bytes(dst.bytes, 0xFF);
  encoder.copy_to_device(dst, bytes.data());
}

// Counts elements of `values` different from `expected` (NaN never equals).
inline size_t count_not_equal(const std::vector<float>& values, float expected) {
  size_t bad = 0;
  for (float v : values) bad += !(v == expected);
  return bad;
}

}  // namespace fusebox::cuda::testing

// In a test body or SetUp: skips the test, saying why, when no GPU can run it.
#define FUSEBOX_REQUIRE_GPU()                                                  \
  do {                                                                         \
    std::string why_no_gpu = ::fusebox::cuda::testing::cuda_device_missing();  \
    if (!why_no_gpu.empty()) GTEST_SKIP() << "no CUDA device: " << why_no_gpu; \
  } while (0)
