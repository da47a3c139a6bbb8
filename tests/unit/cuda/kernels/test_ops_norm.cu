// CUDA layer_norm / rms_norm (forward and backward) and batch_norm (inference, training,
// backward) against references: the CPU backend for the forward ops, closed-form f64
// references computed here for the backward passes. Rows of 1 to 65,536 elements cover
// both kernel paths (register rows up to 16K elements, long rows past that, unaligned and
// odd-width rows); outputs are poisoned first.
//
// Tolerances: relative L2 error ||got - want|| / ||want|| of 1e-5 (f32: the mean of a
// 64K-element row summed in f32 is off by about 1e-6 relative, and x - mean amplifies
// that by |mean| / std), 2e-3 (f16), 1e-2 (bf16; rounding the output alone gives about
// 2e-3), 1e-12 (f64); plus an elementwise check (all_close: about 2 ulps of the output
// dtype for f16 / bf16, 5e-5 for f32) so that a few wrong elements cannot hide in the norm.
// Every element must be finite (a poisoned output that no kernel wrote is NaN). The
// backward's dx is compared relative to max(||dx||, ||rstd * g||): it cancels (a row of
// one element gives exactly 0 for layer_norm, rstd g eps / (x^2 + eps) for rms_norm, which
// f16 cannot even represent but as a subnormal), so its error scales with the terms.
#include <algorithm>
#include <cmath>

#include "backends/cuda/kernels/batch_norm/direct.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

double rel_tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 2e-3;
    default:
      return 1e-2;
  }
}

// ||got - want|| / max(||want||, floor) (floor at least 1e-30), with every element of got
// finite; want may be of another dtype (it is read as doubles). `floor` is the size of the
// terms an ill-conditioned result is made of (see the backward test).
::testing::AssertionResult close_in_norm(const Tensor& got, const Tensor& want, double tol,
                                         double floor = 0.0) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  }
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << " is " << g[i] << " (want " << w[i] << ")";
    }
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  const double rel = std::sqrt(diff) / std::max({std::sqrt(norm), floor, 1e-30});
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative L2 error " << rel << " > " << tol;
}

Tolerance elementwise_tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return {1e-10, 1e-10};
    case DType::f32:
      return {5e-5, 5e-5};
    case DType::f16:
      return {4e-3, 4e-3};
    default:
      return {2e-2, 2e-2};
  }
}

class NormTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

struct RowCase {
  int64_t rows, cols;
};
// Register path (cols a multiple of 8: every dtype vectorises), odd widths and long rows.
const RowCase kRowCases[] = {{1, 1},     {3, 7},     {5, 64},   {37, 96},   {9, 100},   {64, 1000},
                             {17, 1024}, {33, 4096}, {3, 8192}, {5, 16384}, {2, 16392}, {3, 65536}};

// ---- forward against the CPU backend ------------------------------------------------------

void expect_forward_matches(OpHarness& h, OpKind op, const NormAttrs& attrs,
                            const std::vector<Tensor>& inputs) {
  const std::vector<Tensor> want = run_op(op, attrs, inputs);
  KernelEntry entry = op == OpKind::layer_norm ? &layer_norm : &rms_norm;
  const std::vector<Tensor> got = h.run(entry, op, attrs, inputs);
  ASSERT_EQ(got.size(), want.size());
  const DType t = inputs[0].dtype();
  const Tolerance tol = elementwise_tolerance(t);
  EXPECT_TRUE(close_in_norm(got[0], want[0], rel_tolerance(t))) << "y";
  EXPECT_TRUE(all_close(got[0], want[0], tol.rtol, tol.atol)) << "y";
  for (size_t o = 1; o < got.size(); ++o) {  // statistics: f32 (f64), from f32 sums
    const double stat_tol = t == DType::f64 ? 1e-12 : 1e-5;
    EXPECT_TRUE(all_close(got[o], want[o], stat_tol, stat_tol)) << "statistic " << o;
  }
}

TEST_F(NormTest, LayerNormAndRmsNormMatchCpuOnEveryRowShape) {
  OpHarness h;
  uint64_t seed = 100;
  for (DType t : kFloatTypes) {
    for (const RowCase& c : kRowCases) {
      for (bool affine : {false, true}) {
        SCOPED_TRACE(
            cat(dtype_name(t), " rows ", c.rows, " cols ", c.cols, affine ? " affine" : ""));
        // An offset far from 0 checks that the variance is not E[x^2] - E[x]^2.
        Tensor x = random_tensor(t, {c.rows, c.cols}, seed++, 2.0, 4.0);
        Tensor scale = affine ? random_tensor(t, {c.cols}, seed++, 0.5, 1.5) : Tensor();
        Tensor bias = affine ? random_tensor(t, {c.cols}, seed++) : Tensor();
        expect_forward_matches(h, OpKind::layer_norm, NormAttrs{1, 1e-5}, {x, scale, bias});
        expect_forward_matches(h, OpKind::rms_norm, NormAttrs{1, 1e-6}, {x, scale});
      }
    }
  }
}

TEST_F(NormTest, NormalisedDimsFromAxisAndBroadcastParameters) {
  OpHarness h;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor x = random_tensor(t, {2, 3, 4, 8}, 1);
    // Normalised dims [4, 8] (axis 2); scale broadcast from [8], bias from [4, 1].
    Tensor scale = random_tensor(t, {8}, 2), bias = random_tensor(t, {4, 1}, 3);
    expect_forward_matches(h, OpKind::layer_norm, NormAttrs{2, 1e-5}, {x, scale, bias});
    expect_forward_matches(h, OpKind::rms_norm, NormAttrs{-1, 1e-5}, {x, scale});
    // axis 1: scale broadcast along the first normalised dim; axis 0: one row of
    // everything, with a full-shape bias.
    Tensor full = random_tensor(t, {1, 4, 8}, 4);
    expect_forward_matches(h, OpKind::layer_norm, NormAttrs{1, 1e-3}, {x, full, Tensor()});
    expect_forward_matches(h, OpKind::layer_norm, NormAttrs{0, 1e-5},
                           {x, Tensor(), random_tensor(t, {2, 3, 4, 8}, 5)});
  }
}

TEST_F(NormTest, UnalignedRowsTakeTheLongRowPath) {
  OpHarness h;
  const NormAttrs attrs{1, 1e-5};
  Tensor base = random_tensor(DType::bf16, {1 + 6 * 512}, 7);
  Tensor x = gather(base, {6, 512}, {512, 1}, 1);  // contiguous, one element off alignment
  const BuiltNode built = build_node(OpKind::layer_norm, attrs, {x});
  DeviceTensor view = h.view(base, {6, 512}, {512, 1}, 1);
  const std::vector<Tensor> got = h.run_device(&layer_norm, built, {&view});
  const std::vector<Tensor> want = run_op(OpKind::layer_norm, attrs, {x});
  EXPECT_TRUE(close_in_norm(got[0], want[0], rel_tolerance(DType::bf16)));
  EXPECT_TRUE(all_close(got[1], want[1], 1e-5, 1e-5));
}

// ---- backward against closed-form f64 references ----------------------------------------

struct NormGrads {
  Tensor dx, dscale, dbias;  // f64
  double term_norm;          // ||rstd * g||: the size of the terms dx is made of
};

// dx, dscale, dbias of layer_norm (centre) or rms_norm in f64, from x, dy, scale (any
// dtype, read as doubles) and the saved statistics as the kernel gets them.
NormGrads reference_backward(const Tensor& x, const Tensor& dy, const Tensor& scale,
                             const Tensor& mean, const Tensor& rstd, bool centre) {
  const int64_t rows = rstd.numel(), cols = x.numel() / rows;
  const std::vector<double> xs = x.to_doubles(), dys = dy.to_doubles(),
                            ms =
                                centre ? mean.to_doubles() : std::vector<double>(size_t(rows), 0.0);
  const std::vector<double> rs = rstd.to_doubles();
  const std::vector<double> gamma =
      scale.defined() ? scale.to_doubles() : std::vector<double>(size_t(cols), 1.0);
  std::vector<double> dx(xs.size()), dscale(size_t(cols), 0.0), dbias(size_t(cols), 0.0);
  double terms = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = size_t(r * cols + j);
      const double x_hat = (xs[i] - ms[size_t(r)]) * rs[size_t(r)];
      const double g = dys[i] * gamma[size_t(j)];
      sum_g += g;
      sum_gx += g * x_hat;
      dscale[size_t(j)] += dys[i] * x_hat;
      dbias[size_t(j)] += dys[i];
    }
    const double mean_g = centre ? sum_g / double(cols) : 0.0, mean_gx = sum_gx / double(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = size_t(r * cols + j);
      const double x_hat = (xs[i] - ms[size_t(r)]) * rs[size_t(r)];
      dx[i] = rs[size_t(r)] * (dys[i] * gamma[size_t(j)] - mean_g - x_hat * mean_gx);
      terms += std::pow(rs[size_t(r)] * dys[i] * gamma[size_t(j)], 2);
    }
  }
  return {Tensor::from_doubles(DType::f64, x.shape(), dx),
          Tensor::from_doubles(DType::f64, {cols}, dscale),
          Tensor::from_doubles(DType::f64, {cols}, dbias), std::sqrt(terms)};
}

// Row statistics in f64, stored in `stats` dtype (what the forward would have saved).
void row_statistics(const Tensor& x, int64_t rows, bool centre, DType stats, Tensor& mean,
                    Tensor& rstd) {
  const int64_t cols = x.numel() / rows;
  const std::vector<double> xs = x.to_doubles();
  std::vector<double> m(size_t(rows), 0.0), r(size_t(rows), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0, sq = 0;
    if (centre)
      for (int64_t j = 0; j < cols; ++j) s += xs[size_t(i * cols + j)];
    m[size_t(i)] = s / double(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const double d = xs[size_t(i * cols + j)] - m[size_t(i)];
      sq += d * d;
    }
    r[size_t(i)] = 1.0 / std::sqrt(sq / double(cols) + 1e-5);
  }
  mean = Tensor::from_doubles(stats, {rows}, m);
  rstd = Tensor::from_doubles(stats, {rows}, r);
}

struct BackwardRun {
  Tensor dx, dscale, dbias;
};

BackwardRun run_norm_backward(OpHarness& h, bool centre, const Tensor& x, const Tensor& dy,
                              const Tensor& scale, const Tensor& mean, const Tensor& rstd,
                              DType grad_dtype) {
  const int64_t cols = x.numel() / rstd.numel();
  DeviceTensor dx_in = h.upload(x), dy_in = h.upload(dy), mean_in = h.upload(mean),
               rstd_in = h.upload(rstd);
  DeviceTensor scale_in = scale.defined() ? h.upload(scale) : DeviceTensor();
  DeviceTensor dx = h.poisoned({x.dtype(), x.shape()});
  DeviceTensor dscale = h.poisoned({grad_dtype, {cols}});
  DeviceTensor dbias = h.poisoned({grad_dtype, {cols}});
  const DeviceTensor* scale_ptr = scale.defined() ? &scale_in : nullptr;
  if (centre) {
    layer_norm_backward(h.ctx(), dx_in, dy_in, scale_ptr, mean_in, rstd_in, dx, &dscale, &dbias);
  } else {
    rms_norm_backward(h.ctx(), dx_in, dy_in, scale_ptr, rstd_in, dx, &dscale);
  }
  h.encoder().synchronize();
  return {h.download(dx), h.download(dscale), centre ? h.download(dbias) : Tensor()};
}

TEST_F(NormTest, LayerNormAndRmsNormBackwardMatchClosedForm) {
  OpHarness h;
  uint64_t seed = 500;
  const RowCase cases[] = {{1, 1},     {5, 7},    {300, 96},  {64, 1000}, {33, 1024},
                           {65, 4096}, {9, 8192}, {7, 16384}, {3, 65536}, {2000, 64}};
  for (DType t : kFloatTypes) {
    const DType stats = t == DType::f64 ? DType::f64 : DType::f32;
    for (const RowCase& c : cases) {
      for (bool centre : {true, false}) {
        for (bool with_scale : {true, false}) {
          SCOPED_TRACE(cat(dtype_name(t), " rows ", c.rows, " cols ", c.cols,
                           centre ? " layer_norm" : " rms_norm", with_scale ? " scale" : ""));
          Tensor x = random_tensor(t, {c.rows, c.cols}, seed++, -1.0, 3.0);
          Tensor dy = random_tensor(t, {c.rows, c.cols}, seed++);
          Tensor scale = with_scale ? random_tensor(t, {c.cols}, seed++, 0.5, 1.5) : Tensor();
          Tensor mean, rstd;
          row_statistics(x, c.rows, centre, stats, mean, rstd);
          const NormGrads want = reference_backward(x, dy, scale, mean, rstd, centre);
          const DType grad_dtype = with_scale ? t : stats;  // both output dtypes get a turn
          const BackwardRun got =
              run_norm_backward(h, centre, x, dy, scale, mean, rstd, grad_dtype);
          // dx cancels (exactly 0 for a one-element layer_norm row; rstd g eps / (x^2 +
          // eps) for rms_norm): its error is relative to the terms, ||rstd * g||.
          EXPECT_TRUE(close_in_norm(got.dx, want.dx, rel_tolerance(t), want.term_norm)) << "dx";
          // Column sums over up to 2000 rows, rounded once: a little looser.
          const double sum_tol = 4 * rel_tolerance(grad_dtype);
          EXPECT_TRUE(close_in_norm(got.dscale, want.dscale, sum_tol)) << "dscale";
          if (centre) EXPECT_TRUE(close_in_norm(got.dbias, want.dbias, sum_tol)) << "dbias";
        }
      }
    }
  }
}

TEST_F(NormTest, BackwardIsDeterministic) {
  OpHarness h;
  // 4096: the register path; 16384: the staged path with clusters (one partial row per
  // cluster of blocks); 65536: the long-row path.
  for (int64_t cols : {int64_t(4096), int64_t(16384), int64_t(65536)}) {
    Tensor x = random_tensor(DType::bf16, {129, cols}, 1),
           dy = random_tensor(DType::bf16, {129, cols}, 2);
    Tensor scale = random_tensor(DType::bf16, {cols}, 3), mean, rstd;
    row_statistics(x, 129, true, DType::f32, mean, rstd);
    const BackwardRun a = run_norm_backward(h, true, x, dy, scale, mean, rstd, DType::f32);
    const BackwardRun b = run_norm_backward(h, true, x, dy, scale, mean, rstd, DType::f32);
    EXPECT_TRUE(all_close(a.dscale, b.dscale, 0, 0)) << cols;
    EXPECT_TRUE(all_close(a.dbias, b.dbias, 0, 0)) << cols;
    EXPECT_TRUE(all_close(a.dx, b.dx, 0, 0)) << cols;
  }
}

TEST_F(NormTest, BackwardRejectsMismatchedShapes) {
  OpHarness h;
  DeviceTensor x = h.upload(random_tensor(DType::f32, {4, 8}, 1));
  DeviceTensor dy = h.upload(random_tensor(DType::f32, {4, 9}, 2));
  DeviceTensor stats = h.upload(random_tensor(DType::f32, {4}, 3));
  DeviceTensor dx = h.poisoned({DType::f32, {4, 8}});
  EXPECT_THROW(rms_norm_backward(h.ctx(), x, dy, nullptr, stats, dx, nullptr), Error);
  DeviceTensor bad_stats = h.upload(random_tensor(DType::f32, {3}, 4));
  EXPECT_THROW(
      layer_norm_backward(h.ctx(), x, x, nullptr, bad_stats, bad_stats, dx, nullptr, nullptr),
      Error);
}

// ---- batch_norm ---------------------------------------------------------------------------

const Shape kBatchShapes[] = {{2, 3, 5, 7},    {4, 16, 8, 8},    {8, 5},
                              {1, 7, 3, 4, 5}, {16, 64, 28, 28}, {3, 2, 1000}};

TEST_F(NormTest, BatchNormInferenceAndTrainingMatchCpu) {
  OpHarness h;
  uint64_t seed = 900;
  for (DType t : kFloatTypes) {
    for (const Shape& shape : kBatchShapes) {
      const int64_t channels = shape[1];
      for (bool training : {false, true}) {
        SCOPED_TRACE(
            cat(dtype_name(t), " ", shape_str(shape), training ? " training" : " inference"));
        Tensor x = random_tensor(t, shape, seed++, 1.0, 5.0);
        Tensor scale = random_tensor(t, {channels}, seed++, 0.5, 1.5);
        Tensor bias = random_tensor(t, {channels}, seed++);
        Tensor mean = random_tensor(t, {channels}, seed++, 2.0, 4.0);
        Tensor var = random_tensor(t, {channels}, seed++, 0.5, 2.0);
        const BatchNormAttrs attrs{1e-5, 0.9, training};
        const std::vector<Tensor> inputs = {x, scale, bias, mean, var};
        const std::vector<Tensor> want = run_op(OpKind::batch_norm, attrs, inputs);
        const std::vector<Tensor> got = h.run(&batch_norm, OpKind::batch_norm, attrs, inputs);
        ASSERT_EQ(got.size(), want.size());
        const Tolerance tol = elementwise_tolerance(t);
        for (size_t o = 0; o < got.size(); ++o) {
          EXPECT_TRUE(close_in_norm(got[o], want[o], rel_tolerance(t))) << "output " << o;
          EXPECT_TRUE(all_close(got[o], want[o], tol.rtol, tol.atol)) << "output " << o;
        }
      }
    }
  }
}

TEST_F(NormTest, BatchNormBackwardMatchesClosedForm) {
  OpHarness h;
  uint64_t seed = 1300;
  for (DType t : kFloatTypes) {
    for (const Shape& shape : kBatchShapes) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape)));
      const int64_t batch = shape[0], channels = shape[1];
      const int64_t inner = numel(shape) / (batch * channels);
      Tensor x = random_tensor(t, shape, seed++, 1.0, 5.0), dy = random_tensor(t, shape, seed++);
      Tensor scale = random_tensor(t, {channels}, seed++, 0.5, 1.5);
      // Saved statistics in f64, then rounded to x's dtype, as the forward saves them.
      const std::vector<double> xs = x.to_doubles(), dys = dy.to_doubles(),
                                gamma = scale.to_doubles();
      std::vector<double> m(size_t(channels), 0.0), r(size_t(channels), 0.0);
      const double count = double(batch * inner);
      auto at = [&](int64_t n, int64_t c, int64_t i) {
        return size_t((n * channels + c) * inner + i);
      };
      for (int64_t c = 0; c < channels; ++c) {
        double s = 0, sq = 0;
        for (int64_t n = 0; n < batch; ++n)
          for (int64_t i = 0; i < inner; ++i) s += xs[at(n, c, i)];
        m[size_t(c)] = s / count;
        for (int64_t n = 0; n < batch; ++n)
          for (int64_t i = 0; i < inner; ++i) sq += std::pow(xs[at(n, c, i)] - m[size_t(c)], 2);
        r[size_t(c)] = 1.0 / std::sqrt(sq / count + 1e-5);
      }
      Tensor mean = Tensor::from_doubles(t, {channels}, m),
             inv_std = Tensor::from_doubles(t, {channels}, r);
      const std::vector<double> mq = mean.to_doubles(), rq = inv_std.to_doubles();
      std::vector<double> dx(xs.size()), dscale(size_t(channels), 0.0),
          dbias(size_t(channels), 0.0);
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t n = 0; n < batch; ++n) {
          for (int64_t i = 0; i < inner; ++i) {
            dbias[size_t(c)] += dys[at(n, c, i)];
            dscale[size_t(c)] +=
                dys[at(n, c, i)] * (xs[at(n, c, i)] - mq[size_t(c)]) * rq[size_t(c)];
          }
        }
        for (int64_t n = 0; n < batch; ++n) {
          for (int64_t i = 0; i < inner; ++i) {
            const double x_hat = (xs[at(n, c, i)] - mq[size_t(c)]) * rq[size_t(c)];
            dx[at(n, c, i)] =
                gamma[size_t(c)] * rq[size_t(c)] *
                (dys[at(n, c, i)] - dbias[size_t(c)] / count - x_hat * dscale[size_t(c)] / count);
          }
        }
      }
      DeviceTensor xd = h.upload(x), dyd = h.upload(dy), sd = h.upload(scale), md = h.upload(mean),
                   rd = h.upload(inv_std);
      DeviceTensor gx = h.poisoned({t, shape}), gs = h.poisoned({DType::f32, {channels}}),
                   gb = h.poisoned({DType::f32, {channels}});
      batch_norm_backward(h.ctx(), xd, dyd, sd, md, rd, &gx, &gs, &gb);
      h.encoder().synchronize();
      EXPECT_TRUE(close_in_norm(h.download(gx), Tensor::from_doubles(DType::f64, shape, dx),
                                4 * rel_tolerance(t)))
          << "dx";
      EXPECT_TRUE(close_in_norm(h.download(gs),
                                Tensor::from_doubles(DType::f64, {channels}, dscale),
                                4 * rel_tolerance(DType::f32)))
          << "dscale";
      EXPECT_TRUE(close_in_norm(h.download(gb), Tensor::from_doubles(DType::f64, {channels}, dbias),
                                4 * rel_tolerance(DType::f32)))
          << "dbias";
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
