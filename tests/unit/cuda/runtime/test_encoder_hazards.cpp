// The command encoder orders exactly the hazards: read after write, write after read and
// write after write, on overlapping bytes. Each scenario checks the recorded graph's edges
// and the numbers; a slow first kernel (it spins before touching memory) makes a missing
// edge show up as a wrong result. Every scenario also runs with graphs off (direct launch).
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "backends/cuda/runtime/encoder.h"
#include "cuda_test_util.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

using testing::add_kernel;
using testing::count_not_equal;
using testing::download;
using testing::fill_kernel;
using testing::kSpinNs;
using testing::poison;
using testing::upload;
using Edges = std::vector<std::pair<size_t, size_t>>;

constexpr int kN = 4096;
constexpr dim3 kGrid(16);
constexpr dim3 kBlock(256);

class EncoderHazards : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    FUSEBOX_REQUIRE_GPU();
    allocator_ = std::make_unique<CachingAllocator>(0);
    CommandEncoder::Options options;
    options.use_graphs = GetParam();
    encoder_ = std::make_unique<CommandEncoder>(Device::get(0), options, allocator_.get());
  }
  void TearDown() override {
    encoder_.reset();  // before the allocator it reclaims for
    allocator_.reset();
  }
  bool graphs() const { return GetParam(); }
  DeviceBuffer floats(int n = kN) { return allocator_->allocate(size_t(n) * sizeof(float)); }
  // A buffer already holding NaNs.
  DeviceBuffer poisoned(int n = kN) {
    DeviceBuffer b = floats(n);
    poison(*encoder_, b);
    return b;
  }
  size_t fill(const BufferRange& y, float value, uint64_t spin = 0) {
    int n = int(y.bytes / sizeof(float));
    return encoder_->launch(fill_kernel(), kGrid, kBlock, 0, {}, {y}, static_cast<float*>(y.data()),
                            value, n, spin);
  }
  size_t add(const BufferRange& x, const BufferRange& y, float addend, uint64_t spin = 0) {
    int n = int(y.bytes / sizeof(float));
    return encoder_->launch(add_kernel(), kGrid, kBlock, 0, {x}, {y},
                            static_cast<const float*>(x.data()), static_cast<float*>(y.data()),
                            addend, n, spin);
  }
  // The recorded edges (graphs only; launching directly records none).
  void expect_edges(const Edges& expected) {
    if (graphs()) {
      EXPECT_EQ(encoder_->recorded_edges(), expected);
    } else {
      EXPECT_EQ(encoder_->recorded_graph(), nullptr);
    }
  }
  std::vector<float> values(const BufferRange& b) { return download(*encoder_, b); }

  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<CommandEncoder> encoder_;
};

TEST_P(EncoderHazards, ReadAfterWrite) {
  DeviceBuffer x = poisoned(), y = poisoned();
  EXPECT_EQ(fill(x, 1.0f, kSpinNs), 0u);
  EXPECT_EQ(add(x, y, 1.0f), 1u);
  expect_edges({{0, 1}});
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(y), 2.0f), 0u);
}

TEST_P(EncoderHazards, WriteAfterRead) {
  DeviceBuffer x = floats(), y = poisoned();
  upload(*encoder_, x, std::vector<float>(kN, 5.0f));
  add(x, y, 1.0f, kSpinNs);  // reads x late
  fill(x, 100.0f);           // must not overwrite x before that read
  expect_edges({{0, 1}});
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(y), 6.0f), 0u);
  EXPECT_EQ(count_not_equal(values(x), 100.0f), 0u);
}

TEST_P(EncoderHazards, WriteAfterWrite) {
  DeviceBuffer x = poisoned();
  fill(x, 1.0f, kSpinNs);
  fill(x, 2.0f);  // the last write must win
  expect_edges({{0, 1}});
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(x), 2.0f), 0u);
}

TEST_P(EncoderHazards, WriteAfterReadAfterWriteKeepsOnlyDirectEdges) {
  DeviceBuffer x = poisoned(), y = poisoned();
  fill(x, 3.0f, kSpinNs);
  add(x, y, 1.0f, kSpinNs);
  fill(x, 7.0f);
  // 0 -> 2 (write after write) is implied by 0 -> 1 -> 2 and left out.
  expect_edges({{0, 1}, {1, 2}});
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(y), 4.0f), 0u);
  EXPECT_EQ(count_not_equal(values(x), 7.0f), 0u);
}

TEST_P(EncoderHazards, IndependentBranchesStayUnordered) {
  DeviceBuffer x = poisoned(), y = poisoned(), z = poisoned(), w = poisoned();
  fill(x, 1.0f, kSpinNs);  // 0
  fill(y, 2.0f, kSpinNs);  // 1
  add(x, z, 10.0f);        // 2 (after 0 only)
  add(y, w, 20.0f);        // 3 (after 1 only)
  add(x, y, 0.5f);         // 4: reads x after 0, writes y after 1 and after its reader 3
  expect_edges({{0, 2}, {0, 4}, {1, 3}, {3, 4}});
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(z), 11.0f), 0u);
  EXPECT_EQ(count_not_equal(values(w), 22.0f), 0u);
  EXPECT_EQ(count_not_equal(values(y), 1.5f), 0u);
}

TEST_P(EncoderHazards, ReadersOfOneWriteShareNoEdge) {
  DeviceBuffer x = poisoned(), y = poisoned(), z = poisoned();
  fill(x, 4.0f, kSpinNs);
  add(x, y, 1.0f);
  add(x, z, 2.0f);
  expect_edges({{0, 1}, {0, 2}});
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(y), 5.0f), 0u);
  EXPECT_EQ(count_not_equal(values(z), 6.0f), 0u);
}

TEST_P(EncoderHazards, ByteRangesOrderOnlyOverlaps) {
  constexpr size_t half = kN / 2 * sizeof(float);
  DeviceBuffer x = poisoned(), y = poisoned();
  BufferRange low(x, 0, half), high(x, half, half), middle(x, half / 2, half);
  fill(low, 1.0f, kSpinNs);   // 0
  fill(high, 2.0f, kSpinNs);  // 1: disjoint from 0, no edge
  add(x, y, 0.0f);            // 2: reads both halves
  fill(middle, 9.0f);         // 3: overlaps 0, 1 (writes) and 2 (read); 2 implies 0 and 1
  expect_edges({{0, 2}, {1, 2}, {2, 3}});
  encoder_->commit();
  std::vector<float> got_y = values(y), got_x = values(x);
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(got_y[size_t(i)], i < kN / 2 ? 1.0f : 2.0f) << "y[" << i << "]";
    float want_x = i < kN / 4 ? 1.0f : i < 3 * kN / 4 ? 9.0f : 2.0f;
    ASSERT_EQ(got_x[size_t(i)], want_x) << "x[" << i << "]";
  }
}

TEST_P(EncoderHazards, MemsetAndMemcpyNodes) {
  DeviceBuffer x = poisoned(), y = poisoned();
  fill(x, 8.0f, kSpinNs);                      // 0
  encoder_->memcpy(y, x);                      // 1: reads x after 0
  encoder_->memset(BufferRange(x, 0, 64), 0);  // 2: writes x after its reader 1
  expect_edges({{0, 1}, {1, 2}});
  if (graphs()) {
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(encoder_->recorded_node(1), &type), cudaSuccess);
    EXPECT_EQ(type, cudaGraphNodeTypeMemcpy);
    ASSERT_EQ(cudaGraphNodeGetType(encoder_->recorded_node(2), &type), cudaSuccess);
    EXPECT_EQ(type, cudaGraphNodeTypeMemset);
  }
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(y), 8.0f), 0u);
  std::vector<float> got_x = values(x);
  EXPECT_EQ(count_not_equal({got_x.begin(), got_x.begin() + 16}, 0.0f), 0u);
  EXPECT_EQ(count_not_equal({got_x.begin() + 16, got_x.end()}, 8.0f), 0u);
  EXPECT_EQ(encoder_->memset(BufferRange(x, 0, 0), 0), CommandEncoder::kNoOp);
  EXPECT_THROW(encoder_->memcpy(BufferRange(y, 0, 8), BufferRange(x, 0, 4)), Error);
}

TEST_P(EncoderHazards, LibraryCallsAreCapturedAndOrdered) {
  DeviceBuffer x = poisoned(), y = poisoned(), z = poisoned();
  fill(x, 3.0f, kSpinNs);  // 0
  size_t op = encoder_->capture_library_call({x}, {y, z}, [&](cudaStream_t s) {
    // Stream-ordered work, as a library would issue it: a copy, then a kernel.
    FUSEBOX_CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), y.size(), cudaMemcpyDeviceToDevice, s));
    const float* from = y.as<float>();
    float* to = z.as<float>();
    float addend = 1.0f;
    int n = kN;
    uint64_t spin = 0;
    void* args[] = {&from, &to, &addend, &n, &spin};
    FUSEBOX_CUDA_CHECK(
        cudaLaunchKernel(reinterpret_cast<const void*>(add_kernel()), kGrid, kBlock, args, 0, s));
  });
  EXPECT_EQ(op, 1u);
  add(z, x, 1.0f);  // 2: reads z after 1, writes x after its reader 1
  expect_edges({{0, 1}, {1, 2}});
  if (graphs()) {
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(encoder_->recorded_node(1), &type), cudaSuccess);
    EXPECT_EQ(type, cudaGraphNodeTypeGraph);
  }
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(y), 3.0f), 0u);
  EXPECT_EQ(count_not_equal(values(z), 4.0f), 0u);
  EXPECT_EQ(count_not_equal(values(x), 5.0f), 0u);
}

TEST_P(EncoderHazards, EmptyCaptureStillOrders) {
  DeviceBuffer x = poisoned(), y = poisoned();
  fill(x, 1.0f, kSpinNs);
  encoder_->capture_library_call({x}, {y}, [](cudaStream_t) {});
  add(x, y, 1.0f);
  expect_edges({{0, 1}, {1, 2}});
  if (graphs()) {
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(encoder_->recorded_node(1), &type), cudaSuccess);
    EXPECT_EQ(type, cudaGraphNodeTypeEmpty);
  }
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(y), 2.0f), 0u);
}

TEST_P(EncoderHazards, FailedCaptureLeavesEncoderUsable) {
  DeviceBuffer x = poisoned(), y = poisoned();
  fill(x, 1.0f);
  EXPECT_THROW(
      encoder_->capture_library_call({}, {y}, [](cudaStream_t) { throw Error("test", "boom"); }),
      Error);
  if (graphs()) {
    // Synchronising a capturing stream invalidates the capture.
    try {
      encoder_->capture_library_call({}, {y},
                                     [](cudaStream_t s) { (void)cudaStreamSynchronize(s); });
      ADD_FAILURE() << "an invalidated capture was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cudaStreamEndCapture failed"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  add(x, y, 1.0f);
  expect_edges({{0, 1}});
  encoder_->commit();
  EXPECT_EQ(count_not_equal(values(y), 2.0f), 0u);
}

TEST_P(EncoderHazards, LargeDynamicSharedMemoryIsOptedIn) {
  const DeviceProperties& props = Device::get(0).properties();
  int n = int(props.shared_memory_per_block_optin / sizeof(float)) - 256;  // > 48 KiB
  ASSERT_GT(size_t(n) * sizeof(float), props.shared_memory_per_block);
  DeviceBuffer x = floats(n), y = poisoned(n);
  auto input = std::vector<float>(size_t(n));
  for (int i = 0; i < n; ++i) input[size_t(i)] = float(i);
  upload(*encoder_, x, input);
  encoder_->launch(testing::reverse_through_shared_kernel(), dim3(1), dim3(1024),
                   size_t(n) * sizeof(float), {x}, {y}, x.as<float>(), y.as<float>(), n);
  encoder_->commit();
  std::vector<float> got = values(y);
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], float(n - 1 - i)) << "y[" << i << "]";
  // More than the device allows, and too many threads, are clear errors.
  EXPECT_THROW(encoder_->launch(testing::reverse_through_shared_kernel(), dim3(1), dim3(32),
                                props.shared_memory_per_block_optin + 1, {x}, {y}, x.as<float>(),
                                y.as<float>(), n),
               Error);
  EXPECT_THROW(encoder_->launch(fill_kernel(), dim3(1), dim3(2048), 0, {}, {y}, y.as<float>(), 1.0f,
                                n, uint64_t(0)),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Modes, EncoderHazards, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "graphs" : "direct");
                         });

}  // namespace
}  // namespace fusebox::cuda
