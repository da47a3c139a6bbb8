// The statistics GEMM (kernels/conv/engines/cutlass_bn/stats_gemm.h) on an H100/H200: y against
// a host product of the same bf16 operands, and each tile's per-channel sum and sum of squares
// against the host's sums of the y the kernel stored (the partials' layout, their ragged last
// tile and their padding columns included). Outputs are poisoned first, so a slot the kernel
// does not write is a NaN the test sees.
#include <cmath>

#include "backends/cuda/kernels/conv/engines.h"
#include "backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm.h"
#include "backends/cuda/kernels/conv/report.h"
#include "backends/cuda/runtime/error_flags.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

TEST(CutlassBn, StatsGemmStoresYAndEveryTilesPerChannelSums) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the CUTLASS kernels are sm_90a code (compute capability 9.0)";
  struct Case {
    int64_t m, n, k;
  };
  // 1000 pixels: 7 full tiles and one of 104; n 96 pads to 128 columns of partials.
  const Case cases[] = {{1000, 96, 64}, {1000, 192, 64}, {4133, 256, 128}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(cat("m ", c.m, " n ", c.n, " k ", c.k));
    const Tensor x = fusebox::testing::random_tensor(DType::bf16, {c.m, c.k}, seed++),
                 w = fusebox::testing::random_tensor(DType::bf16, {c.n, c.k}, seed++);
    const DeviceTensor dx = h.upload(x), dw = h.upload(w);
    const int64_t rows = cutlass_bn::stats_partial_rows(c.m);
    const int64_t cols = cutlass_bn::stats_partial_cols(c.n);
    DeviceTensor y = h.poisoned({DType::bf16, {c.m, c.n}});
    DeviceTensor sums = h.poisoned({DType::f32, {rows, cols}});
    DeviceTensor squares = h.poisoned({DType::f32, {rows, cols}});
    const cutlass_bn::StatsGemmCall call{
        c.m, c.n, c.k, dx.data(), dw.data(), y.data(), sums.as<float>(), squares.as<float>()};
    const std::optional<std::string> refused = cutlass_bn::record_stats_gemm(
        h.ctx(), call, {dx.range(), dw.range()}, {y.range(), sums.range(), squares.range()});
    ASSERT_FALSE(refused) << *refused;
    h.encoder().synchronize();
    check_error_flags(h.ctx());
    const Tensor got_y = h.download(y), got_sums = h.download(sums),
                 got_squares = h.download(squares);

    // y: the product of the bf16 operands, rounded to bf16 (f32 accumulation order differs).
    const BFloat16* xs = x.data<BFloat16>();
    const BFloat16* ws = w.data<BFloat16>();
    const BFloat16* ys = got_y.data<BFloat16>();
    int64_t bad = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double want = 0;
        for (int64_t q = 0; q < c.k; ++q)
          want += double(float(xs[i * c.k + q])) * double(float(ws[j * c.k + q]));
        const double v = float(ys[i * c.n + j]);
        bad += !(std::fabs(v - want) <= 1e-2 * std::fabs(want) + 1e-2);
      }
    EXPECT_EQ(bad, 0) << "y elements off the host product";

    // Partials: tile r, channel j: the sums over the tile's pixels of the y the kernel stored.
    const float* s = got_sums.data<float>();
    const float* q = got_squares.data<float>();
    int64_t bad_sums = 0, bad_padding = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        if (j >= c.n) {
          bad_padding += !(s[r * cols + j] == 0.0f && q[r * cols + j] == 0.0f);
          continue;
        }
        double sum = 0, sum_abs = 0, square = 0;
        for (int64_t i = r * cutlass_bn::kStatsTileM;
             i < std::min(c.m, (r + 1) * cutlass_bn::kStatsTileM); ++i) {
          const double v = float(ys[i * c.n + j]);
          sum += v;
          sum_abs += std::fabs(v);
          square += v * v;
        }
        bad_sums += !(std::fabs(s[r * cols + j] - sum) <= 1e-5 * sum_abs + 1e-6);
        bad_sums += !(std::fabs(q[r * cols + j] - square) <= 1e-5 * square + 1e-6);
      }
    EXPECT_EQ(bad_sums, 0) << "partial sums off the stored y's";
    EXPECT_EQ(bad_padding, 0) << "padding columns not zero";
  }
}

// The chain item 5 builds: the statistics GEMM's partials merged into the channel triples
// (channel_moments_from_tile_sums) and given to the training batch norm (batch_stats, input 6:
// its own pass over x skipped), against the batch norm computing its statistics from the same
// y, and against channel_moments of y (the fallback of a conv the GEMM does not take): y, the
// saved and the running statistics agree within the rounding of f32 sums (the partials)
// against the norm's Welford chunks.
TEST(CutlassBn, TileSumsGiveTheBatchNormItsStatistics) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the CUTLASS kernels are sm_90a code (compute capability 9.0)";
  const int64_t batch = 2, size = 20, c = 128, k = 64, m = batch * size * size;  // 6.25 tiles
  const DeviceTensor dx = h.upload(fusebox::testing::random_tensor(DType::bf16, {m, k}, 11)),
                     dw = h.upload(fusebox::testing::random_tensor(DType::bf16, {c, k}, 12));
  const int64_t rows = cutlass_bn::stats_partial_rows(m);
  const int64_t cols = cutlass_bn::stats_partial_cols(c);
  DeviceTensor y = h.poisoned({DType::bf16, {m, c}});
  DeviceTensor sums = h.poisoned({DType::f32, {rows, cols}});
  DeviceTensor squares = h.poisoned({DType::f32, {rows, cols}});
  const cutlass_bn::StatsGemmCall call{
      m, c, k, dx.data(), dw.data(), y.data(), sums.as<float>(), squares.as<float>()};
  ASSERT_FALSE(cutlass_bn::record_stats_gemm(h.ctx(), call, {dx.range(), dw.range()},
                                             {y.range(), sums.range(), squares.range()}));
  // y as the norm's x: [batch, c, size, size] channels-last over the GEMM's [m][c].
  const DeviceTensor x = DeviceTensor::over(y.range(), DType::bf16, {batch, c, size, size},
                                            MemoryFormat::channels_last);
  const Tensor scale = fusebox::testing::random_tensor(DType::f32, {c}, 13, 0.5, 1.5),
               bias = fusebox::testing::random_tensor(DType::f32, {c}, 14, -1, 1),
               mean = fusebox::testing::random_tensor(DType::f32, {c}, 15, -1, 1),
               var = fusebox::testing::random_tensor(DType::f32, {c}, 16, 0.5, 2);
  const BuiltNode built = build_node(
      OpKind::batch_norm, BatchNormAttrs{.epsilon = 1e-5, .momentum = 0.9, .training = true},
      {Tensor::empty(DType::bf16, {batch, c, size, size}), scale, bias, mean, var});
  const DeviceTensor ds = h.upload(scale), db = h.upload(bias), dm = h.upload(mean),
                     dv = h.upload(var);
  const std::vector<const DeviceTensor*> in = {&x, &ds, &db, &dm, &dv};
  auto outputs = [&] {
    std::vector<DeviceTensor> out;
    out.push_back(DeviceTensor::empty(h.ctx().allocator, DType::bf16, {batch, c, size, size},
                                      MemoryFormat::channels_last));
    h.encoder().memset(out.back().range(), 0xFF);
    for (size_t o = 1; o < built.outputs.size(); ++o) out.push_back(h.poisoned(built.outputs[o]));
    return out;
  };
  std::vector<DeviceTensor> own = outputs(), given = outputs(), from_pass = outputs();
  batch_norm(h.ctx(), built.node, in, own);
  const BatchNormTileSums tile_sums{sums.as<float>(),
                                    squares.as<float>(),
                                    {sums.range(), squares.range()},
                                    rows,
                                    cols,
                                    cutlass_bn::kStatsTileM,
                                    m};
  DeviceTensor moments = h.poisoned({DType::f64, {c, 3}});
  DeviceTensor pass_moments = h.poisoned({DType::f64, {c, 3}});
  channel_moments_from_tile_sums(h.ctx(), "test", tile_sums, c, moments);
  channel_moments(h.ctx(), "test", x, pass_moments);
  const BuiltNode given_node = build_node(
      OpKind::batch_norm, BatchNormAttrs{.epsilon = 1e-5, .momentum = 0.9, .training = true},
      {Tensor::empty(DType::bf16, {batch, c, size, size}), scale, bias, mean, var, Tensor(),
       Tensor::empty(DType::f64, {c, 3})});
  const std::vector<const DeviceTensor*> in_given = {&x, &ds, &db, &dm, &dv, nullptr, &moments},
                                         in_pass = {&x, &ds, &db, &dm, &dv, nullptr, &pass_moments};
  batch_norm(h.ctx(), given_node.node, in_given, given);
  batch_norm(h.ctx(), given_node.node, in_pass, from_pass);
  h.encoder().synchronize();
  check_error_flags(h.ctx());
  // The triples: the count exact, mean and M2 close to the norm's pass's.
  const Tensor got_moments = h.download(moments), want_moments = h.download(pass_moments);
  for (int64_t j = 0; j < c; ++j) {
    SCOPED_TRACE(cat("channel ", j));
    const double* g = got_moments.data<double>() + 3 * j;
    const double* w = want_moments.data<double>() + 3 * j;
    EXPECT_EQ(g[0], double(m));
    EXPECT_EQ(w[0], double(m));
    EXPECT_NEAR(g[1], w[1], 1e-5 * (1 + std::fabs(w[1])));
    EXPECT_NEAR(g[2], w[2], 1e-4 * (1 + std::fabs(w[2])));
  }
  // Every output's bytes in their order (y channels-last in both), as one flat tensor.
  auto flat = [&](const DeviceTensor& d) {
    return h.download(DeviceTensor::over(d.range(), d.dtype, {d.numel()}));
  };
  for (size_t o = 0; o < own.size(); ++o) {
    SCOPED_TRACE(cat("output ", o));
    const Tensor want = flat(own[o]);
    for (const std::vector<DeviceTensor>* other : {&given, &from_pass}) {
      const Tensor got = flat((*other)[o]);
      EXPECT_TRUE(
          fusebox::testing::all_close(got, want, o == 0 ? 1e-2 : 1e-4, o == 0 ? 1e-2 : 1e-5));
    }
  }
}

// A conv with channel_stats (ir/ops.h) as the executable records it: a 1x1 bf16 conv over
// channels-last tensors on the statistics GEMM, a 3x3 one on its engines followed by the
// norm's statistics pass. y within bf16 rounding of the CPU's; the triples those of the y the
// GPU stored (its own rounding), against the host's two-pass sums of that y.
TEST(CutlassBn, ConvWithChannelStatsTakesTheGemmOrTheStatisticsPass) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  const bool sm90 = h.ctx().device.properties().compute_capability() == 90;
  struct Case {
    int64_t r;                 // filter extent (pad r / 2)
    std::optional<bool> form;  // set_statistics_form_override: the GEMM, the pass, timed
    bool gemm;                 // expected on the statistics GEMM (compute capability 9.0)
  };
  struct Reset {
    ~Reset() { set_statistics_form_override(std::nullopt); }
  } reset;
  for (const Case& c : {Case{1, true, true}, Case{1, false, false}, Case{1, std::nullopt, false},
                        Case{3, true, false}}) {
    SCOPED_TRACE(cat(c.r, "x", c.r, c.form ? (*c.form ? ", GEMM forced" : ", pass forced") : ""));
    set_statistics_form_override(c.form);
    const int64_t n = 2, ci = 64, k = 128, size = 11;
    ConvAttrs a;
    a.channel_stats = true;
    a.pads_begin = a.pads_end = {c.r / 2, c.r / 2};
    const Tensor x = fusebox::testing::random_tensor(DType::bf16, {n, ci, size, size}, 21),
                 w = fusebox::testing::random_tensor(DType::bf16, {k, ci, c.r, c.r}, 22, -0.2, 0.2);
    const BuiltNode built = build_node(OpKind::conv, a, {x, w});
    ASSERT_EQ(built.outputs.size(), 2u);
    auto channels_last = [&](const Tensor& t) {
      DeviceTensor d =
          DeviceTensor::empty(h.ctx().allocator, t.dtype(), t.shape(), MemoryFormat::channels_last);
      copy_strided(h.ctx(), h.upload(t), d);
      return d;
    };
    const DeviceTensor dx = channels_last(x), dw = channels_last(w);
    std::vector<DeviceTensor> out;
    out.push_back(DeviceTensor::empty(h.ctx().allocator, DType::bf16, {n, k, size, size},
                                      MemoryFormat::channels_last));
    h.encoder().memset(out.back().range(), 0xFF);
    out.push_back(h.poisoned(built.outputs[1]));
    clear_conv_decisions();
    const std::vector<const DeviceTensor*> in = {&dx, &dw};
    conv_forward(h.ctx(), built.node, in, out);
    h.encoder().synchronize();
    check_error_flags(h.ctx());
    const std::vector<ConvDecision> decisions = conv_decisions();
    ASSERT_FALSE(decisions.empty());
    const ConvDecision& d = decisions.back();
    if (c.form) {
      EXPECT_EQ(d.path.rfind("cutlass_bn", 0) == 0, c.gemm && sm90) << d.path;
    } else if (sm90) {  // either form, the report saying which times chose it
      EXPECT_NE(d.reason.find("timed: statistics GEMM"), std::string::npos) << d.reason;
      EXPECT_EQ(decisions.size(), 1u) << "the timing's own recordings left decisions";
    }

    DeviceTensor y_nchw = DeviceTensor::empty(h.ctx().allocator, DType::bf16, out[0].shape);
    copy_strided(h.ctx(), out[0], y_nchw);
    h.encoder().synchronize();
    const Tensor y = h.download(y_nchw);
    const std::vector<Tensor> want = fusebox::testing::run_op(OpKind::conv, a, {x, w});
    EXPECT_TRUE(fusebox::testing::all_close(y, want[0], 2e-2, 2e-2));
    const Tensor got = h.download(out[1]);
    const BFloat16* ys = y.data<BFloat16>();
    const int64_t per = n * size * size;
    for (int64_t j = 0; j < k; ++j) {
      double sum = 0, sq = 0;
      for (int64_t b = 0; b < n; ++b)
        for (int64_t i = 0; i < size * size; ++i) sum += float(ys[(b * k + j) * size * size + i]);
      const double mean = sum / double(per);
      for (int64_t b = 0; b < n; ++b)
        for (int64_t i = 0; i < size * size; ++i) {
          const double d = float(ys[(b * k + j) * size * size + i]) - mean;
          sq += d * d;
        }
      const double* g = got.data<double>() + 3 * j;
      EXPECT_EQ(g[0], double(per)) << "channel " << j;
      EXPECT_NEAR(g[1], mean, 1e-5 * (1 + std::fabs(mean))) << "channel " << j;
      EXPECT_NEAR(g[2], sq, 1e-4 * (1 + sq)) << "channel " << j;
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
