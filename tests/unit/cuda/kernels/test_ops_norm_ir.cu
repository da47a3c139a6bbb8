// The IR ops layer_norm_backward and rms_norm_backward on the CUDA backend against the CPU
// backend (which computes in f64 and rounds once), on fresh random inputs with the
// statistics from the CPU forward, outputs poisoned first (OpHarness). Widths 1, 7 and
// 4097 take the long-row path (odd widths), 1024 and 16384 the register path, 65536 the
// long-row path for f32 and the register path's widest layouts for f16/bf16; rows 1 and
// many. Every tuning variant (kernels/norm/tuning.h) is run over a few shapes as well, so that each
// register-path layout (prefetch or not, column sums in registers or shared memory) and
// the staged path are checked, forward included; the staged path also over many rows.
//
// Tolerances. dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) cancels: for a row of
// one element it is exactly 0 (layer_norm) or rstd * g * eps / (x^2 + eps) (rms_norm), so
// an f32 kernel's error is relative to the size of the terms, not of dx. dx is therefore
// compared as ||got - want|| <= tol * max(||want||, ||rstd * g||) with tol 1e-5 (f32),
// 2e-3 (f16), 1e-2 (bf16: rounding the output alone gives about 2e-3), and elementwise
// within a few ulps of the output dtype plus tol * rms(rstd * g). The parameter gradients
// (sums over the rows, f32 partial sums) use 4 x tol in norm and elementwise. Every
// element must be finite (a poisoned output nothing wrote is NaN).
#include <cmath>

#include "backends/cuda/kernels/norm/tuning.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

double norm_tolerance(DType t) {
  switch (t) {
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 2e-3;
    default:
      return 1e-2;
  }
}
double ulps(DType t) {  // a couple of units in the last place, relative
  switch (t) {
    case DType::f32:
      return 2e-6;
    case DType::f16:
      return 2e-3;
    default:
      return 1.6e-2;
  }
}

// got vs want (want read as doubles): finite, ||got - want|| <= tol * max(||want||, scale),
// and elementwise |got - want| <= rtol |want| + tol * scale / sqrt(n).
::testing::AssertionResult close_to(const Tensor& got, const Tensor& want, double scale_norm,
                                    double tol, double rtol) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure()
           << "type " << dtype_name(got.dtype()) << " " << shape_str(got.shape()) << " vs "
           << dtype_name(want.dtype()) << " " << shape_str(want.shape());
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
  const double denominator = std::max({std::sqrt(norm), scale_norm, 1e-30});
  if (std::sqrt(diff) > tol * denominator) {
    return ::testing::AssertionFailure()
           << "relative L2 error " << std::sqrt(diff) / denominator << " > " << tol;
  }
  const double atol = tol * denominator / std::sqrt(double(std::max<size_t>(g.size(), 1)));
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - w[i]) > rtol * std::abs(w[i]) + atol) {
      return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << w[i]
                                           << " (atol " << atol << ", rtol " << rtol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// ||inv * dy * scale|| over the rows (the size of the terms dx is made of). A scale that
// broadcasts (fewer elements than a row) counts as 1: in [0.5, 1.5], it changes the size
// by less than the tolerance's margin.
double term_norm(const Tensor& dy, const Tensor& scale, const Tensor& inv) {
  const std::vector<double> d = dy.to_doubles(), r = inv.to_doubles();
  const size_t rows = r.size(), cols = d.size() / std::max<size_t>(rows, 1);
  std::vector<double> s;
  if (scale.defined() && size_t(scale.numel()) == cols) s = scale.to_doubles();
  double sum = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    const double term = r[i / cols] * d[i] * (s.empty() ? 1.0 : s[i % s.size()]);
    sum += term * term;
  }
  return std::sqrt(sum);
}

class NormIrTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
  void TearDown() override { norm::select_norm_variant(0); }
};

// One backward case: x [shape] normalised from `axis`, scale of `scale_shape` (empty: none).
void expect_backward_matches(OpHarness& h, bool layer, DType t, const Shape& shape, int64_t axis,
                             const Shape& scale_shape, uint64_t seed) {
  const NormAttrs attrs{axis, 1e-5};
  Tensor x = random_tensor(t, shape, seed, -1.0, 3.0);
  Tensor scale = scale_shape.empty() ? Tensor() : random_tensor(t, scale_shape, seed + 1, 0.5, 1.5);
  Tensor dy = random_tensor(t, shape, seed + 2);
  const OpKind forward = layer ? OpKind::layer_norm : OpKind::rms_norm;
  const OpKind backward = layer ? OpKind::layer_norm_backward : OpKind::rms_norm_backward;
  std::vector<Tensor> fwd_in = {x, scale};
  if (layer) fwd_in.push_back(Tensor());
  const std::vector<Tensor> stats = run_op(forward, attrs, fwd_in);
  std::vector<Tensor> inputs = {dy, x, scale, stats[1]};
  if (layer) inputs.push_back(stats[2]);
  const std::vector<Tensor> want = run_op(backward, attrs, inputs);
  const KernelEntry entry =
      layer ? KernelEntry(&layer_norm_backward) : KernelEntry(&rms_norm_backward);
  const std::vector<Tensor> got = h.run(entry, backward, attrs, inputs);
  ASSERT_EQ(got.size(), want.size());
  const double tol = norm_tolerance(t);
  EXPECT_TRUE(close_to(got[0], want[0], term_norm(dy, scale, stats.back()), tol, ulps(t))) << "dx";
  for (size_t o = 1; o < got.size(); ++o)
    EXPECT_TRUE(close_to(got[o], want[o], 0.0, 4 * tol, 4 * ulps(t))) << "output " << o;
}

// One forward case: layer_norm (x, scale, bias) or rms_norm (x, scale) over the last dim
// of x [shape] against the CPU backend, y and the saved statistics.
void expect_forward_matches(OpHarness& h, bool layer, DType t, const Shape& shape, uint64_t seed) {
  const int64_t cols = shape.back();
  const OpKind op = layer ? OpKind::layer_norm : OpKind::rms_norm;
  const NormAttrs attrs{int64_t(shape.size()) - 1, 1e-5};
  std::vector<Tensor> in = {random_tensor(t, shape, seed, 2.0, 4.0),
                            random_tensor(t, {cols}, seed + 1, 0.5, 1.5)};
  if (layer) in.push_back(random_tensor(t, {cols}, seed + 2));
  const std::vector<Tensor> want = run_op(op, attrs, in);
  const std::vector<Tensor> got = h.run(layer ? &layer_norm : &rms_norm, op, attrs, in);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(close_to(got[0], want[0], 0.0, norm_tolerance(t), ulps(t))) << "y";
  for (size_t o = 1; o < got.size(); ++o)
    EXPECT_TRUE(close_to(got[o], want[o], 0.0, 1e-5, 1e-5)) << "statistic " << o;
}

TEST_F(NormIrTest, BackwardOpsMatchCpuOnEveryWidth) {
  OpHarness h;
  uint64_t seed = 7000;
  const int64_t widths[] = {1, 7, 1024, 4097, 16384, 65536};
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (int64_t cols : widths) {
      // Many rows: a few per SM-resident block of the persistent grid at small widths.
      const int64_t many = std::clamp<int64_t>((int64_t(1) << 21) / cols, 3, 700);
      for (int64_t rows : {int64_t(1), many}) {
        for (bool layer : {true, false}) {
          for (bool with_scale : {true, false}) {
            SCOPED_TRACE(cat(dtype_name(t), " rows ", rows, " cols ", cols,
                             layer ? " layer_norm" : " rms_norm", with_scale ? " scale" : ""));
            expect_backward_matches(h, layer, t, {rows, cols}, 1,
                                    with_scale ? Shape{cols} : Shape{}, seed);
            seed += 3;
          }
        }
      }
    }
  }
}

TEST_F(NormIrTest, BackwardOpsSumBroadcastScaleGradients) {
  OpHarness h;
  uint64_t seed = 8000;
  for (DType t : {DType::f32, DType::bf16}) {
    for (bool layer : {true, false}) {
      SCOPED_TRACE(cat(dtype_name(t), layer ? " layer_norm" : " rms_norm"));
      // Normalised dims [4, 8]: scale [8] (broadcast along 4), [4, 1], [1, 8], none.
      for (const Shape& scale_shape : {Shape{8}, Shape{4, 1}, Shape{1, 8}, Shape{4, 8}, Shape{}}) {
        SCOPED_TRACE(cat("scale ", shape_str(scale_shape)));
        expect_backward_matches(h, layer, t, {2, 3, 4, 8}, 2, scale_shape, seed);
        seed += 3;
      }
      // Every dim normalised (one row, scale [64] broadcast along 3 x 5); the last two
      // (scale [1, 64] along 5); a single normalised dim of a 3-D x (scale [1], one value
      // broadcast along all 64). A scale may not have more dims than are normalised.
      expect_backward_matches(h, layer, t, {3, 5, 64}, 0, {64}, seed);
      expect_backward_matches(h, layer, t, {3, 5, 64}, 1, {1, 64}, seed + 3);
      expect_backward_matches(h, layer, t, {3, 5, 64}, 2, {1}, seed + 6);
      seed += 9;
    }
  }
}

TEST_F(NormIrTest, EveryVariantMatchesCpu) {
  OpHarness h;
  uint64_t seed = 9000;
  const std::span<const norm::Variant> variants = norm::norm_variants();
  for (size_t v = 0; v < variants.size(); ++v) {
    norm::select_norm_variant(int(v));
    for (DType t : {DType::f32, DType::bf16}) {
      for (const Shape& shape :
           {Shape{300, 64}, Shape{67, 1024}, Shape{19, 4096}, Shape{5, 16384}, Shape{3, 32768}}) {
        SCOPED_TRACE(cat("variant ", variants[v].name, " ", dtype_name(t), " ", shape_str(shape)));
        const int64_t cols = shape[1];
        expect_backward_matches(h, true, t, shape, 1, {cols}, seed);
        expect_backward_matches(h, false, t, shape, 1, {cols}, seed + 3);
        // Forward against the CPU backend as well.
        for (bool layer : {true, false}) {
          SCOPED_TRACE(layer ? "layer_norm" : "rms_norm");
          expect_forward_matches(h, layer, t, shape, seed + 6);
        }
        seed += 9;
      }
    }
  }
}

// The staged backward (kernels/norm/backward_staged.cu) with several rows per row group, so that
// its pipeline's stages are filled, reused and drained; rows not a multiple of the groups;
// one partial row per block (132 on an H100), or per cluster of 8 blocks (16), summed
// and, for most variants, discarded.
// Each variant that always takes the staged path, at widths where it applies
// (bf16 1024, 4096, 16384 columns: 16, 4 and 1 groups per block; f32 1024 and 4096), and
// at 1032 columns, where the last vectors of a row leave most threads idle. The variants
// that take it only where the register path's sums would be in shared memory (the
// default's) at the one such case here: LayerNorm bf16 16,384 columns.
TEST_F(NormIrTest, StagedBackwardMatchesCpuOverManyRows) {
  OpHarness h;
  uint64_t seed = 9500;
  const std::span<const norm::Variant> variants = norm::norm_variants();
  int staged = 0, clustered = 0;
  for (size_t v = 0; v < variants.size(); ++v) {
    if (variants[v].backward_staged == norm::StagedUse::never) continue;
    const bool always = variants[v].backward_staged == norm::StagedUse::always;
    ++staged;
    norm::select_norm_variant(int(v));
    for (DType t : {DType::bf16, DType::f32}) {
      for (const Shape& shape :
           {Shape{8191, 1024}, Shape{2643, 4096}, Shape{601, 16384}, Shape{1999, 1032}}) {
        const int64_t rows = shape[0], cols = shape[1];
        if (t == DType::f32 && cols == 16384) continue;  // no staged layout fits
        if (!always && !(t == DType::bf16 && cols == 16384)) continue;
        SCOPED_TRACE(cat("variant ", variants[v].name, " ", dtype_name(t), " ", shape_str(shape)));
        for (bool layer : {true, false}) {
          if (!always && !layer) continue;  // RMSNorm's sums fit the registers
          const std::string layout = norm::backward_layout(h.ctx(), t, rows, cols, layer);
          EXPECT_EQ(layout.rfind("staged", 0), 0u) << layout;
          // Clusters of blocks (one partial row per cluster) wherever the slices of a row
          // are whole float4s (and the device fits them in full).
          if (variants[v].staged_cluster_partials == 0)
            EXPECT_EQ(layout.find("cluster="), std::string::npos) << layout;
          clustered += layout.find("cluster=") != std::string::npos;
          expect_backward_matches(h, layer, t, shape, 1, {cols}, seed);
          seed += 3;
        }
      }
    }
  }
  EXPECT_GT(staged, 0) << "no variant takes the staged path";
  // Thread-block clusters exist from sm_90 on: there, some case must have used them.
  if (h.ctx().device.properties().compute_major >= 9) EXPECT_GT(clustered, 0);
}

// The register path's 80-register layout (f16 / bf16, 1,024 and 4,096 columns: 4 and 1
// row groups per block) in thread-block clusters, one partial row per cluster
// (write_cluster_partials), against the CPU over many rows; and the same variant without
// clusters. On sm_90 and later the default variant must pick clusters here for LayerNorm
// (RMSNorm, one partial row per block, does not gain from them and keeps the plain grid).
TEST_F(NormIrTest, RegisterPathClusterPartialsMatchCpu) {
  OpHarness h;
  uint64_t seed = 9700;
  const std::span<const norm::Variant> variants = norm::norm_variants();
  const bool clusters = h.ctx().device.properties().compute_major >= 9;
  for (size_t v = 0; v < variants.size(); ++v) {
    const std::string name = variants[v].name;
    if (name != "r80-discard-staged" && name != "r80-discard-staged-noclu") continue;
    norm::select_norm_variant(int(v));
    for (DType t : {DType::bf16, DType::f16}) {
      for (const Shape& shape : {Shape{8191, 1024}, Shape{2643, 4096}, Shape{37, 4096}}) {
        for (bool layer : {true, false}) {
          SCOPED_TRACE(
              cat(name, " ", dtype_name(t), " ", shape_str(shape), layer ? " LN" : " RMS"));
          const std::string layout = norm::backward_layout(h.ctx(), t, shape[0], shape[1], layer);
          EXPECT_NE(layout.find("regs<=80"), std::string::npos) << layout;
          const bool want = clusters && layer && variants[v].cluster_partials > 0;
          EXPECT_EQ(layout.find("cluster=") != std::string::npos, want) << layout;
          expect_backward_matches(h, layer, t, shape, 1, {shape[1]}, seed);
          seed += 3;
        }
      }
    }
  }
}

// The staged forward (kernels/norm/forward_staged.cu) over many rows, so that its stages are
// filled, reused and drained, rows not a multiple of the groups: the default variant where
// it takes it (f32 16,384 columns) and the variant that always does (bf16 and f32 at 1024,
// 4096 and 16,384 columns: 4 vectors per thread, 32 to 1024 threads per row).
TEST_F(NormIrTest, StagedForwardMatchesCpuOverManyRows) {
  OpHarness h;
  uint64_t seed = 9900;
  const std::span<const norm::Variant> variants = norm::norm_variants();
  int staged = 0;
  for (size_t v = 0; v < variants.size(); ++v) {
    const norm::StagedUse use = variants[v].forward_staged;
    if (use == norm::StagedUse::never) continue;
    norm::select_norm_variant(int(v));
    for (DType t : {DType::f32, DType::bf16}) {
      for (const Shape& shape : {Shape{8191, 1024}, Shape{2643, 4096}, Shape{601, 16384}}) {
        const int64_t rows = shape[0], cols = shape[1];
        const bool wanted = use == norm::StagedUse::always ||
                            cols / (16 / int64_t(dtype_size(t))) >= norm::kStagedForwardMinVecs;
        if (!wanted) continue;
        for (bool layer : {true, false}) {
          SCOPED_TRACE(cat("variant ", variants[v].name, " ", dtype_name(t), " ", shape_str(shape),
                           layer ? " layer_norm" : " rms_norm"));
          const std::string layout = norm::forward_layout(h.ctx(), t, rows, cols, layer);
          EXPECT_EQ(layout.rfind("staged", 0), 0u) << layout;
          ++staged;
          expect_forward_matches(h, layer, t, shape, seed);
          seed += 3;
        }
      }
    }
  }
  EXPECT_GT(staged, 0) << "no case took the staged forward";
}

// The mixed form (ir/ops.h NormAttrs: f32 scale and bias, y_dtype; passes/fusion.h
// fold_norm_casts makes it) against the CPU backend, and, for an f32 x, bit for bit against
// what it replaces on the GPU: the plain f32 norm, its y rounded to y's dtype (as a cast
// rounds, to nearest even). (A bf16 or f16 x is summed in another row layout than its f32
// widening, W = 8 elements per vector instead of 4: the statistics may differ in the last
// f32 bit, so those are held to the CPU's values only; so are long f32 rows, which the plain
// form stages and the mixed form does not.) Widths on the register path (96: 12 bf16 vectors, 768)
// and on the long-row path (100: not a multiple of the vector width; 65,536 f32 elements of an f32
// x, or the register path's widest layouts for f16/bf16 x); rows 1 and many.
TEST_F(NormIrTest, MixedFormsMatchCpuAndTheCastsTheyReplace) {
  OpHarness h;
  uint64_t seed = 9700;
  const std::pair<DType, DType> forms[] = {{DType::bf16, DType::bf16}, {DType::f16, DType::f16},
                                           {DType::f32, DType::bf16},  {DType::f32, DType::f16},
                                           {DType::bf16, DType::f32},  {DType::f16, DType::f32}};
  for (const auto& [xt, yt] : forms) {
    for (const Shape& shape :
         {Shape{1, 96}, Shape{3000, 96}, Shape{257, 768}, Shape{33, 100}, Shape{2, 65536}}) {
      for (bool layer : {true, false}) {
        for (bool with_params : {true, false}) {
          SCOPED_TRACE(cat("x ", dtype_name(xt), " y ", dtype_name(yt), " ", shape_str(shape),
                           layer ? " layer_norm" : " rms_norm", with_params ? "" : " no params"));
          const int64_t cols = shape.back();
          const OpKind op = layer ? OpKind::layer_norm : OpKind::rms_norm;
          NormAttrs attrs{1, 1e-5};
          attrs.y_dtype = yt;
          std::vector<Tensor> in = {random_tensor(xt, shape, seed, 2.0, 4.0)};
          if (with_params) {
            in.push_back(random_tensor(DType::f32, {cols}, seed + 1, 0.5, 1.5));
            if (layer) in.push_back(random_tensor(DType::f32, {cols}, seed + 2));
          }
          seed += 3;
          const std::vector<Tensor> want = run_op(op, attrs, in);
          const std::vector<Tensor> got = h.run(layer ? &layer_norm : &rms_norm, op, attrs, in);
          ASSERT_EQ(got.size(), want.size());
          ASSERT_EQ(got[0].dtype(), yt);
          EXPECT_TRUE(close_to(got[0], want[0], 0.0, norm_tolerance(yt), ulps(yt))) << "y";
          for (size_t o = 1; o < got.size(); ++o)
            EXPECT_TRUE(close_to(got[o], want[o], 0.0, 1e-5, 1e-5)) << "statistic " << o;
          // (Rows of 16,384 f32 elements and more take the staged path in the plain form,
          // which the mixed form has not: another order of sums there too.)
          if (xt != DType::f32 || cols >= 16384) continue;
          // What the fold replaced: the f32 norm, then a cast, on the GPU.
          std::vector<Tensor> plain_in = in;
          const NormAttrs plain{1, 1e-5};
          const std::vector<Tensor> plain_out =
              h.run(layer ? &layer_norm : &rms_norm, op, plain, plain_in);
          EXPECT_TRUE(fusebox::testing::all_close(got[0], plain_out[0].cast(yt), 0, 0))
              << "y differs from the plain f32 norm's, rounded";
        }
      }
    }
  }
}

TEST_F(NormIrTest, BackwardOpsRejectBadStatistics) {
  OpHarness h;
  const NormAttrs attrs{1, 1e-5};
  Tensor x = random_tensor(DType::f32, {4, 8}, 1), dy = random_tensor(DType::f32, {4, 8}, 2);
  const std::vector<Tensor> stats = run_op(OpKind::rms_norm, attrs, {x, Tensor()});
  const BuiltNode built = build_node(OpKind::rms_norm_backward, attrs, {dy, x, Tensor(), stats[1]});
  DeviceTensor dyd = h.upload(dy), xd = h.upload(x);
  DeviceTensor bad = h.upload(random_tensor(DType::f32, {3, 1}, 3));  // 3 statistics, 4 rows
  EXPECT_THROW(h.run_device(KernelEntry(&rms_norm_backward), built, {&dyd, &xd, nullptr, &bad}),
               Error);
}

}  // namespace
}  // namespace fusebox::cuda::testing
