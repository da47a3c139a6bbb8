// The statistics GEMM (kernels/conv/engines/cutlass_bn/stats_gemm.h) on an H100/H200: y against
// a host product of the same bf16 operands, and each tile's per-channel sum and sum of squares
// against the host's sums of the y the kernel stored (the partials' layout, their ragged last
// tile and their padding columns included). Outputs are poisoned first, so a slot the kernel
// does not write is a NaN the test sees.
#include <cmath>
#include <random>

#include "backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm.h"
#include "backends/cuda/runtime/error_flags.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

Tensor random_bf16(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t = Tensor::empty(DType::bf16, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<BFloat16>()[i] = BFloat16(u(rng));
  return t;
}

TEST(CutlassBn, StatsGemmStoresYAndEveryTilesPerChannelSums) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  if (h.ctx().device.properties().compute_capability() != 90)
    GTEST_SKIP() << "the CUTLASS kernels are sm_90a code (compute capability 9.0)";
  struct Case {
    int64_t m, n, k;
    bool wide;
  };
  // 1000 pixels: 7 full tiles and one of 104; n 192 pads to 256 on the wide tile.
  const Case cases[] = {{1000, 192, 64, true}, {1000, 192, 64, false}, {4133, 256, 128, true}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(cat("m ", c.m, " n ", c.n, " k ", c.k, c.wide ? " wide" : " narrow"));
    const Tensor x = random_bf16({c.m, c.k}, seed++), w = random_bf16({c.n, c.k}, seed++);
    const DeviceTensor dx = h.upload(x), dw = h.upload(w);
    const int64_t rows = cutlass_bn::stats_partial_rows(c.m);
    const int64_t cols = cutlass_bn::stats_partial_cols(c.n, c.wide);
    DeviceTensor y = h.poisoned({DType::bf16, {c.m, c.n}});
    DeviceTensor sums = h.poisoned({DType::f32, {rows, cols}});
    DeviceTensor squares = h.poisoned({DType::f32, {rows, cols}});
    const cutlass_bn::StatsGemmCall call{
        c.m,   c.n, c.k, dx.data(), dw.data(), y.data(), sums.as<float>(), squares.as<float>(),
        c.wide};
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

}  // namespace
}  // namespace fusebox::cuda::testing
