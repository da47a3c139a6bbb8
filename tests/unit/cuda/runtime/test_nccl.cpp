// NCCL (backends/cuda/runtime/nccl.h) on one GPU: a world of one rank made from a unique id,
// its all-reduce direct and captured into a CUDA graph (replayed twice), every dtype it takes,
// and the errors: a unique id of the wrong size, an unsupported dtype, use after abort().
// Skips without a GPU, and with a message when libnccl.so.2 is not on the library path.
// (Several ranks need several GPUs: the data-parallel tests on a multi-GPU machine.)
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/nccl.h"
#include "cuda_test_util.h"
#include "fusebox/core/error.h"
#include "testing.h"

namespace fusebox::cuda {
namespace {

// NCCL's unique id, or skips the test saying why NCCL is not there.
#define FUSEBOX_REQUIRE_NCCL(id)                                                                  \
  std::string id;                                                                                 \
  try {                                                                                           \
    id = dist::nccl_unique_id();                                                                  \
  } catch (const Error& e) {                                                                      \
    if (std::string(e.what()).find("cannot load") != std::string::npos) GTEST_SKIP() << e.what(); \
    throw;                                                                                        \
  }

TEST(Nccl, AWorldOfOneSumsDirectlyAndInAGraph) {
  FUSEBOX_REQUIRE_GPU();
  FUSEBOX_REQUIRE_NCCL(id);
  ASSERT_EQ(id.size(), 128u);
  NcclComm comm(id, 0, 1, 0);
  EXPECT_EQ(comm.world_size(), 1);
  cudaStream_t stream = nullptr;
  FUSEBOX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t n = 1000;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = float(i) * 0.5f - 17.25f;
  float* d = nullptr;
  FUSEBOX_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
  FUSEBOX_CUDA_CHECK(cudaMemcpy(d, values.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  // Direct: the sum over one rank is the buffer itself.
  comm.all_reduce_sum(d, n, DType::f32, stream);
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> got(n, -1.0f);
  FUSEBOX_CUDA_CHECK(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, values);
  // Captured into a graph and replayed: the way a compiled step runs it.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FUSEBOX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  comm.all_reduce_sum(d, n, DType::f32, stream);
  FUSEBOX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  FUSEBOX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) FUSEBOX_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::fill(got.begin(), got.end(), -1.0f);
  FUSEBOX_CUDA_CHECK(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, values);
  // Every dtype it takes queues; others are Errors naming them.
  for (DType t : {DType::f64, DType::f16, DType::bf16, DType::i64})
    comm.all_reduce_sum(d, n / 8, t, stream);
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_NE(::fusebox::testing::error_message([&] {
              comm.all_reduce_sum(d, n, DType::boolean, stream);
            }).find("bool is not supported"),
            std::string::npos);
  comm.abort();
  EXPECT_NE(::fusebox::testing::error_message([&] {
              comm.all_reduce_sum(d, n, DType::f32, stream);
            }).find("after abort()"),
            std::string::npos);
  FUSEBOX_CUDA_CHECK(cudaGraphExecDestroy(exec));
  FUSEBOX_CUDA_CHECK(cudaGraphDestroy(graph));
  FUSEBOX_CUDA_CHECK(cudaFree(d));
  FUSEBOX_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(Nccl, AUniqueIdOfTheWrongSizeIsAnErrorNamingTheRank) {
  FUSEBOX_REQUIRE_GPU();
  FUSEBOX_REQUIRE_NCCL(id);
  const std::string message =
      ::fusebox::testing::error_message([&] { NcclComm comm(id.substr(0, 100), 3, 4, 0); });
  EXPECT_NE(message.find("rank 3: a unique id of 100 bytes"), std::string::npos) << message;
}

}  // namespace
}  // namespace fusebox::cuda
