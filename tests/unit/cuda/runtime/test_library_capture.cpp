// A real library call (a cuBLASLt matmul) recorded through capture_library_call, with its
// workspace allocated before the capture; graphs and direct launch give the same result,
// and a repeated call with new buffers reuses the cached graph.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backends/cuda/runtime/device.h"
#include "backends/cuda/runtime/encoder.h"
#include "cuda_test_util.h"

namespace fusebox::cuda {
namespace {

using testing::download;
using testing::poison;
using testing::upload;

// Row-major C[M,N] = A[M,K] B[K,N] through cuBLASLt, which is column-major: it computes
// C^T = B^T A^T, where each row-major matrix is read as its column-major transpose.
class RowMajorMatmul {
 public:
  RowMajorMatmul(int m, int n, int k) {
    FUSEBOX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    FUSEBOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&bt_, CUDA_R_32F, n, k, n));
    FUSEBOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&at_, CUDA_R_32F, k, m, k));
    FUSEBOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ct_, CUDA_R_32F, n, m, n));
  }
  ~RowMajorMatmul() {
    cublasLtMatrixLayoutDestroy(ct_);
    cublasLtMatrixLayoutDestroy(at_);
    cublasLtMatrixLayoutDestroy(bt_);
    cublasLtMatmulDescDestroy(desc_);
  }
  // Chooses the algorithm (host-side work: before any capture).
  void choose(cublasLtHandle_t handle, size_t workspace_bytes) {
    cublasLtMatmulPreference_t preference = nullptr;
    FUSEBOX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    FUSEBOX_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof workspace_bytes));
    int found = 0;
    FUSEBOX_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc_, bt_, at_, ct_, ct_,
                                                        preference, 1, &heuristic_, &found));
    cublasLtMatmulPreferenceDestroy(preference);
    ASSERT_EQ(found, 1);
  }
  void run(cublasLtHandle_t handle, const DeviceBuffer& a, const DeviceBuffer& b,
           const DeviceBuffer& c, const DeviceBuffer& workspace, cudaStream_t stream) const {
    float alpha = 1.0f, beta = 0.0f;
    FUSEBOX_CUBLAS_CHECK(cublasLtMatmul(handle, desc_, &alpha, b.data(), bt_, a.data(), at_, &beta,
                                        c.data(), ct_, c.data(), ct_, &heuristic_.algo,
                                        workspace.data(), workspace.size(), stream));
  }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t bt_ = nullptr, at_ = nullptr, ct_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

// Small integers: every product and sum is exact in fp32, whatever the summation order.
std::vector<float> small_integers(int count, int seed) {
  std::vector<float> values(size_t(count), 0.0f);
  for (int i = 0; i < count; ++i) values[size_t(i)] = float((i * 7 + seed) % 9 - 4);
  return values;
}

std::vector<float> reference_matmul(const std::vector<float>& a, const std::vector<float>& b, int m,
                                    int n, int k) {
  std::vector<float> c(size_t(m) * n, 0.0f);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) sum += double(a[size_t(i) * k + p]) * b[size_t(p) * n + j];
      c[size_t(i) * n + j] = float(sum);
    }
  }
  return c;
}

class LibraryCapture : public ::testing::TestWithParam<bool> {};

TEST_P(LibraryCapture, CublasLtMatmulIsRecordedAndReplayed) {
  FUSEBOX_REQUIRE_GPU();
  constexpr int M = 96, N = 64, K = 40;
  constexpr size_t kWorkspace = size_t(4) << 20;
  Device& device = Device::get(0);
  auto allocator = std::make_unique<CachingAllocator>(0);
  CommandEncoder::Options options;
  options.use_graphs = GetParam();
  auto encoder = std::make_unique<CommandEncoder>(device, options, allocator.get());
  RowMajorMatmul matmul(M, N, K);
  matmul.choose(device.cublaslt_handle(), kWorkspace);

  for (int step = 0; step < 2; ++step) {
    std::vector<float> a = small_integers(M * K, step), b = small_integers(K * N, 3 + step);
    DeviceBuffer da = allocator->allocate(a.size() * 4), db = allocator->allocate(b.size() * 4);
    DeviceBuffer dc = allocator->allocate(size_t(M) * N * 4);
    DeviceBuffer workspace = allocator->allocate(kWorkspace);  // before the capture
    upload(*encoder, da, a);
    upload(*encoder, db, b);
    poison(*encoder, dc);
    encoder->capture_library_call({da, db}, {dc, workspace}, [&](cudaStream_t s) {
      matmul.run(device.cublaslt_handle(), da, db, dc, workspace, s);
    });
    if (GetParam()) {
      cudaGraphNodeType type{};
      ASSERT_EQ(cudaGraphNodeGetType(encoder->recorded_node(0), &type), cudaSuccess);
      EXPECT_EQ(type, cudaGraphNodeTypeGraph);
    }
    encoder->commit();
    EXPECT_EQ(download(*encoder, dc), reference_matmul(a, b, M, N, K)) << "step " << step;
  }
  CommandEncoder::Stats stats = encoder->stats();
  if (GetParam()) {
    EXPECT_EQ(stats.graph_cache.misses, 1u);
    EXPECT_EQ(stats.graph_cache.hits, 1u);  // same call on new buffers: same topology
  } else {
    EXPECT_EQ(stats.direct_launches, 2u);
  }
  encoder.reset();
}

INSTANTIATE_TEST_SUITE_P(Modes, LibraryCapture, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "graphs" : "direct");
                         });

}  // namespace
}  // namespace fusebox::cuda
