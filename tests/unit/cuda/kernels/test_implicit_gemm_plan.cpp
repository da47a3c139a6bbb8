// The implicit-GEMM convolutions without a GPU: FastDivmod against / and %, the refusals,
// the tile and split choices, and the three ops' index maps (operands.cuh, host-callable)
// run as plain GEMMs over every CTA's group, stride phase and K split, against the CPU
// reference convolutions on random configurations (1-3 spatial dims, strides, dilation,
// asymmetric pads, groups, odd channel counts). The GPU suite (test_conv_cudnn.cpp,
// test_implicit_gemm.cpp) runs the kernels themselves.
#include <gtest/gtest.h>

#include <random>

#include "backends/common/fast_divmod.h"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/operands.cuh"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/plan.h"
#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

using igemm::Plan;

TEST(FastDivmod, MatchesDivisionAndRemainder) {
  std::mt19937_64 rng(7);
  std::vector<int32_t> divisors = {1,
                                   2,
                                   3,
                                   5,
                                   7,
                                   9,
                                   49,
                                   56,
                                   64,
                                   1000,
                                   3136,
                                   65535,
                                   1 << 20,
                                   (1 << 30) + 3,
                                   std::numeric_limits<int32_t>::max()};
  for (int i = 0; i < 200; ++i) divisors.push_back(int32_t(rng() % 100000) + 1);
  for (int32_t d : divisors) {
    const FastDivmod f(d);
    std::vector<int32_t> numerators = {0,
                                       1,
                                       d - 1,
                                       d,
                                       d + 1,
                                       std::numeric_limits<int32_t>::max(),
                                       std::numeric_limits<int32_t>::max() - 1};
    for (int i = 0; i < 300; ++i) numerators.push_back(int32_t(rng() & 0x7fffffff));
    for (int32_t n : numerators) {
      if (n < 0) continue;
      int32_t r = -1;
      const int32_t q = f.divmod(n, r);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(r, n % d) << n << " % " << d;
    }
  }
}

ConvGeometry geometry_of(const ConvConfig& c) {
  return make_conv_geometry(c.attrs(), c.x_shape(), c.w_shape(), c.y_shape(), "test");
}

ConvOp conv_op_of(OpKind k) {
  return k == OpKind::conv                 ? ConvOp::fprop
         : k == OpKind::conv_backward_data ? ConvOp::dgrad
                                           : ConvOp::wgrad;
}

TEST(ImplicitGemmPlan, RefusesWhatItCannotTake) {
  ConvConfig c;
  c.batch = 2, c.in_channels = 8, c.out_channels = 8;
  c.spatial = {9, 9}, c.filter = {3, 3}, c.strides = {1, 1}, c.dilations = {1, 1};
  c.pads_begin = {1, 1}, c.pads_end = {1, 1};
  const ConvGeometry g = geometry_of(c);
  EXPECT_FALSE(igemm::cannot_implement(ConvOp::fprop, g, DType::bf16));
  const auto f64 = igemm::cannot_implement(ConvOp::fprop, g, DType::f64);
  ASSERT_TRUE(f64);
  EXPECT_NE(f64->find("f64"), std::string::npos) << *f64;
  // dgrad with stride 3 in both dims: 9 phases, one more than a grid holds.
  c.strides = {3, 3};
  const auto phases = igemm::cannot_implement(ConvOp::dgrad, geometry_of(c), DType::f16);
  ASSERT_TRUE(phases);
  EXPECT_NE(phases->find("9 stride phases"), std::string::npos) << *phases;
  EXPECT_FALSE(igemm::cannot_implement(ConvOp::fprop, geometry_of(c), DType::f16));
  EXPECT_THROW(igemm::make_plan(ConvOp::dgrad, geometry_of(c), DType::f16, {}, 132), Error);
}

TEST(ImplicitGemmPlan, TilesSplitsAndVectorPath) {
  ConvConfig c;  // ResNet-50 layer1 3x3 at batch 64
  c.batch = 64, c.in_channels = 64, c.out_channels = 64;
  c.spatial = {56, 56}, c.filter = {3, 3}, c.strides = {1, 1}, c.dilations = {1, 1};
  c.pads_begin = {1, 1}, c.pads_end = {1, 1};
  const ConvGeometry g = geometry_of(c);
  const Plan f = igemm::make_plan(ConvOp::fprop, g, DType::bf16, {}, 132);
  EXPECT_TRUE(f.vector);
  EXPECT_EQ(f.params.m, 64 * 56 * 56);
  EXPECT_EQ(f.params.n, 64);
  EXPECT_EQ(f.params.k, 9 * 64);
  EXPECT_EQ(igemm::tile_n(f.tile), 64) << f.describe();  // N = 64: no half-empty 128 tiles
  // wgrad: M = 64, N = 576, K = 200704 split into whole K tiles covering K exactly once.
  const Plan w = igemm::make_plan(ConvOp::wgrad, g, DType::bf16, {}, 132);
  EXPECT_GT(w.params.splits, 1) << w.describe();
  EXPECT_GE(int64_t(w.params.splits) * w.params.k_tiles_per_split * igemm::kTileK, w.params.k);
  EXPECT_LT(int64_t(w.params.splits - 1) * w.params.k_tiles_per_split * igemm::kTileK, w.params.k);
  EXPECT_EQ(w.partial_bytes, size_t(w.params.splits) * 64 * 576 * sizeof(float));
  // Odd channels: element loads; f32 without TF32: exact; forced tiles are honoured when
  // compiled for the combination, else the heuristic's is kept.
  c.in_channels = 3;
  const Plan odd = igemm::make_plan(ConvOp::fprop, geometry_of(c), DType::bf16, {}, 132);
  EXPECT_FALSE(odd.vector);
  EXPECT_EQ(odd.tile, igemm::TileShape::t64x64);
  const Plan exact = igemm::make_plan(ConvOp::fprop, g, DType::f32, {.allow_tf32 = false}, 132);
  EXPECT_EQ(exact.math, igemm::Math::exact);
  EXPECT_NE(exact.describe().find("exact"), std::string::npos);
  const Plan forced =
      igemm::make_plan(ConvOp::fprop, g, DType::f16, {.tile = igemm::TileShape::t128x128}, 132);
  EXPECT_EQ(forced.tile, igemm::TileShape::t128x128);
  EXPECT_FALSE(igemm::tile_available(ConvOp::fprop, DType::f32, igemm::Math::tensor_core, true,
                                     false, igemm::TileShape::t128x128));
  // wgmma tiles: only where the device runs them, for fprop and dgrad in 16-bit types.
  const Plan hopper = igemm::make_plan(ConvOp::fprop, g, DType::bf16, {.wgmma = true}, 132);
  EXPECT_TRUE(igemm::is_wgmma(hopper.tile)) << hopper.describe();
  EXPECT_EQ(igemm::tile_n(hopper.tile), 64) << hopper.describe();
  EXPECT_NE(hopper.describe().find("wg128x64x64"), std::string::npos) << hopper.describe();
  EXPECT_FALSE(
      igemm::is_wgmma(igemm::make_plan(ConvOp::wgrad, g, DType::bf16, {.wgmma = true}, 132).tile));
  EXPECT_FALSE(
      igemm::is_wgmma(igemm::make_plan(ConvOp::fprop, g, DType::f32, {.wgmma = true}, 132).tile));
  EXPECT_FALSE(igemm::tile_available(ConvOp::dgrad, DType::bf16, igemm::Math::tensor_core, false,
                                     true, igemm::TileShape::wg128x128));
  // The measured choices (bench/results/2026-11-25_h100_issue14/): long K takes 128x128,
  // wgrad with K/g >= 128 takes 128x64.
  ConvConfig l4 = c;  // layer4's 3x3: C = K = 512 at 7x7
  l4.in_channels = l4.out_channels = 512, l4.spatial = {7, 7};
  const ConvGeometry g4 = geometry_of(l4);
  EXPECT_EQ(igemm::make_plan(ConvOp::fprop, g4, DType::bf16, {.wgmma = true}, 132).tile,
            igemm::TileShape::wg128x128);
  EXPECT_EQ(igemm::make_plan(ConvOp::wgrad, g4, DType::bf16, {.wgmma = true}, 132).tile,
            igemm::TileShape::t128x64);
  ConvConfig s2 = l4;  // layer3's strided 1x1 downsample, dgrad: M = 64 * 28 * 28
  s2.in_channels = 512, s2.out_channels = 1024, s2.spatial = {28, 28}, s2.filter = {1, 1};
  s2.strides = {2, 2}, s2.pads_begin = s2.pads_end = {0, 0};
  EXPECT_EQ(
      igemm::make_plan(ConvOp::dgrad, geometry_of(s2), DType::bf16, {.wgmma = true}, 132).tile,
      igemm::TileShape::wg128x64);
}

// Dense channels-last storage of a logical [N, C, S...] (or filter [K, C/g, R...]) tensor.
std::vector<double> channels_last_values(const Tensor& t) {
  const Tensor stored = permuted_storage(t, channels_last_strides(t.shape()));
  return stored.to_doubles();
}

// The op's GEMMs through the index maps: every CTA (group x phase, split) as one tile over
// its whole M x N, summing its K range; splits added in order as sum_splits does.
template <class Op>
std::vector<double> emulate(const Plan& plan, const std::vector<double>& a,
                            const std::vector<double>& b, const std::vector<double>& bias,
                            size_t out_size) {
  const igemm::Params& p = plan.params;
  std::vector<double> out(out_size, std::nan("")), split_sum(out_size, 0.0);
  std::vector<bool> written(out_size, false);
  for (uint32_t z = 0; z < plan.grid[2]; ++z)
    for (uint32_t s = 0; s < plan.grid[1]; ++s) {
      const igemm::Cta cta = Op::template cta<igemm::kTileK>(p, int(s), int(z));
      for (int m = 0; m < cta.m; ++m) {
        const int64_t row = Op::row_offset(p, cta, m);
        EXPECT_GE(row, 0);
        const auto fa = Op::A::fixed(p, cta, m);
        for (int n = 0; n < cta.n; ++n) {
          const auto fb = Op::B::fixed(p, cta, n);
          double acc = 0;
          for (int k = cta.k_begin; k < cta.k_end; ++k) {
            const int64_t ia = Op::A::offset(p, fa, Op::A::moving(p, cta, k));
            const int64_t ib = Op::B::offset(p, fb, Op::B::moving(p, cta, k));
            if (ia >= 0 && ib >= 0) acc += a[size_t(ia)] * b[size_t(ib)];
          }
          const size_t at = size_t(row + n);
          EXPECT_LT(at, out_size);
          if (at >= out_size) continue;
          if (Op::kBias && !bias.empty()) acc += bias[size_t(Op::bias_base(p, cta) + n)];
          split_sum[at] += acc;
          written[at] = true;
        }
      }
    }
  for (size_t i = 0; i < out_size; ++i)
    if (written[i]) out[i] = split_sum[i];
  return out;
}

ConvConfig random_config(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  ConvConfig c;
  const OpKind ops[] = {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter};
  c.op = ops[pick(0, 2)];
  const int rank = int(pick(1, 3));
  c.groups = pick(0, 2) == 0 ? pick(2, 3) : 1;
  c.in_channels = c.groups * pick(1, 5);
  c.out_channels = c.groups * pick(1, 5);
  c.batch = pick(1, 2);
  c.bias = c.op != OpKind::conv_backward_filter && pick(0, 1) == 1;
  random_window(c, rng, rank, {{3, 3, 2}, {20, 9, 5}, {}, 0, 2});
  return c;
}

TEST(ImplicitGemmPlan, IndexMapsComputeTheReferenceConvolutions) {
  std::mt19937_64 rng(20261124);
  constexpr int kConfigs = 300;
  for (int i = 0; i < kConfigs; ++i) {
    const ConvConfig c = random_config(rng);
    SCOPED_TRACE(cat("config ", i, ": ", c.describe()));
    const std::vector<Tensor> in = conv_inputs(c, 500 + 10 * uint64_t(i));
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    const ConvOp op = conv_op_of(c.op);
    const ConvGeometry g = geometry_of(c);
    ASSERT_FALSE(igemm::cannot_implement(op, g, DType::f32));
    // Small splits so that wgrad's split arithmetic is exercised (1 K tile each).
    const Plan plan =
        igemm::make_plan(op, g, DType::f32, {.splits = op == ConvOp::wgrad ? 3 : 0}, 4);
    std::vector<double> bias;
    if (c.bias) bias = in[2].to_doubles();
    std::vector<double> got;
    const size_t out_size = size_t(want.numel());
    switch (op) {
      case ConvOp::fprop:
        got = emulate<igemm::Fprop>(plan, channels_last_values(in[0]), channels_last_values(in[1]),
                                    bias, out_size);
        break;
      case ConvOp::dgrad: {
        got = emulate<igemm::Dgrad>(plan, channels_last_values(in[0]), channels_last_values(in[1]),
                                    bias, out_size);
        // The wgmma path's map, over the filter transposed per group to [C/g][taps][K/g].
        const std::vector<double> w = channels_last_values(in[1]);  // KRSC
        const int64_t kg = g.out_per_group(), cg = g.in_per_group(), taps = g.filter_size();
        std::vector<double> wt(w.size());
        for (int64_t grp = 0; grp < g.groups; ++grp)
          for (int64_t k = 0; k < kg; ++k)
            for (int64_t r = 0; r < taps; ++r)
              for (int64_t c = 0; c < cg; ++c)
                wt[size_t(((grp * cg + c) * taps + r) * kg + k)] =
                    w[size_t(((grp * kg + k) * taps + r) * cg + c)];
        const std::vector<double> transposed =
            emulate<igemm::DgradTransposed>(plan, channels_last_values(in[0]), wt, bias, out_size);
        for (size_t j = 0; j < out_size; ++j)
          ASSERT_EQ(transposed[j], got[j]) << "transposed-filter map, element " << j;
        break;
      }
      case ConvOp::wgrad:
        got = emulate<igemm::Wgrad>(plan, channels_last_values(in[1]), channels_last_values(in[0]),
                                    bias, out_size);
        break;
    }
    // `got` is the output in channels-last storage: compare element by element.
    const std::vector<double> expected = channels_last_values(want);
    double err = 0, norm = 0;
    for (size_t j = 0; j < out_size; ++j) {
      ASSERT_FALSE(std::isnan(got[j])) << "element " << j << " never written";
      err += (got[j] - expected[j]) * (got[j] - expected[j]);
      norm += expected[j] * expected[j];
    }
    EXPECT_LE(std::sqrt(err), 1e-5 * std::max(1.0, std::sqrt(norm))) << plan.describe();
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
