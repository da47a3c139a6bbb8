// Replaying a finished recording (RecordedGraph): results follow the buffers' new contents,
// nothing is recorded again, the buffers outlive their owners' handles until the last
// launch completes; and child graphs added with add_child_graph.
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
using testing::poison;
using testing::upload;

constexpr int kN = 2048;
constexpr size_t kBytes = kN * sizeof(float);

class EncoderReplay : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
  void TearDown() override {
    encoder_.reset();  // before the allocator it reclaims for
    allocator_.reset();
  }
  CommandEncoder& make_encoder(bool graphs = true) {
    encoder_.reset();
    allocator_ = std::make_unique<CachingAllocator>(0);
    CommandEncoder::Options options;
    options.use_graphs = graphs;
    encoder_ = std::make_unique<CommandEncoder>(Device::get(0), options, allocator_.get());
    return *encoder_;
  }
  DeviceBuffer floats() { return allocator_->allocate(kBytes); }
  size_t add(const DeviceBuffer& x, const DeviceBuffer& y, float addend, uint64_t spin = 0) {
    return encoder_->launch(add_kernel(), dim3(8), dim3(256), 0, {x}, {y}, x.as<float>(),
                            y.as<float>(), addend, kN, spin);
  }
  size_t fill(const DeviceBuffer& y, float value, uint64_t spin = 0) {
    return encoder_->launch(fill_kernel(), dim3(8), dim3(256), 0, {}, {y}, y.as<float>(), value, kN,
                            spin);
  }

  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<CommandEncoder> encoder_;
};

TEST_F(EncoderReplay, ResultsFollowNewInputsWithoutRecording) {
  CommandEncoder& enc = make_encoder();
  DeviceBuffer x = floats(), t = floats(), y = floats();
  upload(enc, x, std::vector<float>(kN, 1.0f));
  poison(enc, y);
  add(x, t, 1.0f);  // t = x + 1
  add(t, y, 2.0f);  // y = t + 2
  RecordedGraph step = enc.finish_recording();
  ASSERT_TRUE(step);
  EXPECT_EQ(step.ops(), 2u);
  EXPECT_EQ(enc.pending_ops(), 0u);  // a fresh recording
  EXPECT_EQ(enc.recorded_graph(), nullptr);
  const CommandEncoder::Stats recorded = enc.stats();
  EXPECT_EQ(recorded.recordings_finished, 1u);
  EXPECT_EQ(count_not_equal(download(enc, y), 0.0f), size_t(kN));  // not launched yet: NaNs

  for (int i = 0; i < 5; ++i) {
    float input = 10.0f * float(i);
    upload(enc, x, std::vector<float>(kN, input));
    poison(enc, y);
    enc.replay(step);
    EXPECT_EQ(count_not_equal(download(enc, y), input + 3.0f), 0u) << "replay " << i;
  }
  const CommandEncoder::Stats after = enc.stats();
  EXPECT_EQ(after.replays, 5u);
  EXPECT_EQ(after.ops_recorded, recorded.ops_recorded);  // nothing recorded again
  EXPECT_EQ(after.nodes_recorded, recorded.nodes_recorded);
  EXPECT_EQ(after.graph_cache.lookups, recorded.graph_cache.lookups);  // no exec updates
  EXPECT_EQ(after.commits, recorded.commits);
}

TEST_F(EncoderReplay, ReplayRunsAfterWorkRecordedBefore) {
  CommandEncoder& enc = make_encoder();
  DeviceBuffer x = floats(), y = floats();
  add(x, y, 1.0f);
  RecordedGraph step = enc.finish_recording();
  // Recorded but not committed: replay() commits it first, so the step reads x = 4 even
  // though the fill spins for a while.
  fill(x, 4.0f, testing::kSpinNs);
  enc.replay(step);
  EXPECT_EQ(count_not_equal(download(enc, y), 5.0f), 0u);
}

TEST_F(EncoderReplay, BuffersOutliveTheirHandlesUntilTheLastLaunchCompletes) {
  CommandEncoder& enc = make_encoder();
  DeviceBuffer out = floats(), scratch = floats();
  void* out_address = out.data();
  auto object = std::make_shared<int>(7);
  std::weak_ptr<int> watch = object;
  fill(out, 2.0f, /*spin=*/300'000'000);  // 300 ms
  enc.add_temporary(scratch);
  enc.keep_alive(object);
  RecordedGraph step = enc.finish_recording();
  const size_t held_bytes = 2 * CachingAllocator::round_size(kBytes);

  // The recorded graph alone holds them now.
  out = DeviceBuffer();
  scratch = DeviceBuffer();
  object.reset();
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(allocator_->stats().bytes_in_use, held_bytes);

  enc.replay(step);
  step = RecordedGraph();  // dropped while its launch runs
  ASSERT_EQ(cudaStreamQuery(enc.stream()), cudaErrorNotReady)
      << "the slow kernel finished before the check could mean anything";
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(allocator_->stats().bytes_in_use, held_bytes);
  EXPECT_NE(floats().data(), out_address);  // not handed out again while in use
  enc.commit();                             // polls: still running, nothing released
  EXPECT_FALSE(watch.expired());

  enc.synchronize();
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(allocator_->stats().bytes_in_use, 0u);
  EXPECT_EQ(allocator_->stats().bytes_cached, held_bytes + CachingAllocator::round_size(kBytes));
}

TEST_F(EncoderReplay, DroppedBeforeAnyLaunchFreesAtOnce) {
  CommandEncoder& enc = make_encoder();
  {
    DeviceBuffer x = floats(), y = floats();
    add(x, y, 1.0f);
  }
  RecordedGraph step = enc.finish_recording();
  EXPECT_EQ(allocator_->stats().bytes_in_use, 2 * CachingAllocator::round_size(kBytes));
  step = RecordedGraph();
  EXPECT_EQ(allocator_->stats().bytes_in_use, 0u);
}

TEST_F(EncoderReplay, DisabledNodesAreSkippedByLaterLaunches) {
  CommandEncoder& enc = make_encoder();
  DeviceBuffer x = floats(), y = floats();
  size_t poison_op = enc.memset(y, 0xFF);
  add(x, y, 1.0f);
  RecordedGraph step = enc.finish_recording();
  upload(enc, x, std::vector<float>(kN, 1.0f));
  enc.replay(step);
  EXPECT_EQ(count_not_equal(download(enc, y), 2.0f), 0u);

  // Without the add, the memset alone shows: NaN.
  step.set_enabled(1, false);
  enc.replay(step);
  EXPECT_EQ(count_not_equal(download(enc, y), 0.0f), size_t(kN));
  // Without the memset, the add alone: the poison is gone.
  step.set_enabled(1, true);
  step.set_enabled(poison_op, false);
  upload(enc, x, std::vector<float>(kN, 5.0f));
  enc.replay(step);
  EXPECT_EQ(count_not_equal(download(enc, y), 6.0f), 0u);
  EXPECT_THROW(step.set_enabled(2, false), Error);
}

TEST_F(EncoderReplay, EmptyRecordingAndDirectMode) {
  CommandEncoder& enc = make_encoder();
  RecordedGraph empty = enc.finish_recording();
  EXPECT_FALSE(empty);
  EXPECT_EQ(empty.ops(), 0u);
  EXPECT_NO_THROW(enc.replay(empty));
  EXPECT_EQ(enc.stats().replays, 0u);

  CommandEncoder& direct = make_encoder(/*graphs=*/false);
  DeviceBuffer x = floats(), y = floats();
  add(x, y, 1.0f);
  try {
    direct.finish_recording();
    ADD_FAILURE() << "finish_recording launching directly did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FUSEBOX_CUDA_GRAPHS=0"), std::string::npos) << e.what();
  }
}

TEST_F(EncoderReplay, DiscardedRecordingNeverRuns) {
  CommandEncoder& enc = make_encoder();
  DeviceBuffer y = floats();
  upload(enc, y, std::vector<float>(kN, 1.0f));
  fill(y, 9.0f);
  enc.discard_recording();
  EXPECT_EQ(enc.pending_ops(), 0u);
  EXPECT_EQ(count_not_equal(download(enc, y), 1.0f), 0u);
}

// ---- add_child_graph ------------------------------------------------------------------------

// A graph made outside the encoder: y = value (fill_kernel, one node).
cudaGraph_t make_fill_graph(float* y, float value) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaGraphCreate(&graph, 0), cudaSuccess);
  int n = kN;
  uint64_t spin = testing::kSpinNs;  // slow: a missing edge shows in the result
  void* args[] = {&y, &value, &n, &spin};
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(fill_kernel());
  params.gridDim = dim3(8);
  params.blockDim = dim3(256);
  params.kernelParams = args;
  cudaGraphNode_t node = nullptr;
  EXPECT_EQ(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &params), cudaSuccess);
  return graph;
}

class ChildGraph : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    FUSEBOX_REQUIRE_GPU();
    allocator_ = std::make_unique<CachingAllocator>(0);
    CommandEncoder::Options options;
    options.use_graphs = GetParam();
    encoder_ = std::make_unique<CommandEncoder>(Device::get(0), options, allocator_.get());
  }
  void TearDown() override {
    encoder_.reset();
    allocator_.reset();
  }
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<CommandEncoder> encoder_;
};

TEST_P(ChildGraph, IsOrderedByItsBuffersAndTheCallerKeepsIt) {
  CommandEncoder& enc = *encoder_;
  DeviceBuffer x = allocator_->allocate(kBytes), y = allocator_->allocate(kBytes);
  DeviceBuffer other = allocator_->allocate(kBytes);
  poison(enc, y);
  cudaGraph_t child = make_fill_graph(x.as<float>(), 3.0f);
  size_t child_op = enc.add_child_graph({}, {x}, child);
  enc.launch(fill_kernel(), dim3(8), dim3(256), 0, {}, {other}, other.as<float>(), 1.0f, kN,
             uint64_t(0));  // independent of both
  size_t reader = enc.launch(add_kernel(), dim3(8), dim3(256), 0, {x}, {y}, x.as<float>(),
                             y.as<float>(), 1.0f, kN, uint64_t(0));
  if (GetParam()) {
    using Edges = std::vector<std::pair<size_t, size_t>>;
    EXPECT_EQ(enc.recorded_edges(), (Edges{{child_op, reader}}));
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(enc.recorded_node(child_op), &type), cudaSuccess);
    EXPECT_EQ(type, cudaGraphNodeTypeGraph);
  }
  // The caller's graph is still the caller's: destroying it leaves the recording intact.
  ASSERT_EQ(cudaGraphDestroy(child), cudaSuccess);
  EXPECT_EQ(count_not_equal(download(enc, y), 4.0f), 0u);
  EXPECT_EQ(enc.stats().direct_launches, GetParam() ? 0u : 3u);
}

TEST_P(ChildGraph, ReplaysInsideARecordedGraph) {
  if (!GetParam()) GTEST_SKIP() << "replay needs graphs";
  CommandEncoder& enc = *encoder_;
  DeviceBuffer x = allocator_->allocate(kBytes), y = allocator_->allocate(kBytes);
  cudaGraph_t child = make_fill_graph(x.as<float>(), 6.0f);
  enc.add_child_graph({}, {x}, child);
  ASSERT_EQ(cudaGraphDestroy(child), cudaSuccess);
  enc.launch(add_kernel(), dim3(8), dim3(256), 0, {x}, {y}, x.as<float>(), y.as<float>(), 1.0f, kN,
             uint64_t(0));
  RecordedGraph step = enc.finish_recording();
  for (int i = 0; i < 2; ++i) {
    poison(enc, x);
    poison(enc, y);
    enc.replay(step);
    EXPECT_EQ(count_not_equal(download(enc, y), 7.0f), 0u);
  }
}

TEST_P(ChildGraph, EmptyChildIsAnOrderedNoOp) {
  CommandEncoder& enc = *encoder_;
  DeviceBuffer x = allocator_->allocate(kBytes), y = allocator_->allocate(kBytes);
  cudaGraph_t empty = nullptr;
  ASSERT_EQ(cudaGraphCreate(&empty, 0), cudaSuccess);
  enc.launch(fill_kernel(), dim3(8), dim3(256), 0, {}, {x}, x.as<float>(), 2.0f, kN,
             testing::kSpinNs);
  size_t op = enc.add_child_graph({x}, {y}, empty);
  enc.launch(add_kernel(), dim3(8), dim3(256), 0, {x}, {y}, x.as<float>(), y.as<float>(), 1.0f, kN,
             uint64_t(0));
  if (GetParam()) {
    using Edges = std::vector<std::pair<size_t, size_t>>;
    EXPECT_EQ(enc.recorded_edges(), (Edges{{0, op}, {op, 2}}));
  }
  ASSERT_EQ(cudaGraphDestroy(empty), cudaSuccess);
  EXPECT_EQ(count_not_equal(download(enc, y), 3.0f), 0u);
  EXPECT_THROW(enc.add_child_graph({}, {}, nullptr), Error);
}

INSTANTIATE_TEST_SUITE_P(Modes, ChildGraph, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "graphs" : "direct");
                         });

}  // namespace
}  // namespace fusebox::cuda
