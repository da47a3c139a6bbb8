// The three convolution ops on the GPU against the CPU reference, with each path forced
// (FUSEBOX_CONV_BACKEND=cudnn, then own): 330 randomized configurations over 1-D/2-D/3-D,
// f32/f16/bf16, groups (incl. depthwise), dilation, stride, asymmetric pads, odd channel
// counts, batch 1 to 3, NCHW-contiguous and channels-last tensors, with and without bias.
// Outputs are poisoned first. A configuration cuDNN refuses under `cudnn` must fail with an
// Error naming the node and the backend setting; refusals are counted, printed, and must
// stay a minority. Tolerances: conv_test_util.h (TF32 for f32 on cuDNN by default).
#include <map>

#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

class ConvCudnnTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

// A random configuration; rng decides every attribute.
ConvConfig random_config(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto one_of = [&](std::initializer_list<int64_t> values) {
    return *(values.begin() + pick(0, int64_t(values.size()) - 1));
  };
  ConvConfig c;
  const OpKind ops[] = {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter};
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  c.op = ops[pick(0, 2)];
  c.dtype = types[pick(0, 2)];
  const int64_t r = pick(0, 3);
  const int rank = r == 0 ? 1 : r == 3 ? 3 : 2;
  const int64_t grouping = pick(0, 3);  // 0, 1: dense; 2: grouped; 3: depthwise
  if (grouping < 2) {
    c.groups = 1;
    c.in_channels = one_of({1, 3, 4, 7, 8, 16});
    c.out_channels = one_of({1, 3, 4, 7, 8, 16});
  } else if (grouping == 2) {
    c.groups = pick(2, 3);
    c.in_channels = c.groups * one_of({1, 2, 3});
    c.out_channels = c.groups * one_of({1, 2, 3});
  } else {
    c.in_channels = one_of({3, 4, 7, 8});
    c.groups = c.in_channels;
    c.out_channels = c.in_channels * one_of({1, 2});
  }
  c.batch = one_of({1, 1, 2, 3});
  c.bias = c.op != OpKind::conv_backward_filter && pick(0, 1) == 1;
  c.channels_last = pick(0, 1) == 1;
  for (;;) {
    c.spatial.clear(), c.filter.clear(), c.strides.clear(), c.dilations.clear();
    c.pads_begin.clear(), c.pads_end.clear();
    bool ok = true;
    for (int d = 0; d < rank; ++d) {
      const int64_t in = rank == 1 ? pick(5, 40) : rank == 2 ? pick(4, 14) : pick(3, 7);
      const int64_t filter = rank == 2 && in >= 7 && pick(0, 5) == 0 ? 5 : pick(1, 3);
      const int64_t dilation = filter > 1 && pick(0, 3) == 0 ? 2 : 1;
      const int64_t reach = dilation * (filter - 1);  // pads stay below the window's extent
      c.spatial.push_back(in);
      c.filter.push_back(filter);
      c.strides.push_back(pick(0, 2) == 0 ? pick(2, 3) : 1);
      c.dilations.push_back(dilation);
      c.pads_begin.push_back(std::min<int64_t>(pick(0, 2), reach));
      c.pads_end.push_back(std::min<int64_t>(pick(0, 2), reach));
      ok = ok && in + c.pads_begin.back() + c.pads_end.back() >= reach + 1;
    }
    if (ok) break;
  }
  return c;
}

// A configuration the subsampled-1x1 lowering applies to (kernels/conv/problem.h).
bool is_subsampled_1x1(const ConvConfig& c) {
  if (c.op != OpKind::conv || c.groups != 1) return false;
  bool strided = false;
  for (size_t d = 0; d < c.filter.size(); ++d) {
    if (c.filter[d] != 1 || c.pads_begin[d] != 0 || c.pads_end[d] != 0) return false;
    strided = strided || c.strides[d] > 1;
  }
  return strided;
}

// Whether the last recorded convolution ran on cuDNN through the strided view of x.
bool took_subsampled_view() {
  const std::vector<ConvDecision> d = conv_decisions();
  return !d.empty() && d.back().path.rfind("cudnn", 0) == 0 &&
         d.back().plan.find("subsampled_1x1") != std::string::npos;
}

TEST_F(ConvCudnnTest, RandomizedConfigurationsMatchCpuOnBothPaths) {
  OpHarness h;
  TempDir cache("conv_matrix");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", std::nullopt);
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", std::nullopt);
  std::mt19937_64 rng(20261122);
  constexpr int kConfigs = 330;
  int cudnn_ran = 0, cudnn_refused = 0, subsampled = 0, subsampled_view = 0;
  std::map<std::string, int> refusals_by_kind;
  std::vector<std::string> refusal_examples;
  for (int i = 0; i < kConfigs; ++i) {
    const ConvConfig c = random_config(rng);
    SCOPED_TRACE(cat("config ", i, ": ", c.describe()));
    const std::vector<Tensor> in = conv_inputs(c, 1000 + 10 * uint64_t(i));
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    {
      ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn");
      try {
        const Tensor got = run_conv_on_gpu(h, c, in);
        ++cudnn_ran;
        const double err = relative_l2_error(got, want);
        EXPECT_LE(err, conv_l2_tolerance(c.dtype, true)) << "cudnn path";
      } catch (const Error& e) {
        ++cudnn_refused;
        const std::string message = e.what();
        EXPECT_NE(message.find("FUSEBOX_CONV_BACKEND=cudnn"), std::string::npos) << message;
        EXPECT_NE(message.find("'node'"), std::string::npos) << message;  // names the node
        refusals_by_kind[cat(op_name(c.op), " ", c.rank(), "d ", dtype_name(c.dtype))]++;
        if (refusal_examples.size() < 8) refusal_examples.push_back(c.describe() + ": " + message);
      }
    }
    {
      ScopedEnv backend("FUSEBOX_CONV_BACKEND", "own");
      const Tensor got = run_conv_on_gpu(h, c, in);
      // f32: the implicit GEMM computes in TF32 (FUSEBOX_ALLOW_TF32 unset).
      EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, true)) << "own path";
    }
    if (is_subsampled_1x1(c)) {
      // A strided 1x1 fprop: again through the strided view of x (or the standard
      // lowering where cuDNN refuses the view).
      ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn"), view("FUSEBOX_CONV_SUBSAMPLE_1X1", "1");
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(h, c, in);
      ++subsampled;
      subsampled_view += took_subsampled_view();
      EXPECT_LE(relative_l2_error(got, want), conv_l2_tolerance(c.dtype, true))
          << "FUSEBOX_CONV_SUBSAMPLE_1X1=1";
    }
  }
  std::printf(
      "[conv matrix] %d strided 1x1 fprops under FUSEBOX_CONV_SUBSAMPLE_1X1=1: %d "
      "through the strided view\n",
      subsampled, subsampled_view);
  std::printf(
      "[conv matrix] %d configurations: cuDNN ran %d, refused %d (under "
      "FUSEBOX_CONV_BACKEND=cudnn); the project's kernels (own) ran all %d\n",
      kConfigs, cudnn_ran, cudnn_refused, kConfigs);
  for (const auto& [kind, count] : refusals_by_kind)
    std::printf("[conv matrix]   refused %-28s %d\n", kind.c_str(), count);
  for (const std::string& example : refusal_examples)
    std::printf("[conv matrix]   e.g. %s\n", example.c_str());
  const ConvPlanStats s = conv_plan_stats();
  std::printf(
      "[conv matrix] plan cache: %llu problems, %llu heuristics queries, %llu native "
      "graph nodes, %llu captured calls\n",
      (unsigned long long)s.problems, (unsigned long long)s.heuristics_queries,
      (unsigned long long)s.native_graph_nodes, (unsigned long long)s.captured_calls);
  EXPECT_LT(cudnn_refused, kConfigs / 2) << "cuDNN refused most configurations";
}

// TF32 off: f32 convolutions on cuDNN are as exact as f32 arithmetic.
TEST_F(ConvCudnnTest, Tf32OffGivesF32Accuracy) {
  OpHarness h;
  TempDir cache("conv_tf32");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn");
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", "0");
  for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
    for (bool channels_last : {false, true}) {
      ConvConfig c;
      c.op = op;
      c.batch = 2, c.in_channels = 32, c.out_channels = 64;
      c.spatial = {14, 14}, c.filter = {3, 3};
      c.strides = {1, 1}, c.dilations = {1, 1}, c.pads_begin = {1, 1}, c.pads_end = {1, 1};
      c.channels_last = channels_last;
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 7);
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      EXPECT_LE(relative_l2_error(run_conv_on_gpu(h, c, in), want), 1e-5);
    }
  }
}

// FUSEBOX_DETERMINISTIC=1: no NONDETERMINISTIC engine, so repeated backward passes agree
// bit for bit (wgrad and dgrad are where split reductions with atomics live).
TEST_F(ConvCudnnTest, DeterministicModeRepeatsBitwise) {
  OpHarness h;
  TempDir cache("conv_det");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn");
  ScopedEnv deterministic("FUSEBOX_DETERMINISTIC", "1");
  for (OpKind op : {OpKind::conv_backward_filter, OpKind::conv_backward_data}) {
    ConvConfig c;
    c.op = op;
    c.dtype = DType::f16;
    c.batch = 16, c.in_channels = 64, c.out_channels = 64;
    c.spatial = {28, 28}, c.filter = {3, 3};
    c.strides = {1, 1}, c.dilations = {1, 1}, c.pads_begin = {1, 1}, c.pads_end = {1, 1};
    c.channels_last = true;
    SCOPED_TRACE(c.describe());
    const std::vector<Tensor> in = conv_inputs(c, 5);
    const Tensor first = run_conv_on_gpu(h, c, in);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(all_close(run_conv_on_gpu(h, c, in), first, 0, 0));
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    EXPECT_LE(relative_l2_error(first, want), conv_l2_tolerance(c.dtype, true));
  }
}

// The ResNet-50 shapes the benchmark times, small batch: cuDNN must take every one of them
// (no fallback), in bf16 channels-last, all three ops.
TEST_F(ConvCudnnTest, ResNetShapesRunOnCudnn) {
  OpHarness h;
  TempDir cache("conv_resnet");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn");
  struct Shape2 {
    int64_t c, k, hw, r, s, pad;
  };
  const Shape2 shapes[] = {{3, 64, 56, 7, 2, 3},
                           {64, 64, 14, 3, 1, 1},
                           {64, 256, 14, 1, 1, 0},
                           {256, 128, 14, 1, 2, 0},
                           {512, 512, 7, 3, 1, 1}};
  for (const Shape2& s : shapes) {
    for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter}) {
      ConvConfig c;
      c.op = op;
      c.dtype = DType::bf16;
      c.batch = 2, c.in_channels = s.c, c.out_channels = s.k;
      c.spatial = {s.hw, s.hw}, c.filter = {s.r, s.r};
      c.strides = {s.s, s.s}, c.dilations = {1, 1}, c.pads_begin = {s.pad, s.pad},
      c.pads_end = {s.pad, s.pad};
      c.channels_last = true;
      c.bias = op == OpKind::conv;
      SCOPED_TRACE(c.describe());
      const std::vector<Tensor> in = conv_inputs(c, 11);
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      EXPECT_LE(relative_l2_error(run_conv_on_gpu(h, c, in), want), 2e-2);
    }
  }
}

// Configurations that failed on the H100 (2026-11-22 run 1), each run in several ways:
//   after:   on a fresh graph encoder, right after a convolution whose recording has the
//            same shape of graph (a poison memset of the same byte count, then one cuDNN
//            child graph with one kernel): the encoder's graph cache may then update the
//            earlier executable in place instead of instantiating a new one;
//   fresh:   alone on a fresh graph encoder (nothing to update: instantiated);
//   capture: the same with FUSEBOX_CUDNN_NATIVE_GRAPH=0 (stream capture, never cuDNN's
//            native graph);
//   direct:  on an encoder launching without graphs.
// The printed lines name the plan and each result's distance from the CPU's, so a failure
// points at cuDNN's plan (all modes fail), the graph cache's update (only `after` fails)
// or cuDNN's native graph (only `fresh`).
TEST_F(ConvCudnnTest, KnownHardConfigurationsInEveryRecordingMode) {
  OpHarness h;
  TempDir cache("conv_hard");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  struct Case {
    ConvConfig config, before;  // before: a convolution with the same output byte count
  };
  std::vector<Case> cases;
  {
    ConvConfig c;  // ResNet downsample dgrad: 1x1 stride 2, channels-last
    c.op = OpKind::conv_backward_data;
    c.dtype = DType::bf16;
    c.batch = 2, c.in_channels = 256, c.out_channels = 128;
    c.spatial = {14, 14}, c.filter = {1, 1};
    c.strides = {2, 2}, c.dilations = {1, 1}, c.pads_begin = {0, 0}, c.pads_end = {0, 0};
    c.channels_last = true;
    ConvConfig b;  // fprop 64 -> 256 on 14x14: y is [2, 256, 14, 14] bf16, as dx above
    b.op = OpKind::conv;
    b.dtype = DType::bf16;
    b.batch = 2, b.in_channels = 64, b.out_channels = 256;
    b.spatial = {14, 14}, b.filter = {1, 1};
    b.strides = {1, 1}, b.dilations = {1, 1}, b.pads_begin = {0, 0}, b.pads_end = {0, 0};
    b.channels_last = true;
    b.bias = true;
    cases.push_back({c, b});
    c.channels_last = b.channels_last = false;
    cases.push_back({c, b});
  }
  {
    // Config 191 of the matrix: grouped 3-D wgrad, NCHW, asymmetric pad; wrong on engines
    // eng1 and eng20 (barred_engines), right on the others.
    ConvConfig c;
    c.op = OpKind::conv_backward_filter;
    c.dtype = DType::bf16;
    c.batch = 3, c.in_channels = 9, c.out_channels = 6, c.groups = 3;
    c.spatial = {3, 7, 4}, c.filter = {3, 1, 3};
    c.strides = {1, 1, 1}, c.dilations = {1, 1, 1}, c.pads_begin = {0, 0, 2},
    c.pads_end = {0, 0, 0};
    ConvConfig b = c;  // dw [6, 3, 3, 1, 3] bf16: the same bytes from another wgrad
    b.spatial = {5, 7, 6}, b.pads_begin = {1, 0, 1}, b.pads_end = {1, 0, 1};
    cases.push_back({c, b});
  }
  Device& device = Device::get(0);
  CachingAllocator& memory = CachingAllocator::for_device(0);
  CommandEncoder::Options graphs;
  CommandEncoder::Options direct_options;
  direct_options.use_graphs = false;
  for (const Case& k : cases) {
    const ConvConfig& c = k.config;
    ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn");
    const std::vector<Tensor> in = conv_inputs(c, 21);
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    for (const char* mode : {"after", "fresh", "capture", "direct"}) {
      SCOPED_TRACE(cat(c.describe(), " [", mode, "]"));
      const bool direct = std::string(mode) == "direct";
      ScopedEnv native("FUSEBOX_CUDNN_NATIVE_GRAPH", std::string(mode) == "capture" ? "0" : "1");
      CommandEncoder encoder(device, direct ? direct_options : graphs, &memory);
      Context ctx{device, encoder, memory};
      if (std::string(mode) == "after") {
        const std::vector<Tensor> before_in = conv_inputs(k.before, 22);
        const Tensor before_want = run_op(k.before.op, k.before.node_attrs(), before_in)[0];
        EXPECT_LE(relative_l2_error(run_conv_on_gpu(ctx, k.before, before_in), before_want),
                  conv_l2_tolerance(k.before.dtype, true))
            << "the convolution run before";
      }
      clear_conv_decisions();
      const Tensor got = run_conv_on_gpu(ctx, c, in);
      const double err = relative_l2_error(got, want);
      size_t non_finite = 0;
      for (double v : got.to_doubles()) non_finite += !std::isfinite(v);
      const std::vector<ConvDecision> d = conv_decisions();
      const CommandEncoder::Stats st = encoder.stats();
      std::printf(
          "[conv hard] %-7s %s: plan %s, rel. L2 error %.3g, %zu of %lld non-finite; "
          "graph cache: %llu instantiations, %llu updates\n",
          mode, c.describe().c_str(), d.empty() ? "?" : d.back().plan.c_str(), err, non_finite,
          (long long)got.numel(), (unsigned long long)st.graph_cache.instantiations,
          (unsigned long long)st.graph_cache.updates);
      EXPECT_LE(err, conv_l2_tolerance(c.dtype, true));
      ASSERT_FALSE(d.empty());
      EXPECT_NE(d.back().plan, "eng1");
      EXPECT_NE(d.back().plan, "eng20");
    }
  }
}

// The subsampled-1x1 lowering (FUSEBOX_CONV_SUBSAMPLE_1X1=1): 1x1 stride 2 and 3 fprop,
// 1-D to 3-D, f32/f16/bf16, NCHW and channels-last, with and without bias, against the
// CPU. Where cuDNN refuses the strided view the standard lowering runs (also checked);
// the count that took the view is printed. Then `auto` under autotuning: both lowerings
// tuned, the faster kept, results right either way.
TEST_F(ConvCudnnTest, SubsampledOneByOneMatchesCpu) {
  OpHarness h;
  TempDir cache("conv_subsample");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn");
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", "0");
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", std::nullopt);
  int runs = 0, views = 0;
  uint64_t seed = 3000;
  std::vector<ConvConfig> configs;
  for (int rank = 1; rank <= 3; ++rank) {
    for (int64_t stride : {2, 3}) {
      for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        for (bool channels_last : {false, true}) {
          ConvConfig c;
          c.op = OpKind::conv;
          c.dtype = dtype;
          c.batch = 2, c.in_channels = 16, c.out_channels = 24;
          const Shape extents = rank == 1 ? Shape{23} : rank == 2 ? Shape{14, 11} : Shape{7, 6, 9};
          c.spatial = extents;
          c.filter.assign(size_t(rank), 1);
          c.strides.assign(size_t(rank), stride);
          if (rank > 1) c.strides[0] = 2;  // mixed strides where there are several dims
          c.dilations.assign(size_t(rank), 1);
          c.pads_begin.assign(size_t(rank), 0);
          c.pads_end.assign(size_t(rank), 0);
          c.channels_last = channels_last;
          c.bias = dtype != DType::f32;
          configs.push_back(c);
        }
      }
    }
  }
  {
    ScopedEnv view("FUSEBOX_CONV_SUBSAMPLE_1X1", "1");
    for (const ConvConfig& c : configs) {
      SCOPED_TRACE(c.describe());
      ASSERT_TRUE(is_subsampled_1x1(c));
      const std::vector<Tensor> in = conv_inputs(c, seed += 10);
      const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
      clear_conv_decisions();
      const double err = relative_l2_error(run_conv_on_gpu(h, c, in), want);
      const bool took = took_subsampled_view();
      ++runs;
      views += took;
      const std::vector<ConvDecision> d = conv_decisions();
      std::printf("[conv subsample] %-70s %-9s plan %s, rel. L2 error %.3g\n", c.describe().c_str(),
                  took ? "view" : "standard", d.empty() ? "?" : d.back().plan.c_str(), err);
      EXPECT_LE(err, conv_l2_tolerance(c.dtype, true));
    }
  }
  std::printf("[conv subsample] %d configurations, %d through the strided view of x\n", runs,
              views);
  EXPECT_EQ(runs, int(configs.size()));
  // auto + autotuning: both lowerings tuned for a few of them; right results either way.
  ScopedEnv view("FUSEBOX_CONV_SUBSAMPLE_1X1", "auto");
  ScopedEnv tune("FUSEBOX_AUTOTUNE", "1");
  for (size_t i = 0; i < configs.size(); i += 7) {
    const ConvConfig& c = configs[i];
    SCOPED_TRACE(c.describe() + " [auto, autotuned]");
    const std::vector<Tensor> in = conv_inputs(c, seed += 10);
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    EXPECT_LE(relative_l2_error(run_conv_on_gpu(h, c, in), want), conv_l2_tolerance(c.dtype, true));
  }
}

TEST_F(ConvCudnnTest, ForcedCudnnOnF64IsAClearError) {
  OpHarness h;
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn");
  ConvConfig c;
  c.dtype = DType::f64;
  c.in_channels = 3, c.out_channels = 4;
  c.spatial = {6, 6}, c.filter = {3, 3};
  c.strides = {1, 1}, c.dilations = {1, 1}, c.pads_begin = {0, 0}, c.pads_end = {0, 0};
  const std::vector<Tensor> in = conv_inputs(c, 3);
  try {
    run_conv_on_gpu(h, c, in);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("conv 'node'"), std::string::npos) << message;
    EXPECT_NE(message.find("f64"), std::string::npos) << message;
  }
  // auto: the direct engine takes it, and the decision record says why.
  ScopedEnv automatic("FUSEBOX_CONV_BACKEND", "auto");
  const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
  EXPECT_LE(relative_l2_error(run_conv_on_gpu(h, c, in), want), 1e-12);
  bool found = false;
  for (const ConvDecision& d : conv_decisions())
    found = found || (d.path.rfind("direct", 0) == 0 && d.reason.find("f64") != std::string::npos);
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace fusebox::cuda::testing
