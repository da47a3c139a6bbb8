// The CUDA executor's compiled steps: a graph run again replays its recorded step (nothing
// is recorded), with the new feeds; a graph that differs in anything (same_graph, tested
// here without a GPU) is recorded anew.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

#include "backends/cuda/runtime/encoder.h"
#include "cuda_test_util.h"
#include "runtime/cuda_executor.h"
#include "testing.h"

namespace fusebox {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;

// x [n] -> alternately x + a and x * b, `count` times; then leaky_relu(alpha).
Graph chain_graph(int count, int64_t n, double alpha = 0.1) {
  Graph g("chain");
  ValueId x = g.add_input("x", DType::f32, {n});
  ValueId a = g.add_input("a", DType::f32, {});
  ValueId b = g.add_input("b", DType::f32, {});
  for (int i = 0; i < count; ++i)
    x = g.add_node(i % 2 ? OpKind::mul : OpKind::add, {}, {x, i % 2 ? b : a})[0];
  g.mark_output(g.add_node(OpKind::leaky_relu, LeakyReluAttrs{alpha}, {x})[0]);
  return g;
}

NamedTensors chain_feeds(int64_t n, uint64_t seed) {
  return {{"x", random_tensor(DType::f32, {n}, seed, -2.0, 2.0)},
          {"a", Tensor::scalar(DType::f32, 0.25 + 0.01 * double(seed % 7))},
          {"b", Tensor::scalar(DType::f32, 0.5)}};
}

// ---- same_graph (no GPU) ------------------------------------------------------------------

TEST(SameGraph, CopiesAreTheSame) {
  Graph g = chain_graph(6, 32);
  Graph copy = g;
  EXPECT_TRUE(same_graph(g, copy));
  EXPECT_TRUE(same_graph(g, chain_graph(6, 32)));  // built alike: no constants to differ
}

TEST(SameGraph, AnyDifferenceCounts) {
  Graph g = chain_graph(6, 32);
  EXPECT_FALSE(same_graph(g, chain_graph(6, 32, /*alpha=*/0.2)));  // an attribute
  EXPECT_FALSE(same_graph(g, chain_graph(6, 33)));                 // an input's shape
  EXPECT_FALSE(same_graph(g, chain_graph(7, 32)));                 // a node more

  Graph edited = g;
  edited.mark_output(edited.inputs()[0]);
  EXPECT_FALSE(same_graph(g, edited));  // another output
  Graph renamed = g;
  renamed.rename_value(renamed.inputs()[1], "addend");
  EXPECT_FALSE(same_graph(g, renamed));  // feeds are found by name
}

TEST(SameGraph, DoublesCompareByBitsAndConstantsByIdentity) {
  auto padded = [](double value, const Tensor& weight) {
    Graph g("pad");
    ValueId x = g.add_input("x", DType::f32, {4});
    ValueId w = g.add_constant("w", weight);
    ValueId y = g.add_node(OpKind::pad, PadAttrs{{1, 1}, PadMode::constant, value}, {x})[0];
    g.mark_output(g.add_node(OpKind::add, {}, {y, w})[0]);
    return g;
  };
  Tensor w = Tensor::full(DType::f32, {6}, 1.0);
  EXPECT_TRUE(same_graph(padded(0.0, w), padded(0.0, w)));
  EXPECT_FALSE(same_graph(padded(0.0, w), padded(-0.0, w)));  // the sign shows in the output
  double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(same_graph(padded(nan, w), padded(nan, w)));
  // Equal contents in another tensor: another constant (contents are never compared).
  EXPECT_FALSE(same_graph(padded(0.0, w), padded(0.0, w.clone())));
}

// ---- Step reuse on the GPU -----------------------------------------------------------------

class CudaSteps : public ::testing::Test {
 protected:
  void SetUp() override {
    FUSEBOX_REQUIRE_GPU();
    if (!cuda::CommandEncoder::for_device(0).options().use_graphs)
      GTEST_SKIP() << "FUSEBOX_CUDA_GRAPHS=0: steps are recorded every run";
    if (cuda_step_cache_stats().capacity == 0) GTEST_SKIP() << "FUSEBOX_CUDA_STEP_CACHE=0";
    release_cuda_step_cache();
  }
  void TearDown() override { release_cuda_step_cache(); }

  static NamedTensors run_cuda(const Graph& g, const NamedTensors& feeds) {
    return run_graph(g, feeds, RunOptions{.device = fusebox::Device::cuda});
  }
  static void expect_matches_cpu(const Graph& g, const NamedTensors& feeds,
                                 const NamedTensors& got) {
    NamedTensors want = run_graph(g, feeds, RunOptions{.device = fusebox::Device::cpu});
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_TRUE(all_close(got.at(name), t, 1e-5, 1e-6)) << name;
    }
  }
};

TEST_F(CudaSteps, SecondRunReplaysWithTheNewFeedsAndRecordsNothing) {
  cuda::CommandEncoder& encoder = cuda::CommandEncoder::for_device(0);
  Graph g = chain_graph(40, 3000);
  const CudaStepCacheStats before = cuda_step_cache_stats();
  NamedTensors feeds = chain_feeds(3000, 1);
  expect_matches_cpu(g, feeds, run_cuda(g, feeds));
  const cuda::CommandEncoder::Stats first = encoder.stats();
  CudaStepCacheStats stats = cuda_step_cache_stats();
  EXPECT_EQ(stats.misses, before.misses + 1);
  EXPECT_EQ(stats.compiled, before.compiled + 1);
  EXPECT_EQ(stats.size, 1u);

  for (uint64_t seed = 2; seed < 5; ++seed) {
    feeds = chain_feeds(3000, seed);
    expect_matches_cpu(g, feeds, run_cuda(g, feeds));
  }
  const cuda::CommandEncoder::Stats later = encoder.stats();
  EXPECT_EQ(later.ops_recorded, first.ops_recorded);  // nothing recorded again
  EXPECT_EQ(later.nodes_recorded, first.nodes_recorded);
  EXPECT_EQ(later.graph_cache.lookups, first.graph_cache.lookups);  // no exec updates
  EXPECT_EQ(later.replays, first.replays + 3);
  EXPECT_EQ(cuda_step_cache_stats().hits, stats.hits + 3);
}

TEST_F(CudaSteps, AGraphAtTheSameAddressWithOtherAttributesIsRecordedAnew) {
  const CudaStepCacheStats before = cuda_step_cache_stats();
  const NamedTensors feeds = chain_feeds(500, 3);
  for (double alpha : {0.1, 0.5, 0.1}) {
    std::optional<Graph> g;  // the same storage every time
    g.emplace(chain_graph(4, 500, alpha));
    // Negative leaky_relu inputs make alpha visible in the output.
    expect_matches_cpu(*g, feeds, run_cuda(*g, feeds));
  }
  CudaStepCacheStats stats = cuda_step_cache_stats();
  EXPECT_EQ(stats.compiled, before.compiled + 2) << "alpha 0.1 again replays the first step";
  EXPECT_EQ(stats.hits, before.hits + 1);
  EXPECT_EQ(stats.size, 2u);
}

TEST_F(CudaSteps, AnEditedGraphIsRecordedAnew) {
  const CudaStepCacheStats before = cuda_step_cache_stats();
  Graph g = chain_graph(4, 256);
  const NamedTensors feeds = chain_feeds(256, 4);
  expect_matches_cpu(g, feeds, run_cuda(g, feeds));
  ValueId y = g.outputs()[0];
  g.mark_output(g.add_node(OpKind::neg, {}, {y}, "negated")[0]);
  expect_matches_cpu(g, feeds, run_cuda(g, feeds));
  expect_matches_cpu(g, feeds, run_cuda(g, feeds));
  CudaStepCacheStats stats = cuda_step_cache_stats();
  EXPECT_EQ(stats.compiled, before.compiled + 2);
  EXPECT_EQ(stats.hits, before.hits + 1);
}

TEST_F(CudaSteps, ReleasedStepsAreRecordedAgain) {
  const CudaStepCacheStats before = cuda_step_cache_stats();
  Graph g = chain_graph(4, 256);
  const NamedTensors feeds = chain_feeds(256, 5);
  run_cuda(g, feeds);
  release_cuda_step_cache();
  EXPECT_EQ(cuda_step_cache_stats().size, 0u);
  expect_matches_cpu(g, feeds, run_cuda(g, feeds));
  EXPECT_EQ(cuda_step_cache_stats().compiled, before.compiled + 2);
  EXPECT_EQ(cuda_step_cache_stats().hits, before.hits);
}

}  // namespace
}  // namespace fusebox
