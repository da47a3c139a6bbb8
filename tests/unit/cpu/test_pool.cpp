// CPU pooling kernels against their definitions (plain loops over every window tap)
// over seeded random configurations (1-3 spatial dims, stride, dilation, asymmetric
// pads, ceil_mode, count_include_pad both ways, indices; f64 f32 bf16 f16), hand-worked
// examples of the ceil_mode / padding rules, and the ONNX node test data.
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "conv_reference.h"

namespace fusebox::cpu::test {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

struct PoolCase {
  Shape x;
  PoolAttrs attrs;  // every vector filled to the spatial rank
  DType dtype = DType::f32;

  int64_t rank() const { return int64_t(x.size()) - 2; }
  // [N, C, O...]: floor or ceil, and with ceil_mode no window starting in the end padding.
  Shape y() const {
    Shape y = {x[0], x[1]};
    for (int64_t d = 0; d < rank(); ++d) {
      const int64_t padded = x[2 + d] + attrs.pads_begin[d] + attrs.pads_end[d];
      const int64_t span = padded - (attrs.dilations[d] * (attrs.kernel[d] - 1) + 1);
      int64_t last = span / attrs.strides[d];
      if (attrs.ceil_mode && span % attrs.strides[d] != 0 &&
          (last + 1) * attrs.strides[d] < x[2 + d] + attrs.pads_begin[d])
        ++last;
      y.push_back(last + 1);
    }
    return y;
  }
  std::string describe() const {
    std::ostringstream os;
    os << dtype_name(dtype) << " x " << shape_str(x) << " kernel " << shape_str(attrs.kernel)
       << " strides " << shape_str(attrs.strides) << " dilations " << shape_str(attrs.dilations)
       << " pads " << shape_str(attrs.pads_begin) << "/" << shape_str(attrs.pads_end)
       << (attrs.ceil_mode ? " ceil" : "") << (attrs.count_include_pad ? " include_pad" : "");
    return os.str();
  }
};

// Calls window(y_index, taps) for every output, where taps lists, for each tap of the
// window, its flat index into x or -1 when it lies in the begin/end padding, or -2 when
// it lies past the end padding (a ceil_mode window reaching beyond it).
template <class F>
void for_each_window(const PoolCase& c, F&& window) {
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, dil{1, 1, 1},
      pb{0, 0, 0}, pe{0, 0, 0};
  const Shape y = c.y();
  for (int64_t d = 0; d < c.rank(); ++d) {
    const int64_t i = 3 - c.rank() + d;
    in[i] = c.x[2 + d];
    out[i] = y[2 + d];
    k[i] = c.attrs.kernel[d];
    s[i] = c.attrs.strides[d];
    dil[i] = c.attrs.dilations[d];
    pb[i] = c.attrs.pads_begin[d];
    pe[i] = c.attrs.pads_end[d];
  }
  int64_t y_index = 0;
  std::vector<int64_t> taps;
  for (int64_t plane = 0; plane < c.x[0] * c.x[1]; ++plane)
    for (int64_t o0 = 0; o0 < out[0]; ++o0)
      for (int64_t o1 = 0; o1 < out[1]; ++o1)
        for (int64_t o2 = 0; o2 < out[2]; ++o2) {
          taps.clear();
          for (int64_t j0 = 0; j0 < k[0]; ++j0)
            for (int64_t j1 = 0; j1 < k[1]; ++j1)
              for (int64_t j2 = 0; j2 < k[2]; ++j2) {
                const std::array<int64_t, 3> pos = {o0 * s[0] - pb[0] + j0 * dil[0],
                                                    o1 * s[1] - pb[1] + j1 * dil[1],
                                                    o2 * s[2] - pb[2] + j2 * dil[2]};
                bool in_bounds = true, past_end_padding = false;
                for (int d = 0; d < 3; ++d) {
                  in_bounds = in_bounds && pos[d] >= 0 && pos[d] < in[d];
                  past_end_padding = past_end_padding || pos[d] >= in[d] + pe[d];
                }
                taps.push_back(past_end_padding ? -2
                               : in_bounds
                                   ? ((plane * in[0] + pos[0]) * in[1] + pos[1]) * in[2] + pos[2]
                                   : -1);
              }
          window(y_index++, taps);
        }
}

// max over the in-bounds taps (the first of equal maxima) and its index.
void max_pool_reference(const PoolCase& c, const Tensor& x, Tensor* y, Tensor* indices) {
  for_each_window(c, [&](int64_t at, const std::vector<int64_t>& taps) {
    double best = -INFINITY;
    int64_t best_at = -1;
    for (int64_t t : taps)
      if (t >= 0 && (best_at < 0 || x.get(t) > best)) {
        best = x.get(t);
        best_at = t;
      }
    y->set(at, best);
    indices->set(at, double(best_at));
  });
}

// mean over the in-bounds taps, or over the taps not past the end padding.
Tensor avg_pool_reference(const PoolCase& c, const Tensor& x) {
  Tensor y = Tensor::zeros(DType::f64, c.y());
  for_each_window(c, [&](int64_t at, const std::vector<int64_t>& taps) {
    double sum = 0;
    int64_t in_bounds = 0, not_past_end = 0;
    for (int64_t t : taps) {
      if (t >= 0) {
        sum += x.get(t);
        ++in_bounds;
      }
      if (t != -2) ++not_past_end;
    }
    y.set(at, sum / double(c.attrs.count_include_pad ? not_past_end : in_bounds));
  });
  return y;
}

PoolCase random_pool_case(std::mt19937_64& rng, int64_t rank, DType dtype, bool is_max) {
  PoolCase c;
  c.dtype = dtype;
  c.x = {int64_t(1 + rng() % 2), int64_t(1 + rng() % 3)};
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t kernel = int64_t(1 + rng() % 3), stride = int64_t(1 + rng() % 3);
    const int64_t dilation = is_max ? int64_t(1 + rng() % 2) : 1;
    const int64_t reach = dilation * (kernel - 1) + 1;
    const int64_t pad_begin = int64_t(rng() % uint64_t(std::min<int64_t>(reach, 3)));
    const int64_t pad_end = int64_t(rng() % uint64_t(std::min<int64_t>(reach, 3)));
    const int64_t extra = int64_t(rng() % (rank == 3 ? 4 : 9));
    c.x.push_back(std::max<int64_t>(1, reach - pad_begin - pad_end + extra));
    c.attrs.kernel.push_back(kernel);
    c.attrs.strides.push_back(stride);
    c.attrs.dilations.push_back(dilation);
    c.attrs.pads_begin.push_back(pad_begin);
    c.attrs.pads_end.push_back(pad_end);
  }
  c.attrs.ceil_mode = rng() % 2 == 0;
  c.attrs.count_include_pad = !is_max && rng() % 2 == 0;
  c.attrs.return_indices = is_max && rng() % 3 != 0;
  return c;
}

constexpr DType kDTypes[] = {DType::f64, DType::f32, DType::bf16, DType::f16};

TEST(CpuPool, MaxPoolRandomConfigsMatchDefinition) {
  std::mt19937_64 rng(11);
  int ceil_windows_past_end = 0;
  for (int i = 0; i < 150; ++i) {
    const PoolCase c = random_pool_case(rng, 1 + i % 3, kDTypes[i % 4], true);
    SCOPED_TRACE(c.describe());
    // Integers in [-3, 3) make ties common: the first maximum must win.
    const Tensor x = random_tensor(c.dtype, c.x, uint64_t(i), -3, 3);
    const Tensor x_ints = Tensor::from_doubles(c.dtype, c.x, [&] {
      std::vector<double> v = x.to_doubles();
      if (i % 2 == 0)
        for (double& e : v) e = std::floor(e);
      return v;
    }());
    const std::vector<Tensor> got = run_op(OpKind::max_pool, c.attrs, {x_ints});
    Tensor want = Tensor::zeros(c.dtype, c.y()), want_indices = Tensor::zeros(DType::i64, c.y());
    max_pool_reference(c, x_ints, &want, &want_indices);
    EXPECT_TRUE(all_close(got[0], want, 0, 0));
    ASSERT_EQ(got.size(), c.attrs.return_indices ? 2u : 1u);
    if (c.attrs.return_indices) {
      EXPECT_TRUE(all_close(got[1], want_indices, 0, 0));
    }
    for_each_window(c, [&](int64_t, const std::vector<int64_t>& taps) {
      for (int64_t t : taps) ceil_windows_past_end += t == -2;
    });
  }
  EXPECT_GT(ceil_windows_past_end, 0) << "no configuration exercised ceil_mode's last window";
}

TEST(CpuPool, AvgPoolRandomConfigsMatchDefinition) {
  std::mt19937_64 rng(12);
  for (int i = 0; i < 150; ++i) {
    const PoolCase c = random_pool_case(rng, 1 + i % 3, kDTypes[i % 4], false);
    SCOPED_TRACE(c.describe());
    const Tensor x = random_tensor(c.dtype, c.x, uint64_t(i));
    const Tensor got = run_op(OpKind::avg_pool, c.attrs, {x})[0];
    ASSERT_EQ(got.dtype(), c.dtype);
    const double rtol = c.dtype == DType::f64   ? 1e-14
                        : c.dtype == DType::f32 ? 1e-6
                        : c.dtype == DType::f16 ? std::ldexp(1.0, -11)
                                                : std::ldexp(1.0, -8);
    EXPECT_TRUE(all_close(got.cast(DType::f64), avg_pool_reference(c, x), rtol, 1e-7));
  }
}

PoolCase make_pool(Shape x, PoolAttrs a, DType dtype = DType::f32) {
  const size_t rank = x.size() - 2;
  if (a.strides.empty()) a.strides.assign(rank, 1);
  if (a.dilations.empty()) a.dilations.assign(rank, 1);
  if (a.pads_begin.empty()) a.pads_begin.assign(rank, 0);
  if (a.pads_end.empty()) a.pads_end.assign(rank, 0);
  return PoolCase{std::move(x), std::move(a), dtype};
}

TEST(CpuPool, CeilModeLastWindowAndPadding) {
  // x = 1..6, kernel 3, stride 2, pads 1 / 1, ceil_mode: windows start at -1, 1, 3, 5;
  // the last covers x[5], one end-padding position and one position past the padding.
  const Tensor x = Tensor::from_vector<float>({1, 1, 6}, {1, 2, 3, 4, 5, 6});
  PoolAttrs a{.kernel = {3},
              .strides = {2},
              .dilations = {1},
              .pads_begin = {1},
              .pads_end = {1},
              .ceil_mode = true};
  EXPECT_TRUE(all_close(run_op(OpKind::avg_pool, a, {x})[0],
                        Tensor::from_vector<float>({1, 1, 4}, {1.5f, 3, 5, 6}), 0, 0));
  a.count_include_pad = true;  // divisors 3, 3, 3 and 2 (not the position past the padding)
  EXPECT_TRUE(all_close(run_op(OpKind::avg_pool, a, {x})[0],
                        Tensor::from_vector<float>({1, 1, 4}, {1, 3, 5, 3}), 0, 0));
  a.count_include_pad = false;
  a.return_indices = true;
  const std::vector<Tensor> m = run_op(OpKind::max_pool, a, {x});
  EXPECT_TRUE(all_close(m[0], Tensor::from_vector<float>({1, 1, 4}, {2, 4, 6, 6}), 0, 0));
  EXPECT_TRUE(all_close(m[1], Tensor::from_vector<int64_t>({1, 1, 4}, {1, 3, 5, 5}), 0, 0));
  // Without ceil_mode the last window is dropped.
  a.ceil_mode = false;
  EXPECT_EQ(run_op(OpKind::max_pool, a, {x})[0].shape(), (Shape{1, 1, 3}));
}

TEST(CpuPool, MaxPoolIndicesCoverBatchAndChannels) {
  // Indices are into the whole flattened x, [N, C, H, W] row-major.
  const Tensor x = random_tensor(DType::f32, {2, 3, 4, 4}, 5);
  const PoolCase c =
      make_pool({2, 3, 4, 4}, {.kernel = {2, 2}, .strides = {2, 2}, .return_indices = true});
  const std::vector<Tensor> got = run_op(OpKind::max_pool, c.attrs, {x});
  for (int64_t i = 0; i < got[1].numel(); ++i) {
    const int64_t index = int64_t(got[1].get(i));
    ASSERT_GE(index, 0);
    ASSERT_LT(index, x.numel());
    EXPECT_EQ(index / 16, i / 4) << "index " << index << " is outside output " << i << "'s plane";
    EXPECT_EQ(x.get(index), got[0].get(i));
  }
}

TEST(CpuPool, MaxPoolPropagatesNaN) {
  const Tensor x =
      Tensor::from_vector<float>({1, 1, 4}, {1, std::numeric_limits<float>::quiet_NaN(), 3, 2});
  const PoolCase c = make_pool({1, 1, 4}, {.kernel = {2}, .strides = {2}, .return_indices = true});
  const std::vector<Tensor> got = run_op(OpKind::max_pool, c.attrs, {x});
  EXPECT_TRUE(std::isnan(got[0].get(0)));
  EXPECT_EQ(got[1].get(0), 1);
  EXPECT_EQ(got[0].get(1), 3);
}

TEST(CpuPool, GlobalAvgPool) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (const Shape& shape : {Shape{2, 3, 5}, Shape{1, 4, 3, 7}, Shape{2, 2, 3, 2, 4}}) {
      const Tensor x = random_tensor(dtype, shape, 9);
      const Tensor y = run_op(OpKind::global_avg_pool, std::monostate{}, {x})[0];
      Shape want_shape(shape.size(), 1);
      want_shape[0] = shape[0];
      want_shape[1] = shape[1];
      const int64_t plane = x.numel() / (shape[0] * shape[1]);
      std::vector<double> want(size_t(shape[0] * shape[1]), 0.0);
      for (int64_t i = 0; i < x.numel(); ++i) want[size_t(i / plane)] += x.get(i) / double(plane);
      EXPECT_TRUE(all_close(y, Tensor::from_doubles(dtype, want_shape, want),
                            dtype == DType::bf16 ? 1.0 / 128 : 1e-6, 1e-7))
          << dtype_name(dtype) << " " << shape_str(shape);
    }
  }
}

TEST(CpuPool, OnnxNodeTestData) {
  struct OnnxCase {
    const char* name;
    OpKind op;
    PoolAttrs attrs;
  };
  const OnnxCase cases[] = {
      {"test_averagepool_1d_default", OpKind::avg_pool, {.kernel = {2}}},
      {"test_averagepool_2d_ceil",
       OpKind::avg_pool,
       {.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = true}},
      {"test_averagepool_2d_pads",
       OpKind::avg_pool,
       {.kernel = {3, 3}, .pads_begin = {2, 2}, .pads_end = {2, 2}}},
      {"test_averagepool_2d_pads_count_include_pad",
       OpKind::avg_pool,
       {.kernel = {3, 3}, .pads_begin = {2, 2}, .pads_end = {2, 2}, .count_include_pad = true}},
      {"test_averagepool_2d_precomputed_pads_count_include_pad",
       OpKind::avg_pool,
       {.kernel = {5, 5}, .pads_begin = {2, 2}, .pads_end = {2, 2}, .count_include_pad = true}},
      {"test_averagepool_2d_same_lower",
       OpKind::avg_pool,
       {.kernel = {2, 2}, .pads_begin = {1, 1}, .pads_end = {0, 0}}},
      {"test_averagepool_2d_same_upper",
       OpKind::avg_pool,
       {.kernel = {2, 2}, .pads_begin = {0, 0}, .pads_end = {1, 1}}},
      {"test_averagepool_2d_strides", OpKind::avg_pool, {.kernel = {5, 5}, .strides = {3, 3}}},
      {"test_averagepool_3d_default", OpKind::avg_pool, {.kernel = {2, 2, 2}}},
      {"test_maxpool_1d_default", OpKind::max_pool, {.kernel = {2}}},
      {"test_maxpool_2d_ceil",
       OpKind::max_pool,
       {.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = true}},
      {"test_maxpool_2d_dilations", OpKind::max_pool, {.kernel = {2, 2}, .dilations = {2, 2}}},
      {"test_maxpool_2d_pads",
       OpKind::max_pool,
       {.kernel = {3, 3}, .pads_begin = {2, 2}, .pads_end = {2, 2}}},
      {"test_maxpool_2d_precomputed_same_upper",
       OpKind::max_pool,
       {.kernel = {3, 3}, .strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}}},
      {"test_maxpool_3d_default", OpKind::max_pool, {.kernel = {2, 2, 2}}},
      {"test_maxpool_with_argmax_2d_precomputed_pads",
       OpKind::max_pool,
       {.kernel = {5, 5}, .pads_begin = {2, 2}, .pads_end = {2, 2}, .return_indices = true}},
      {"test_globalaveragepool", OpKind::global_avg_pool, {}},
      {"test_globalaveragepool_precomputed", OpKind::global_avg_pool, {}},
  };
  for (const OnnxCase& oc : cases) {
    SCOPED_TRACE(oc.name);
    std::vector<Tensor> in, out;
    if (!load_onnx_node_test(oc.name, &in, &out)) GTEST_SKIP() << "no ONNX test data";
    const std::vector<Tensor> got =
        oc.op == OpKind::global_avg_pool
            ? run_op(oc.op, std::monostate{}, {in[0]})
            : run_op(oc.op, make_pool(in[0].shape(), oc.attrs).attrs, {in[0]});
    ASSERT_EQ(got.size(), out.size());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(all_close(got[i], out[i], 1e-5, 1e-6));
  }
}

}  // namespace
}  // namespace fusebox::cpu::test
