// The device layer on a real GPU: properties, the stream, the library handles (cuBLASLt per
// device, cuDNN per device and thread).
#include <gtest/gtest.h>

#include <thread>

#include "backends/cuda/runtime/device.h"
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

// A cuBLASLt call that needs a live handle: the heuristic query for a tiny f32 matmul.
cublasStatus_t query_matmul_heuristic(cublasLtHandle_t handle) {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  cublasStatus_t status = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 8, 8, 8);
  if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatmulPreferenceCreate(&preference);
  size_t workspace = size_t(1) << 20;  // only queried: nothing is allocated
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(handle, desc, layout, layout, layout, layout,
                                            preference, 1, &result, &found);
  }
  if (status == CUBLAS_STATUS_SUCCESS && found != 1) status = CUBLAS_STATUS_NOT_SUPPORTED;
  if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
  if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
  if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  return status;
}

// cuBLASLt hands all threads of a process one context per device (the first GPU run saw
// two threads' cublasLtCreate return the same pointer), so the handle is the device's: the
// same for every thread, and still alive after a thread that used it has exited.
TEST(CudaDevice, CublasLtHandleIsSharedAndOutlivesThreads) {
  FUSEBOX_REQUIRE_GPU();
  Device& device = Device::get(0);
  cublasLtHandle_t mine = device.cublaslt_handle();
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(device.cublaslt_handle(), mine);
  for (int i = 0; i < 4; ++i) {
    cublasLtHandle_t theirs = nullptr;
    cublasStatus_t their_status = CUBLAS_STATUS_NOT_INITIALIZED;
    std::thread([&] {
      theirs = device.cublaslt_handle();
      their_status = query_matmul_heuristic(theirs);
    }).join();  // the thread has exited: nothing of the handle may have gone with it
    EXPECT_EQ(theirs, mine);
    EXPECT_EQ(their_status, CUBLAS_STATUS_SUCCESS);
  }
  EXPECT_EQ(query_matmul_heuristic(mine), CUBLAS_STATUS_SUCCESS);
}

// cuDNN handles carry a stream, so each (device, thread) has its own, rebound on every call.
TEST(CudaDevice, CudnnHandlesArePerThreadAndFollowTheStream) {
  FUSEBOX_REQUIRE_GPU();
  Device& device = Device::get(0);
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

  for (int i = 0; i < 4; ++i) {  // each thread creates its own and destroys it at exit
    cudnnHandle_t their_dnn = nullptr;
    cudaStream_t their_bound = nullptr;
    cudnnStatus_t their_status = CUDNN_STATUS_NOT_INITIALIZED;
    std::thread([&] {
      their_dnn = device.cudnn_handle(device.stream());
      EXPECT_EQ(device.cudnn_handle(device.stream()), their_dnn);  // one per thread
      their_status = cudnnGetStream(their_dnn, &their_bound);
    }).join();
    EXPECT_NE(their_dnn, dnn);
    EXPECT_EQ(their_status, CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(their_bound, device.stream());
  }
  // This thread's handle is untouched by the other threads' exits: still bound to `other`.
  ASSERT_EQ(cudnnGetStream(dnn, &bound), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(bound, other);
  EXPECT_EQ(device.cudnn_handle(device.stream()), dnn);
  ASSERT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

// The rule (no GPU needed): same major, minor at least the compiled one; the patch is free.
TEST(CudaDevice, CudnnVersionRule) {
  EXPECT_EQ(cudnn_version_mismatch(91900, 91900), "");
  EXPECT_EQ(cudnn_version_mismatch(91900, 91902), "");
  EXPECT_EQ(cudnn_version_mismatch(91901, 91900), "");  // patch below: same minor, accepted
  EXPECT_EQ(cudnn_version_mismatch(91900, 92000), "");
  const std::string older = cudnn_version_mismatch(91900, 91400);
  EXPECT_NE(older.find("built against cuDNN 9.19.0 but cuDNN 9.14.0 was loaded"), std::string::npos)
      << older;
  EXPECT_NE(older.find("LD_LIBRARY_PATH"), std::string::npos) << older;
  EXPECT_NE(cudnn_version_mismatch(91900, 100000), "");  // another major
  EXPECT_NE(cudnn_version_mismatch(91900, 81000), "");
}

// The process that runs the GPU tests loads a cuDNN the build can use (the check that
// cudnn_handle() applies; a run under the system's older cuDNN fails here first).
TEST(CudaDevice, LoadedCudnnMatchesTheHeaders) {
  FUSEBOX_REQUIRE_GPU();
  EXPECT_EQ(cudnn_version_mismatch(CUDNN_VERSION, int64_t(cudnnGetVersion())), "");
}

}  // namespace
}  // namespace fusebox::cuda
