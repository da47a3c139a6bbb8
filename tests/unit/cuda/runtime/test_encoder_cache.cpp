// Executable-graph reuse (update, instantiate, re-instantiate on refusal, LRU, the miss
// warning) and the lifetimes the encoder guarantees for buffers used by in-flight work.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/runtime/encoder.h"
#include "backends/cuda/runtime/graph_cache.h"
#include "cuda_test_util.h"
#include "testing.h"

namespace fusebox::cuda {
namespace {

using testing::add_kernel;
using testing::count_not_equal;
using testing::download;
using testing::fill_kernel;
using testing::poison;
using testing::upload;

constexpr int kN = 1024;
constexpr size_t kBytes = kN * sizeof(float);

class EncoderCache : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
  void TearDown() override {
    encoder_.reset();
    allocator_.reset();
  }
  CommandEncoder& make_encoder(size_t capacity = 64, size_t warn_every = 100, bool graphs = true) {
    encoder_.reset();  // the old encoder finishes its work first
    allocator_ = std::make_unique<CachingAllocator>(0);
    CommandEncoder::Options options;
    options.use_graphs = graphs;
    options.graph_cache_capacity = capacity;
    options.miss_warning_every = warn_every;
    encoder_ = std::make_unique<CommandEncoder>(Device::get(0), options, allocator_.get());
    return *encoder_;
  }
  DeviceBuffer floats() { return allocator_->allocate(kBytes); }
  void add(const DeviceBuffer& x, const DeviceBuffer& y, float addend, dim3 grid = dim3(4)) {
    encoder_->launch(add_kernel(), grid, dim3(256), 0, {x}, {y}, x.as<float>(), y.as<float>(),
                     addend, kN, uint64_t(0));
  }
  // Topology "A": one kernel. "B": two chained kernels. "C": one kernel, another grid.
  void record(char topology, const DeviceBuffer& x, const DeviceBuffer& y) {
    add(x, y, 1.0f, topology == 'C' ? dim3(8) : dim3(4));
    if (topology == 'B') add(y, x, 1.0f);
  }

  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<CommandEncoder> encoder_;
};

TEST_F(EncoderCache, SameTopologyNewPointersUpdates) {
  CommandEncoder& enc = make_encoder();
  DeviceBuffer x1 = floats(), y1 = floats(), x2 = floats(), y2 = floats();
  upload(enc, x1, std::vector<float>(kN, 1.0f));
  upload(enc, x2, std::vector<float>(kN, 10.0f));
  poison(enc, y1);
  poison(enc, y2);
  add(x1, y1, 1.0f);
  enc.commit();
  add(x2, y2, 5.0f);  // same kernel and dims; new pointers and a new value
  enc.commit();
  GraphCache::Stats s = enc.stats().graph_cache;
  EXPECT_EQ(s.instantiations, 1u);
  EXPECT_EQ(s.updates, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(enc.stats().commits, 2u);
  EXPECT_EQ(count_not_equal(download(enc, y1), 2.0f), 0u);
  EXPECT_EQ(count_not_equal(download(enc, y2), 15.0f), 0u);  // the update took effect
}

TEST_F(EncoderCache, OtherTopologiesInstantiate) {
  CommandEncoder& enc = make_encoder();
  DeviceBuffer x = floats(), y = floats();
  for (char topology : {'A', 'B', 'C', 'A', 'B', 'C'}) {
    record(topology, x, y);
    enc.commit();
  }
  GraphCache::Stats s = enc.stats().graph_cache;
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.instantiations, 3u);
  EXPECT_EQ(s.updates, 3u);
  EXPECT_EQ(enc.stats().nodes_recorded, 8u);
  EXPECT_EQ(enc.stats().edges_recorded, 2u);
}

TEST_F(EncoderCache, LeastRecentlyUsedIsEvicted) {
  CommandEncoder& enc = make_encoder(/*capacity=*/2);
  DeviceBuffer x = floats(), y = floats();
  for (char topology : {'A', 'B', 'A', 'C', 'A', 'B'}) {  // C evicts B; B evicts C
    record(topology, x, y);
    enc.commit();
  }
  GraphCache::Stats s = enc.stats().graph_cache;
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.evictions, 2u);
}

TEST_F(EncoderCache, CapacityZeroCachesNothing) {
  CommandEncoder& enc = make_encoder(/*capacity=*/0);
  DeviceBuffer x = floats(), y = floats();
  upload(enc, x, std::vector<float>(kN, 0.0f));
  for (int i = 0; i < 3; ++i) {
    add(x, y, 1.0f);
    add(y, x, 1.0f);
    enc.commit();
  }
  EXPECT_EQ(enc.stats().graph_cache.instantiations, 3u);
  EXPECT_EQ(enc.stats().graph_cache.hits, 0u);
  EXPECT_EQ(count_not_equal(download(enc, x), 6.0f), 0u);
}

TEST_F(EncoderCache, MostlyMissingWarnsButNeverFails) {
  CommandEncoder& enc = make_encoder(/*capacity=*/1, /*warn_every=*/4);
  DeviceBuffer x = floats(), y = floats();
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 8; ++i) {  // A, B, A, B, ...: every commit misses
    record(i % 2 ? 'B' : 'A', x, y);
    enc.commit();
  }
  enc.synchronize();
  std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(enc.stats().graph_cache.misses, 8u);
  EXPECT_EQ(enc.stats().graph_cache.warnings, 2u);
  EXPECT_NE(warnings.find("[cuda] graph cache: 4 of the last 4 commits had to instantiate"),
            std::string::npos)
      << warnings;

  // A hit-heavy run with the same settings stays quiet.
  CommandEncoder& quiet = make_encoder(/*capacity=*/1, /*warn_every=*/4);
  DeviceBuffer a = floats(), b = floats();
  for (int i = 0; i < 20; ++i) {
    record('A', a, b);
    quiet.commit();
  }
  EXPECT_EQ(quiet.stats().graph_cache.instantiations, 1u);
  EXPECT_EQ(quiet.stats().graph_cache.warnings, 0u);
}

TEST_F(EncoderCache, DirectModeMatchesGraphs) {
  std::vector<float> results[2];
  for (bool graphs : {true, false}) {
    CommandEncoder& enc = make_encoder(64, 100, graphs);
    DeviceBuffer x = floats(), y = floats();
    upload(enc, x, std::vector<float>(kN, 1.0f));
    for (int step = 0; step < 3; ++step) {
      record('B', x, y);
      enc.commit();
    }
    results[graphs] = download(enc, x);
    EXPECT_EQ(enc.stats().direct_launches, graphs ? 0u : 6u);
    EXPECT_EQ(enc.stats().graph_cache.lookups, graphs ? 3u : 0u);
  }
  EXPECT_EQ(count_not_equal(results[1], 7.0f), 0u);
  EXPECT_EQ(results[0], results[1]);
}

TEST_F(EncoderCache, DirectModeFromEnvironment) {
  CommandEncoder::Options options;
  {
    fusebox::testing::ScopedEnv direct("FUSEBOX_CUDA_GRAPHS", "0");
    options = CommandEncoder::Options::from_env();
  }
  ASSERT_FALSE(options.use_graphs);
  allocator_ = std::make_unique<CachingAllocator>(0);
  encoder_ = std::make_unique<CommandEncoder>(Device::get(0), options, allocator_.get());
  DeviceBuffer x = floats(), y = floats();
  poison(*encoder_, y);
  upload(*encoder_, x, std::vector<float>(kN, 2.0f));
  add(x, y, 3.0f);
  EXPECT_EQ(encoder_->recorded_graph(), nullptr);
  EXPECT_EQ(count_not_equal(download(*encoder_, y), 5.0f), 0u);
  EXPECT_EQ(encoder_->stats().direct_launches, 1u);
}

// --- GraphCache on hand-built graphs: a refused update re-instantiates -----------------------

class GraphBuilder {
 public:
  GraphBuilder() { EXPECT_EQ(cudaGraphCreate(&graph_, 0), cudaSuccess); }
  ~GraphBuilder() { (void)cudaGraphDestroy(graph_); }
  cudaGraph_t graph() const { return graph_; }
  cudaGraphNode_t fill(float* y, float value, const std::vector<cudaGraphNode_t>& deps = {}) {
    int n = kN;
    uint64_t spin = 0;
    void* args[] = {&y, &value, &n, &spin};
    return add_node(reinterpret_cast<void*>(fill_kernel()), args, deps);
  }
  cudaGraphNode_t add(const float* x, float* y, float addend,
                      const std::vector<cudaGraphNode_t>& deps = {}) {
    int n = kN;
    uint64_t spin = 0;
    void* args[] = {&x, &y, &addend, &n, &spin};
    return add_node(reinterpret_cast<void*>(add_kernel()), args, deps);
  }

 private:
  cudaGraphNode_t add_node(void* func, void** args, const std::vector<cudaGraphNode_t>& deps) {
    cudaKernelNodeParams params{};
    params.func = func;
    params.gridDim = dim3(4);
    params.blockDim = dim3(256);
    params.kernelParams = args;
    cudaGraphNode_t node = nullptr;
    EXPECT_EQ(cudaGraphAddKernelNode(&node, graph_, deps.data(), deps.size(), &params),
              cudaSuccess);
    return node;
  }
  cudaGraph_t graph_ = nullptr;
};

TEST_F(EncoderCache, RefusedUpdateReinstantiates) {
  make_encoder();
  DeviceBuffer x = floats(), y = floats();
  cudaStream_t stream = encoder_->stream();
  GraphCache cache(4);
  GraphCache::Outcome outcome{};

  GraphBuilder one;  // fill x
  one.fill(x.as<float>(), 3.0f);
  cudaGraphExec_t exec = cache.prepare("same key", one.graph(), &outcome);
  EXPECT_EQ(outcome, GraphCache::Outcome::instantiated);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);

  // Another topology under the same key (a key that missed a difference): the update is
  // refused, and a new exec replaces the entry.
  GraphBuilder two;  // fill x, then y = x + 1
  cudaGraphNode_t filled = two.fill(x.as<float>(), 4.0f);
  two.add(x.as<float>(), y.as<float>(), 1.0f, {filled});
  exec = cache.prepare("same key", two.graph(), &outcome);
  EXPECT_EQ(outcome, GraphCache::Outcome::reinstantiated);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  poison(*encoder_, y);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(count_not_equal(download(*encoder_, y), 5.0f), 0u);

  // The entry now holds the new topology: the same shape with new values updates.
  GraphBuilder three;
  filled = three.fill(x.as<float>(), 6.0f);
  three.add(x.as<float>(), y.as<float>(), 1.0f, {filled});
  exec = cache.prepare("same key", three.graph(), &outcome);
  EXPECT_EQ(outcome, GraphCache::Outcome::updated);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(count_not_equal(download(*encoder_, y), 7.0f), 0u);

  GraphCache::Stats s = cache.stats();
  EXPECT_EQ(s.refusals, 1u);
  EXPECT_EQ(s.instantiations, 2u);
  EXPECT_EQ(s.updates, 1u);
  EXPECT_EQ(cache.size(), 1u);
}

TEST_F(EncoderCache, TopologyKeyIgnoresPointersAndValues) {
  make_encoder();
  DeviceBuffer x = floats(), y = floats();
  GraphBuilder a, b, c;
  cudaGraphNode_t n = a.fill(x.as<float>(), 1.0f);
  a.add(x.as<float>(), y.as<float>(), 1.0f, {n});
  n = b.fill(y.as<float>(), 2.0f);
  b.add(y.as<float>(), x.as<float>(), 3.0f, {n});
  c.fill(x.as<float>(), 1.0f);
  c.add(x.as<float>(), y.as<float>(), 1.0f);  // no edge
  EXPECT_EQ(graph_topology(a.graph()), graph_topology(b.graph()));
  EXPECT_NE(graph_topology(a.graph()), graph_topology(c.graph()));
}

// --- Lifetimes -------------------------------------------------------------------------------

TEST_F(EncoderCache, BuffersOfRunningWorkAreNotReused) {
  CommandEncoder& enc = make_encoder();
  DeviceBuffer busy = floats();
  void* address = busy.data();
  enc.launch(fill_kernel(), dim3(1), dim3(32), 0, {}, {busy}, busy.as<float>(), 1.0f, kN,
             uint64_t(300'000'000));  // 300 ms
  enc.commit();
  busy = DeviceBuffer();  // the encoder still holds it
  ASSERT_EQ(cudaStreamQuery(enc.stream()), cudaErrorNotReady)
      << "the slow kernel finished before the check could mean anything";
  DeviceBuffer next = floats();
  EXPECT_NE(next.data(), address);
  EXPECT_EQ(allocator_->stats().bytes_cached, 0u);
  EXPECT_EQ(allocator_->stats().bytes_in_use, 2 * CachingAllocator::round_size(kBytes));
  enc.synchronize();  // the work is done: its buffers return to the cache
  EXPECT_EQ(allocator_->stats().bytes_cached, CachingAllocator::round_size(kBytes));
  DeviceBuffer reused = floats();
  EXPECT_EQ(reused.data(), address);
}

TEST_F(EncoderCache, TemporariesAndObjectsLiveUntilCompletion) {
  CommandEncoder& enc = make_encoder(64, 100, /*graphs=*/true);
  DeviceBuffer out = floats();
  DeviceBuffer scratch = floats();  // used by no declared access
  void* scratch_address = scratch.data();
  auto object = std::make_shared<int>(42);
  std::weak_ptr<int> watch = object;
  enc.launch(fill_kernel(), dim3(1), dim3(32), 0, {}, {out}, out.as<float>(), 1.0f, kN,
             uint64_t(300'000'000));
  enc.add_temporary(scratch);
  enc.keep_alive(object);
  enc.commit();
  scratch = DeviceBuffer();
  object.reset();
  ASSERT_EQ(cudaStreamQuery(enc.stream()), cudaErrorNotReady);
  EXPECT_FALSE(watch.expired());
  EXPECT_NE(floats().data(), scratch_address);
  enc.commit();  // polls: the work is still running, nothing is released
  EXPECT_FALSE(watch.expired());
  enc.synchronize();
  EXPECT_TRUE(watch.expired());
}

TEST_F(EncoderCache, AllocatorShortageWaitsForRunningWork) {
  allocator_ = std::make_unique<CachingAllocator>(0, /*limit_bytes=*/size_t(2) << 20);
  CommandEncoder::Options options;
  encoder_ = std::make_unique<CommandEncoder>(Device::get(0), options, allocator_.get());
  DeviceBuffer busy = allocator_->allocate(size_t(2) << 20);
  void* address = busy.data();
  encoder_->launch(fill_kernel(), dim3(1), dim3(32), 0, {}, {busy}, busy.as<float>(), 1.0f, kN,
                   uint64_t(200'000'000));
  encoder_->commit();
  busy = DeviceBuffer();
  ASSERT_EQ(cudaStreamQuery(encoder_->stream()), cudaErrorNotReady);
  // The limit leaves no room: the allocator waits for the encoder's work, then reuses.
  DeviceBuffer again = allocator_->allocate(size_t(2) << 20);
  EXPECT_EQ(again.data(), address);
  EXPECT_EQ(cudaStreamQuery(encoder_->stream()), cudaSuccess);
}

}  // namespace
}  // namespace fusebox::cuda
