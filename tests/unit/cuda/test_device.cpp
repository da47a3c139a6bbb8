// The device layer on a real GPU: properties, the stream, per-thread library handles.
#include <gtest/gtest.h>

#include <thread>

#include "backends/cuda/device.h"
#include "cuda_test_util.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

TEST(CudaDevice, PropertiesComeFromTheDevice) {
  FUSEBOX_REQUIRE_GPU();
  const DeviceProperties& p = Device::get(0).properties();
  EXPECT_EQ(p.id, 0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GE(p.compute_major, 7);
  EXPECT_GT(p.sm_count, 0);
  EXPECT_GT(p.l2_cache_bytes, 0u);
  EXPECT_GE(p.shared_memory_per_block, size_t(48) << 10);
  EXPECT_GE(p.shared_memory_per_block_optin, p.shared_memory_per_block);
  EXPECT_GE(p.shared_memory_per_sm, p.shared_memory_per_block_optin);
  EXPECT_EQ(p.max_threads_per_block, 1024);
  EXPECT_GE(p.max_threads_per_sm, p.max_threads_per_block);
  EXPECT_GT(p.registers_per_block, 0);
  EXPECT_EQ(p.warp_size, 32);
  EXPECT_GT(p.total_memory_bytes, size_t(1) << 30);
  // Cross-check two fields against the attribute query.
  int sms = 0, l2 = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), cudaSuccess);
  EXPECT_EQ(p.sm_count, sms);
  EXPECT_EQ(p.l2_cache_bytes, size_t(l2));
  EXPECT_NE(p.describe().find(cat("sm_", p.compute_major, p.compute_minor)), std::string::npos)
      << p.describe();
  EXPECT_EQ(&Device::get(0), &Device::get(0));  // one object per device
}

TEST(CudaDevice, BadIdsAreErrors) {
  FUSEBOX_REQUIRE_GPU();
  for (int id : {-1, device_count()}) {
    try {
      Device::get(id);
      ADD_FAILURE() << "device " << id << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cat("device ", id, " does not exist")),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CudaDevice, StreamIsNonBlockingAndStable) {
  FUSEBOX_REQUIRE_GPU();
  Device& device = Device::get(0);
  cudaStream_t stream = device.stream();
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(device.stream(), stream);
  unsigned flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(stream, &flags), cudaSuccess);
  EXPECT_TRUE(flags & cudaStreamNonBlocking);
  EXPECT_NO_THROW(device.synchronize());
}

TEST(CudaDevice, LibraryHandlesArePerThread) {
  FUSEBOX_REQUIRE_GPU();
  Device& device = Device::get(0);
  cublasLtHandle_t mine = device.cublaslt_handle();
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(device.cublaslt_handle(), mine);
  cublasLtHandle_t theirs = nullptr;
  std::thread([&] { theirs = device.cublaslt_handle(); }).join();
  EXPECT_NE(theirs, nullptr);
  EXPECT_NE(theirs, mine);

  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  cudnnHandle_t dnn = device.cudnn_handle(device.stream());
  ASSERT_NE(dnn, nullptr);
  cudaStream_t bound = nullptr;
  ASSERT_EQ(cudnnGetStream(dnn, &bound), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(bound, device.stream());
  EXPECT_EQ(device.cudnn_handle(other), dnn);  // same handle, rebound
  ASSERT_EQ(cudnnGetStream(dnn, &bound), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(bound, other);
  cudnnHandle_t their_dnn = nullptr;
  std::thread([&] { their_dnn = device.cudnn_handle(other); }).join();
  EXPECT_NE(their_dnn, dnn);
  device.cudnn_handle(device.stream());
  ASSERT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

}  // namespace
}  // namespace fusebox::cuda
