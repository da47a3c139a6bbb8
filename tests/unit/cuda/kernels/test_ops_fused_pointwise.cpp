// fused_pointwise on the GPU (kernels/pointwise/fused.cu): the generated kernel against the
// CPU oracle (the unfused chain's bits) on every path (vectorised with contiguous, per-channel
// and row inputs and a tail; general with strided views and misaligned bases), dtypes, random
// programs, against the unfused CUDA kernels, recorded into an executable's CUDA graph and
// launched directly, and the kernel caches (memory, and a fresh disk cache directory).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "backends/cuda/runtime/nvrtc.h"
#include "backends/cuda/runtime/settings.h"
#include "fusebox/runtime/executable.h"
#include "gpu_vs_cpu.h"
#include "random_pointwise.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::ChainOptions;
using fusebox::testing::random_chain;
using fusebox::testing::random_tensor;
using fusebox::testing::RandomChain;
using fusebox::testing::run_op;

// x*a+b -> gelu -> *c -> +d -> relu -> +x: a..d broadcast along `bcast`'s shape.
PointwiseProgram bench_like_program(bool tanh) {
  return {5,
          {{OpKind::mul, {0, 1}},
           {OpKind::add, {5, 2}},
           {.op = OpKind::gelu, .operands = {6}, .tanh_approximation = tanh},
           {OpKind::mul, {7, 3}},
           {OpKind::add, {8, 4}},
           {OpKind::relu, {9}},
           {OpKind::add, {10, 0}}}};
}

std::vector<Tensor> bench_like_inputs(DType t, const Shape& x, const Shape& bcast, uint64_t seed) {
  std::vector<Tensor> in = {random_tensor(t, x, seed, -2, 2)};
  for (uint64_t k = 1; k <= 4; ++k) in.push_back(random_tensor(t, bcast, seed + k, -1.5, 1.5));
  return in;
}

// A chain of several ops: each rounds like the CPU's, but an f32 ulp the GPU's formula
// differs by may flip a rounding and travel on: a few ulps of the dtype.
Tolerance chain_tolerance(DType t) {
  const Tolerance one = tolerance_for(t);
  return {4 * one.rtol, 4 * one.atol};
}

class FusedPointwiseTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }

  // The kernel entry on host tensors (uploaded contiguous) against the CPU; `slack` widens
  // the tolerance (random programs: a flipped rounding may meet a cancellation later).
  void expect_matches_cpu(const PointwiseProgram& p, const std::vector<Tensor>& inputs,
                          double slack = 1) {
    OpHarness h;
    const std::vector<Tensor> want = run_op(OpKind::fused_pointwise, p, inputs);
    const std::vector<Tensor> got = h.run(fused_pointwise, OpKind::fused_pointwise, p, inputs);
    Tolerance tol = chain_tolerance(want[0].dtype());
    tol = {tol.rtol * slack, tol.atol * slack};
    EXPECT_TRUE(all_close(got[0], want[0], tol.rtol, tol.atol)) << pointwise_program_text(p);
  }
};

// A generated kernel NVRTC refuses (FUSEBOX_TEST_NVRTC_FAILURE=1 refuses them all) is no
// error: the node runs unfused, one kernel per instruction, to the chain's tolerance; its
// source is written to the temporary directory. A program of its own (leaky_relu's alpha
// 0.3125 is in the source, as 0x1.4p-2f), so no other test's pattern is marked refused for the
// process.
TEST_F(FusedPointwiseTest, ARefusedKernelRunsUnfusedAndLeavesItsSource) {
  const PointwiseProgram p{2,
                           {{OpKind::mul, {0, 1}},
                            {.op = OpKind::leaky_relu, .operands = {2}, .alpha = 0.3125},
                            {OpKind::add, {3, 0}}}};
  const std::vector<Tensor> inputs = {random_tensor(DType::f32, {2, 16, 8, 8}, 41, -2, 2),
                                      random_tensor(DType::f32, {16, 1, 1}, 42, -1, 1)};
  const auto sources = [] {
    std::set<std::string> found;
    for (const auto& e :
         std::filesystem::directory_iterator(std::filesystem::temp_directory_path()))
      if (e.path().filename().string().rfind("fusebox_generated_", 0) == 0)
        found.insert(e.path().string());
    return found;
  };
  const std::set<std::string> before = sources();
  ASSERT_EQ(setenv("FUSEBOX_TEST_NVRTC_FAILURE", "1", 1), 0);
  ::testing::internal::CaptureStderr();
  expect_matches_cpu(p, inputs);
  expect_matches_cpu(p, inputs);  // once refused, straight to the unfused ops
  const std::string warned = ::testing::internal::GetCapturedStderr();
  unsetenv("FUSEBOX_TEST_NVRTC_FAILURE");
  EXPECT_NE(warned.find("did not compile"), std::string::npos) << warned;
  EXPECT_NE(warned.find("runs unfused"), std::string::npos) << warned;
  EXPECT_EQ(warned.find("did not compile", warned.find("did not compile") + 1), std::string::npos)
      << "warned twice: " << warned;
  std::set<std::string> added;
  for (const std::string& s : sources())
    if (!before.count(s)) added.insert(s);
  ASSERT_EQ(added.size(), 1u);
  std::ifstream source(*added.begin());
  const std::string text((std::istreambuf_iterator<char>(source)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("0x1.4p-2"), std::string::npos);  // 0.3125, as the source spells it
  std::filesystem::remove(*added.begin());
}

TEST_F(FusedPointwiseTest, PerChannelChainOnEveryDtype) {
  // [2,16,8,8]: 64 % W == 0, the vectorised step (per-channel inputs uniform);
  // [2,3,5,7]: the general path; [3,16,8,9]: the vectorised step of the 4-byte and 8-byte
  // dtypes only; [1,8,1,1]: fewer elements than a step.
  const Shape shapes[][2] = {{{2, 16, 8, 8}, {16, 1, 1}},
                             {{2, 3, 5, 7}, {3, 1, 1}},
                             {{3, 16, 8, 9}, {16, 1, 1}},
                             {{1, 8, 1, 1}, {8, 1, 1}},
                             {{4099}, {}}};
  uint64_t seed = 10;
  for (DType t : kFloatTypes) {
    for (const auto& [x, bcast] : shapes) {
      for (bool tanh : {false, true}) {
        SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(x), " tanh ", tanh));
        expect_matches_cpu(bench_like_program(tanh), bench_like_inputs(t, x, bcast, seed += 7));
      }
    }
  }
}

TEST_F(FusedPointwiseTest, RowBroadcastAlongTheInnermostDim) {
  // Channels innermost (as a channels-last activation is viewed): the per-channel inputs are
  // contiguous runs of 16 at offset 0, read as vectors.
  for (DType t : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    expect_matches_cpu(bench_like_program(true), bench_like_inputs(t, {2, 4, 4, 16}, {16}, 3));
    expect_matches_cpu(bench_like_program(false),
                       bench_like_inputs(t, {2, 4, 4, 16}, {4, 1, 16}, 4));
  }
}

TEST_F(FusedPointwiseTest, StridedAndMisalignedViews) {
  OpHarness h;
  const PointwiseProgram p = bench_like_program(true);
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor base = random_tensor(t, {2 * 6 * 5 + 1}, 21, -2, 2);
    std::vector<Tensor> in = bench_like_inputs(t, {6, 5}, {5}, 22);
    // A transposed view ([6,5] over a [5,6] buffer), then one starting at element 1.
    for (const auto& [strides, offset] :
         {std::pair<Shape, int64_t>{{1, 6}, 0}, std::pair<Shape, int64_t>{{5, 1}, 1}}) {
      in[0] = gather(base, {6, 5}, strides, offset);
      const std::vector<Tensor> want = run_op(OpKind::fused_pointwise, p, in);
      const BuiltNode built = build_node(OpKind::fused_pointwise, p, in);
      const DeviceTensor x = h.view(base, {6, 5}, strides, offset);
      std::vector<DeviceTensor> rest;
      for (size_t k = 1; k < in.size(); ++k) rest.push_back(h.upload(in[k]));
      const std::vector<Tensor> got =
          h.run_device(fused_pointwise, built, {&x, &rest[0], &rest[1], &rest[2], &rest[3]});
      const Tolerance tol = chain_tolerance(t);
      EXPECT_TRUE(all_close(got[0], want[0], tol.rtol, tol.atol)) << "offset " << offset;
    }
  }
}

TEST_F(FusedPointwiseTest, RandomProgramsMatchCpu) {
  ChainOptions o;
  o.well_conditioned = true;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE(cat("seed ", seed));
    o.max_extent = seed % 2 ? 6 : 40;
    const RandomChain c = random_chain(seed, o);
    expect_matches_cpu(c.program, c.inputs, 2);
  }
}

TEST_F(FusedPointwiseTest, MatchesTheUnfusedKernels) {
  ChainOptions o;
  o.well_conditioned = true;
  o.max_extent = 24;
  for (uint64_t seed = 100; seed < 140; ++seed) {
    SCOPED_TRACE(cat("seed ", seed));
    const RandomChain c = random_chain(seed, o);
    const Tensor unfused =
        run_graph(fusebox::testing::unfused_graph(c), c.feeds(), {.device = fusebox::Device::cuda})
            .at("y");
    const Tensor fused =
        run_graph(fusebox::testing::fused_graph(c), c.feeds(), {.device = fusebox::Device::cuda})
            .at("y");
    const Tolerance tol = chain_tolerance(fused.dtype());
    EXPECT_TRUE(all_close(fused, unfused, tol.rtol, tol.atol)) << pointwise_program_text(c.program);
  }
}

TEST_F(FusedPointwiseTest, ExecutableRecordsItAndReusesTheKernel) {
  ChainOptions o;
  o.well_conditioned = true;
  const RandomChain c = random_chain(7, o);
  const Graph g = fusebox::testing::fused_graph(c);
  const NamedTensors want = run_graph(g, c.feeds());
  auto first = Executable::compile(g, {.device = fusebox::Device::cuda});
  const GeneratedKernelStats before = generated_kernel_stats();
  auto second =
      Executable::compile(g, {.device = fusebox::Device::cuda});  // the same program again
  const GeneratedKernelStats after = generated_kernel_stats();
  EXPECT_EQ(after.compiles, before.compiles);
  EXPECT_EQ(after.disk_hits, before.disk_hits);
  EXPECT_GT(after.memory_hits, before.memory_hits);
  const Tolerance tol = chain_tolerance(want.at("y").dtype());
  for (int run = 0; run < 3; ++run) {  // replays of the recorded step
    EXPECT_TRUE(all_close(first->run(c.feeds()).at("y"), want.at("y"), tol.rtol, tol.atol));
    EXPECT_TRUE(all_close(second->run(c.feeds()).at("y"), want.at("y"), tol.rtol, tol.atol));
  }
}

TEST_F(FusedPointwiseTest, DirectLaunches) {
  Device& device = Device::get(0);
  CachingAllocator& allocator = CachingAllocator::for_device(0);
  CommandEncoder::Options options = CommandEncoder::Options::from_env();
  options.use_graphs = false;
  CommandEncoder encoder(device, options, &allocator);
  Context ctx{device, encoder, allocator};
  const std::vector<Tensor> in = bench_like_inputs(DType::bf16, {2, 16, 4, 4}, {16, 1, 1}, 31);
  const PointwiseProgram p = bench_like_program(false);
  const BuiltNode built = build_node(OpKind::fused_pointwise, p, in);
  std::vector<DeviceTensor> device_in;
  std::vector<const DeviceTensor*> pointers;
  for (const Tensor& t : in) {
    device_in.push_back(DeviceTensor::empty(allocator, t.dtype(), t.shape()));
    encoder.copy_to_device(device_in.back().range(), t.raw());
  }
  for (const DeviceTensor& d : device_in) pointers.push_back(&d);
  std::vector<DeviceTensor> out = {
      DeviceTensor::empty(allocator, built.outputs[0].dtype, built.outputs[0].shape)};
  fused_pointwise(ctx, built.node, pointers, out);
  Tensor got = Tensor::empty(out[0].dtype, out[0].shape);
  encoder.copy_to_host(got.raw(), out[0].range());
  EXPECT_GE(encoder.stats().direct_launches, 1u);
  const Tensor want = run_op(OpKind::fused_pointwise, p, in)[0];
  const Tolerance tol = chain_tolerance(DType::bf16);
  EXPECT_TRUE(all_close(got, want, tol.rtol, tol.atol));
}

TEST_F(FusedPointwiseTest, FreshDiskCacheGetsTheImage) {
  fusebox::testing::TempDir dir;
  fusebox::testing::ScopedEnv env("FUSEBOX_CACHE_DIR", dir.str());
  // A program no other test compiles (its alpha), so the memory cache does not have it.
  const PointwiseProgram p{
      1, {{.op = OpKind::leaky_relu, .operands = {0}, .alpha = 0.123456}, {OpKind::exp, {1}}}};
  const GeneratedKernelStats before = generated_kernel_stats();
  expect_matches_cpu(p, {random_tensor(DType::f32, {100}, 41)});
  EXPECT_EQ(generated_kernel_stats().compiles, before.compiles + 1);
  const std::filesystem::path nvrtc = dir.path() / "nvrtc";
  size_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(nvrtc))
    files += entry.is_regular_file() && entry.path().extension() == ".plan";
  EXPECT_EQ(files, 1u);
}

}  // namespace
}  // namespace fusebox::cuda::testing
