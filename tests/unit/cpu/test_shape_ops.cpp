// Shape and data-movement ops on the CPU backend against naive index loops, and
// cast's rounding rules.
#include <cmath>
#include <limits>

#include "ops_test_util.h"

namespace fusebox::testing {
namespace {

// Exact equality (dtype, shape and every element) for data movement.
::testing::AssertionResult same(const Tensor& actual, const Tensor& want) {
  return all_close(actual, want, 0, 0);
}

// A tensor of `shape` whose element at flat index i is source.get(index(i)).
Tensor gather(const Tensor& source, const Shape& shape,
              const std::function<int64_t(int64_t)>& index, double fill = 0) {
  Tensor t = Tensor::empty(source.dtype(), shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t j = index(i);
    t.set(i, j < 0 ? fill : source.get(j));
  }
  return t;
}

TEST(CpuShapeOps, ReshapeFamilyCopiesTheBytes) {
  Tensor x = random_tensor(DType::f32, {2, 3, 4}, 1);
  EXPECT_TRUE(same(run_op(OpKind::reshape, ReshapeAttrs{{4, -1}}, {x})[0], x.reshaped({4, 6})));
  EXPECT_TRUE(same(run_op(OpKind::flatten, FlattenAttrs{2}, {x})[0], x.reshaped({6, 4})));
  Tensor ones = random_tensor(DType::i64, {1, 3, 1, 2}, 2, -9, 9);
  EXPECT_TRUE(same(run_op(OpKind::squeeze, AxesAttrs{}, {ones})[0], ones.reshaped({3, 2})));
  EXPECT_TRUE(same(run_op(OpKind::squeeze, AxesAttrs{{-2}}, {ones})[0], ones.reshaped({1, 3, 2})));
  Tensor h = random_tensor(DType::f16, {2, 3}, 3);
  EXPECT_TRUE(same(run_op(OpKind::unsqueeze, AxesAttrs{{0, 3}}, {h})[0], h.reshaped({1, 2, 3, 1})));
}

// y[c] = x[d] with d[perm[i]] = c[i].
Tensor transpose_reference(const Tensor& x, const std::vector<int64_t>& perm) {
  Shape out;
  for (int64_t p : perm) out.push_back(x.shape()[size_t(p)]);
  return gather(x, out, [&](int64_t i) {
    const std::vector<int64_t> c = unravel(i, out);
    std::vector<int64_t> d(c.size());
    for (size_t k = 0; k < perm.size(); ++k) d[size_t(perm[k])] = c[k];
    return ravel(d, x.shape());
  });
}

TEST(CpuShapeOps, TransposeRanksTwoToFive) {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2, 3, 4, 5}, {0, 2, 3, 1}},
      {{2, 3, 4, 5}, {3, 2, 1, 0}},
      {{2, 3, 4, 5}, {1, 0, 2, 3}},
      {{2, 3, 4, 5}, {0, 1, 2, 3}},
      {{2, 3, 1, 4, 3}, {4, 0, 3, 1, 2}},
      {{3, 2, 2, 3, 5}, {0, 1, 2, 4, 3}},
      {{7, 3}, {1, 0}},
      {{40, 70, 33}, {2, 0, 1}},  // large: threaded
  };
  uint64_t seed = 10;
  for (DType t : {DType::f32, DType::f16, DType::i64, DType::boolean}) {
    for (const auto& [shape, perm] : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape), " perm ", shape_str(perm)));
      Tensor x = random_tensor(t, shape, seed++, -100, 100);
      EXPECT_TRUE(same(run_op(OpKind::transpose, TransposeAttrs{perm}, {x})[0],
                       transpose_reference(x, perm)));
    }
  }
  Tensor x = random_tensor(DType::f32, {2, 3, 4}, 99);  // empty perm reverses
  EXPECT_TRUE(
      same(run_op(OpKind::transpose, TransposeAttrs{}, {x})[0], transpose_reference(x, {2, 1, 0})));
}

TEST(CpuShapeOps, ConcatAlongEachAxis) {
  const Shape base = {2, 3, 4};
  uint64_t seed = 20;
  for (DType t : {DType::f32, DType::i32, DType::bf16}) {
    for (int64_t axis : {0, 1, 2, -1}) {
      SCOPED_TRACE(cat(dtype_name(t), " axis ", axis));
      const size_t a = size_t(axis < 0 ? axis + 3 : axis);
      std::vector<Tensor> xs;
      for (int64_t i = 0; i < 3; ++i) {
        Shape s = base;
        s[a] = i + 1;
        xs.push_back(random_tensor(t, s, seed++, -50, 50));
      }
      Shape out = base;
      out[a] = 6;
      Tensor want = Tensor::empty(t, out);
      for (int64_t i = 0; i < want.numel(); ++i) {
        std::vector<int64_t> c = unravel(i, out);
        size_t k = 0;
        while (c[a] >= xs[k].shape()[a]) c[a] -= xs[k++].shape()[a];
        want.set(i, xs[k].get(ravel(c, xs[k].shape())));
      }
      EXPECT_TRUE(same(run_op(OpKind::concat, ConcatAttrs{axis}, xs)[0], want));
    }
  }
}

// ONNX Slice, straight from the spec: the indices taken along one dim.
std::vector<int64_t> slice_indices(int64_t dim, int64_t start, int64_t end, int64_t step) {
  start = start < 0 ? start + dim : start;
  end = end < 0 ? end + dim : end;
  std::vector<int64_t> idx;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    for (int64_t i = start; i < end; i += step) idx.push_back(i);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    for (int64_t i = start; i > end; i += step) idx.push_back(i);
  }
  return idx;
}

Tensor slice_reference(const Tensor& x, const SliceAttrs& a) {
  const Shape& s = x.shape();
  std::vector<std::vector<int64_t>> idx(s.size());
  for (size_t d = 0; d < s.size(); ++d)
    for (int64_t i = 0; i < s[d]; ++i) idx[d].push_back(i);
  for (size_t k = 0; k < a.starts.size(); ++k) {
    const int64_t axis = a.axes.empty() ? int64_t(k) : a.axes[k];
    const size_t d = size_t(axis < 0 ? axis + int64_t(s.size()) : axis);
    idx[d] = slice_indices(s[d], a.starts[k], a.ends[k], a.steps.empty() ? 1 : a.steps[k]);
  }
  Shape out;
  for (const auto& v : idx) out.push_back(int64_t(v.size()));
  return gather(x, out, [&](int64_t i) {
    std::vector<int64_t> c = unravel(i, out);
    for (size_t d = 0; d < c.size(); ++d) c[d] = idx[d][size_t(c[d])];
    return ravel(c, s);
  });
}

TEST(CpuShapeOps, SliceIncludingNegativeSteps) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<SliceAttrs> cases = {
      {{1}, {4}, {0}, {}},
      {{-1}, {kMin}, {1}, {-1}},            // reverse a whole dim
      {{5}, {0}, {2}, {-2}},                // stops before index 0
      {{0, -3}, {100, 5}, {2, 0}, {3, 1}},  // two axes, clamped end
      {{-100}, {kMax}, {-1}, {2}},
      {{100}, {-100}, {2}, {-3}},  // start clamped to dim - 1
      {{3}, {3}, {1}, {}},         // empty result
      {{4, 1, 6}, {0, 6, kMin}, {0, 1, 2}, {-1, 2, -4}},
  };
  uint64_t seed = 30;
  for (DType t : {DType::f32, DType::i64, DType::f16}) {
    for (const SliceAttrs& a : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " starts ", shape_str(a.starts), " ends ", shape_str(a.ends),
                       " axes ", shape_str(a.axes), " steps ", shape_str(a.steps)));
      Tensor x = random_tensor(t, {5, 6, 7}, seed++, -100, 100);
      EXPECT_TRUE(same(run_op(OpKind::slice, a, {x})[0], slice_reference(x, a)));
    }
  }
}

// Pad reference: per dim, position o reads x at o - before, mapped back inside
// by the mode (reflect mirrors about the edge element, edge clamps), or is the
// constant.
Tensor pad_reference(const Tensor& x, const PadAttrs& a) {
  const Shape& s = x.shape();
  const size_t r = s.size();
  Shape out(r);
  for (size_t d = 0; d < r; ++d) out[d] = s[d] + a.pads[d] + a.pads[r + d];
  return gather(
      x, out,
      [&](int64_t i) -> int64_t {
        std::vector<int64_t> c = unravel(i, out);
        for (size_t d = 0; d < r; ++d) {
          int64_t v = c[d] - a.pads[d];
          if (a.mode == PadMode::constant && (v < 0 || v >= s[d])) return -1;
          if (a.mode == PadMode::edge) v = std::clamp<int64_t>(v, 0, s[d] - 1);
          while (a.mode == PadMode::reflect && (v < 0 || v >= s[d]))
            v = v < 0 ? -v : 2 * (s[d] - 1) - v;
          c[d] = v;
        }
        return ravel(c, s);
      },
      a.value);
}

TEST(CpuShapeOps, PadConstantReflectEdgeAndCrop) {
  struct Case {
    Shape shape;
    std::vector<int64_t> pads;
  };
  const std::vector<Case> cases = {
      {{3, 4}, {1, 2, 2, 1}},
      {{3, 4}, {2, 3, 1, 3}},    // reflect's widest: extent - 1 per side
      {{3, 4}, {-1, 1, 0, -2}},  // crop and pad together
      {{3, 4}, {0, -1, -2, 0}},  // crop only
      {{2, 3, 5}, {1, 0, 2, 0, 2, 4}},
      {{6}, {3, 5}},
      {{1, 5}, {0, 2, 0, 2}},  // a dim of extent 1 left alone
  };
  uint64_t seed = 40;
  for (PadMode mode : {PadMode::constant, PadMode::reflect, PadMode::edge}) {
    for (DType t : {DType::f32, DType::i32, DType::f16}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(cat("mode ", int(mode), " ", dtype_name(t), " ", shape_str(c.shape), " pads ",
                         shape_str(c.pads)));
        const PadAttrs a{c.pads, mode, is_floating(t) ? 2.5 : -7.0};
        Tensor x = random_tensor(t, c.shape, seed++, -100, 100);
        EXPECT_TRUE(same(run_op(OpKind::pad, a, {x})[0], pad_reference(x, a)));
      }
    }
  }
}

TEST(CpuShapeOps, PadLargeTensorInParallel) {
  Tensor x = random_tensor(DType::f32, {3, 130, 129}, 5);
  const PadAttrs a{{0, 2, 3, 0, 1, -4}, PadMode::reflect, 0};
  EXPECT_TRUE(same(run_op(OpKind::pad, a, {x})[0], pad_reference(x, a)));
}

// ---- cast ----------------------------------------------------------------------

double cast_one(DType from, double v, DType to) {
  return run_op(OpKind::cast, CastAttrs{to}, {Tensor::from_doubles(from, {1}, {v})})[0].get(0);
}

TEST(CpuCast, FloatNarrowingRoundsToNearestEven) {
  const double u16 = std::ldexp(1.0, -10);  // f16 ulp at 1
  // f32 ties: 1 + ulp/2 goes down to 1 (even), 1 + 3 ulp/2 up to 1 + 2 ulp (even).
  EXPECT_EQ(cast_one(DType::f32, 1 + u16 / 2, DType::f16), 1.0);
  EXPECT_EQ(cast_one(DType::f32, 1 + 3 * u16 / 2, DType::f16), 1 + 2 * u16);
  // f64 just above the tie rounds up: no double rounding through f32.
  EXPECT_EQ(cast_one(DType::f64, 1 + u16 / 2 + std::ldexp(1.0, -40), DType::f16), 1 + u16);
  const double u8 = std::ldexp(1.0, -7);  // bf16 ulp at 1
  EXPECT_EQ(cast_one(DType::f32, 1 + u8 / 2, DType::bf16), 1.0);
  EXPECT_EQ(cast_one(DType::f32, 1 + 3 * u8 / 2, DType::bf16), 1 + 2 * u8);
  EXPECT_EQ(cast_one(DType::f64, 1 + std::ldexp(1.0, -30), DType::f32), 1.0);
  // Overflow to infinity, NaN stays NaN.
  EXPECT_EQ(cast_one(DType::f32, 70000, DType::f16), INFINITY);
  EXPECT_EQ(cast_one(DType::i64, 65519, DType::f16), 65504.0);
  EXPECT_TRUE(std::isnan(cast_one(DType::f32, NAN, DType::bf16)));
  // Widening is exact.
  EXPECT_EQ(cast_one(DType::f16, 1 + u16, DType::f64), 1 + u16);
}

TEST(CpuCast, FloatToIntegerTruncatesSaturatesAndMapsNaNToZero) {
  Tensor x = Tensor::from_doubles(DType::f32, {7}, {2.7, -2.7, 0.4, NAN, 1e10, -INFINITY, -0.0});
  EXPECT_TRUE(
      same(run_op(OpKind::cast, CastAttrs{DType::i32}, {x})[0],
           Tensor::from_vector<int32_t>({7}, {2, -2, 0, 0, std::numeric_limits<int32_t>::max(),
                                              std::numeric_limits<int32_t>::min(), 0})));
  EXPECT_TRUE(same(run_op(OpKind::cast, CastAttrs{DType::i64}, {x.cast(DType::bf16)})[0],
                   Tensor::from_vector<int64_t>({7}, {2, -2, 0, 0, 9999220736, INT64_MIN, 0})));
}

TEST(CpuCast, BoolAndIntegerConversions) {
  Tensor x = Tensor::from_doubles(DType::f32, {5}, {0, -0.0, 0.5, NAN, -3});
  EXPECT_TRUE(same(run_op(OpKind::cast, CastAttrs{DType::boolean}, {x})[0],
                   Tensor::from_doubles(DType::boolean, {5}, {0, 0, 1, 1, 1})));
  Tensor b = Tensor::from_doubles(DType::boolean, {3}, {1, 0, 1});
  EXPECT_TRUE(same(run_op(OpKind::cast, CastAttrs{DType::f16}, {b})[0],
                   Tensor::from_doubles(DType::f16, {3}, {1, 0, 1})));
  EXPECT_TRUE(same(run_op(OpKind::cast, CastAttrs{DType::i64}, {b})[0],
                   Tensor::from_vector<int64_t>({3}, {1, 0, 1})));
  // i64 -> i32 keeps the low 32 bits (two's complement wrap, as numpy).
  Tensor big = Tensor::from_vector<int64_t>({2}, {(int64_t(1) << 32) + 5, -1});
  EXPECT_TRUE(same(run_op(OpKind::cast, CastAttrs{DType::i32}, {big})[0],
                   Tensor::from_vector<int32_t>({2}, {5, -1})));
  // Same-type cast copies.
  Tensor r = random_tensor(DType::f64, {4, 3}, 8);
  EXPECT_TRUE(same(run_op(OpKind::cast, CastAttrs{DType::f64}, {r})[0], r));
}

TEST(CpuShapeOps, ConstantProducesItsValue) {
  Tensor v = random_tensor(DType::bf16, {3, 2}, 12);
  EXPECT_TRUE(same(run_op(OpKind::constant, ConstantAttrs{v}, {})[0], v));
}

}  // namespace
}  // namespace fusebox::testing
