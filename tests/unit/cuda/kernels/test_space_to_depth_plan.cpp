// The space-to-depth lowering's geometry and index map
// (kernels/conv/engines/space_to_depth/space_to_depth.h), without a GPU: the stem's wide problem,
// the refusals, and on random problems the identity itself -- the wide problem computes the
// convolution, its dgrad and its wgrad exactly (integer data), the wide tensors built with
// phase_source and folded as its adjoint. test_implicit_gemm.cpp's SpaceToDepthMatchesCpu runs the
// kernels on an H100/H200.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backends/cuda/kernels/conv/engines/space_to_depth/space_to_depth.h"
#include "conv_geometry_2d.h"

namespace fusebox::cuda {
namespace {

using testing::conv2d_geometry;

TEST(SpaceToDepthPlan, TheStemBecomesFourTapsOf48Channels) {
  const ConvGeometry g = conv2d_geometry(64, 3, 64, 224, 224, 7, 2, 3, 3);
  const std::optional<SpaceToDepth> s = space_to_depth_lowering(g);
  ASSERT_TRUE(s);
  const ConvGeometry& p = s->problem;
  EXPECT_EQ(p.in_channels, 48);  // 4 taps x 4 phases x 3 channels
  EXPECT_EQ(p.out_channels, 64);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(p.stride[d], 1);
    EXPECT_EQ(p.pad_lo[d], 0);
    EXPECT_EQ(p.pad_hi[d], 0);
    EXPECT_EQ(p.out[d], g.out[d]);
  }
  EXPECT_EQ(p.filter[1], 4);
  EXPECT_EQ(p.filter[2], 1);
  EXPECT_EQ(p.in[1], 115);
  EXPECT_EQ(p.in[2], 112);
  EXPECT_EQ(s->activations.source[1], 224);
  EXPECT_EQ(s->activations.wide[1], 115);
  EXPECT_EQ(s->activations.pad[2], 3);
  EXPECT_EQ(s->activations.unfold, 4);
  EXPECT_EQ(s->activations.used_channels(), 48);
  EXPECT_EQ(s->filter.batch, 64);
  EXPECT_EQ(s->filter.source[2], 7);
  EXPECT_EQ(s->filter.wide[1], 4);
  EXPECT_EQ(s->filter.wide[2], 1);
  EXPECT_EQ(s->filter.pad[1], 0);
}

TEST(SpaceToDepthPlan, RefusesWhatItCannotMap) {
  ConvGeometry grouped = conv2d_geometry(2, 6, 6, 20, 20, 7, 2, 3, 3);
  grouped.groups = 3;
  EXPECT_FALSE(space_to_depth_lowering(grouped));
  ConvGeometry dilated = conv2d_geometry(2, 3, 8, 20, 20, 7, 2, 3, 3);
  dilated.dilation[2] = 2;
  EXPECT_FALSE(space_to_depth_lowering(dilated));
  // 3x3 stride 1 on 3 channels: 9 wide channels (16 rounded), under half a K step.
  EXPECT_FALSE(space_to_depth_lowering(conv2d_geometry(2, 3, 8, 20, 20, 3, 1, 1, 1)));
  // 3x3 stride 2 on 3 channels: 2 taps x 4 phases x 3 = 24.
  EXPECT_FALSE(space_to_depth_lowering(conv2d_geometry(2, 3, 8, 20, 20, 3, 2, 1, 1)));
  // Extents past 32 bits.
  EXPECT_FALSE(space_to_depth_lowering(conv2d_geometry(4096, 3, 8, 1024, 1024, 7, 2, 3, 3)));
}

// Stepping a channel's digits to the next one (how the kernels walk a vector) gives the digits
// decoded from scratch, and says where a new group (plain position) starts.
TEST(SpaceToDepthPlan, SteppedDigitsAreTheDecodedOnes) {
  for (const ConvGeometry& g : {conv2d_geometry(2, 3, 8, 224, 224, 7, 2, 3, 3),
                                conv2d_geometry(2, 5, 8, 30, 31, 5, 3, 2, 1),
                                conv2d_geometry(1, 7, 8, 21, 21, 5, 1, 2, 2)}) {
    const std::optional<SpaceToDepth> s = space_to_depth_lowering(g);
    ASSERT_TRUE(s);
    const PhaseMap& m = s->activations;
    PhaseDigits stepped(m, 0);
    for (int j = 1; j < m.used_channels(); ++j) {
      const bool new_group = stepped.next(m);
      const PhaseDigits decoded(m, j);
      EXPECT_EQ(new_group, j % m.channels == 0) << j;
      EXPECT_EQ(stepped.c, decoded.c) << j;
      EXPECT_EQ(stepped.u, decoded.u) << j;
      for (int d = 0; d < 3; ++d) EXPECT_EQ(stepped.a[d], decoded.a[d]) << j;
    }
  }
}

// NDHWC tensors as doubles.
using Values = std::vector<double>;

// The convolution's three directions by definition (conv_geometry.h): every (n, o, k, r, c)
// whose input position is inside.
enum class Direction { fprop, dgrad, wgrad };
void convolve(const ConvGeometry& g, Direction direction, Values& x, Values& w, Values& y) {
  const int64_t C = g.in_channels, K = g.out_channels;
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
          for (int64_t r0 = 0; r0 < g.filter[0]; ++r0)
            for (int64_t r1 = 0; r1 < g.filter[1]; ++r1)
              for (int64_t r2 = 0; r2 < g.filter[2]; ++r2) {
                const int64_t o[3] = {o0, o1, o2}, r[3] = {r0, r1, r2};
                int64_t t[3];
                bool inside = true;
                for (int d = 0; d < 3; ++d) {
                  t[d] = o[d] * g.stride[d] - g.pad_lo[d] + r[d] * g.dilation[d];
                  inside = inside && t[d] >= 0 && t[d] < g.in[d];
                }
                if (!inside) continue;
                const int64_t xi = (((n * g.in[0] + t[0]) * g.in[1] + t[1]) * g.in[2] + t[2]) * C;
                const int64_t wi = ((r0 * g.filter[1] + r1) * g.filter[2] + r2) * C;
                const int64_t yi = (((n * g.out[0] + o0) * g.out[1] + o1) * g.out[2] + o2) * K;
                const int64_t wk = g.filter_size() * C;
                for (int64_t k = 0; k < K; ++k)
                  for (int64_t c = 0; c < C; ++c) {
                    double& xv = x[size_t(xi + c)];
                    double& wv = w[size_t(k * wk + wi + c)];
                    double& yv = y[size_t(yi + k)];
                    if (direction == Direction::fprop) yv += xv * wv;
                    if (direction == Direction::dgrad) xv += yv * wv;
                    if (direction == Direction::wgrad) wv += xv * yv;
                  }
              }
}

int64_t plain_size(const PhaseMap& m) {
  return int64_t(m.batch) * m.source[0] * m.source[1] * m.source[2] * m.channels;
}
int64_t wide_size(const PhaseMap& m) {
  return int64_t(m.batch) * m.wide[0] * m.wide[1] * m.wide[2] * m.wide_channels;
}

// unfold: wide = the wide form of plain; fold (its adjoint): plain += each wide element at the
// plain element it holds.
void map_wide(const PhaseMap& m, Values& plain, Values& wide, bool fold) {
  for (int b = 0; b < m.batch; ++b)
    for (int q0 = 0; q0 < m.wide[0]; ++q0)
      for (int q1 = 0; q1 < m.wide[1]; ++q1)
        for (int q2 = 0; q2 < m.wide[2]; ++q2)
          for (int j = 0; j < m.used_channels(); ++j) {
            const int q[3] = {q0, q1, q2};
            int t[3], c;
            phase_source(m, q, j, t, &c);
            bool inside = true;
            for (int d = 0; d < 3; ++d) inside = inside && t[d] >= 0 && t[d] < m.source[d];
            if (!inside) continue;
            const size_t p = size_t(
                (((int64_t(b) * m.source[0] + t[0]) * m.source[1] + t[1]) * m.source[2] + t[2]) *
                    m.channels +
                c);
            const size_t v =
                size_t((((int64_t(b) * m.wide[0] + q0) * m.wide[1] + q1) * m.wide[2] + q2) *
                           m.wide_channels +
                       j);
            if (fold)
              plain[p] += wide[v];
            else
              wide[v] = plain[p];
          }
}

TEST(SpaceToDepthPlan, TheWideProblemComputesTheConvolution) {
  std::mt19937 rng(2029);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto random_values = [&](int64_t n) {
    Values v(static_cast<size_t>(n));
    for (double& e : v) e = double(uniform(-3, 3));
    return v;
  };
  int mapped = 0;
  for (int trial = 0; trial < 400 && mapped < 60; ++trial) {
    ConvGeometry g;
    g.spatial_rank = int(uniform(1, 3));
    g.batch = uniform(1, 2);
    g.in_channels = uniform(1, 5);
    g.out_channels = uniform(1, 3);
    bool valid = true;
    for (int d = 3 - g.spatial_rank; d < 3; ++d) {
      g.filter[d] = uniform(1, 7);
      g.stride[d] = uniform(1, 3);
      g.pad_lo[d] = uniform(0, 3);
      g.pad_hi[d] = uniform(0, 3);
      g.in[d] = uniform(g.spatial_rank == 3 ? 3 : 5, g.spatial_rank == 3 ? 9 : 17);
      g.out[d] = conv_output_extent(g.in[d], g.filter[d], g.stride[d], 1, g.pad_lo[d], g.pad_hi[d]);
      valid = valid && g.out[d] >= 1;
    }
    if (!valid) continue;
    const std::optional<SpaceToDepth> s = space_to_depth_lowering(g);
    if (!s) continue;
    ++mapped;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": rank " << g.spatial_rank << " C " << g.in_channels
                 << " filter " << g.filter[2] << " stride " << g.stride[2] << " pads "
                 << g.pad_lo[2] << "/" << g.pad_hi[2] << " in " << g.in[2]);
    const ConvGeometry& p = s->problem;
    const int64_t xs = g.batch * g.in_size() * g.in_channels,
                  ws = g.out_channels * g.filter_size() * g.in_channels,
                  ys = g.batch * g.out_size() * g.out_channels;
    Values x = random_values(xs), w = random_values(ws), dy = random_values(ys);
    Values x_wide(static_cast<size_t>(wide_size(s->activations))),
        w_wide(static_cast<size_t>(wide_size(s->filter)));
    map_wide(s->activations, x, x_wide, false);
    map_wide(s->filter, w, w_wide, false);
    // fprop
    Values y(static_cast<size_t>(ys)), y_wide(static_cast<size_t>(ys));
    convolve(g, Direction::fprop, x, w, y);
    convolve(p, Direction::fprop, x_wide, w_wide, y_wide);
    EXPECT_EQ(y, y_wide);
    // dgrad: dx = fold(dgrad of the wide problem)
    Values dx(static_cast<size_t>(xs)), dx_wide(x_wide.size()), dx_folded(static_cast<size_t>(xs));
    convolve(g, Direction::dgrad, dx, w, dy);
    convolve(p, Direction::dgrad, dx_wide, w_wide, dy);
    map_wide(s->activations, dx_folded, dx_wide, true);
    EXPECT_EQ(dx, dx_folded);
    // wgrad: dw = fold(wgrad of the wide problem), one wide element per dw element
    Values dw(static_cast<size_t>(ws)), dw_wide(w_wide.size()), dw_folded(static_cast<size_t>(ws));
    convolve(g, Direction::wgrad, x, dw, dy);
    convolve(p, Direction::wgrad, x_wide, dw_wide, dy);
    map_wide(s->filter, dw_folded, dw_wide, true);
    EXPECT_EQ(dw, dw_folded);
    EXPECT_EQ(plain_size(s->activations), xs);
    EXPECT_EQ(plain_size(s->filter), ws);
  }
  EXPECT_GE(mapped, 60);
}

}  // namespace
}  // namespace fusebox::cuda
