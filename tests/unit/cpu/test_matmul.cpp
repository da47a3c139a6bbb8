// matmul and gemm on the CPU backend against naive f64 triple loops.
#include <cmath>

#include "ops_test_util.h"

namespace fusebox::testing {
namespace {

// Products accumulate in f32 for f32/f16/bf16: allow K roundings' worth.
Tolerance product_tolerance(DType t, int64_t k) {
  Tolerance tol = tolerance(t);
  if (t == DType::f32) tol = {1e-6 * double(k), 1e-6 * double(k)};
  return tol;
}

// numpy matmul reference: promote 1-D operands, broadcast batch dims, loop.
std::vector<double> matmul_reference(const Tensor& a, const Tensor& b, Shape* out_shape) {
  Shape sa = a.shape(), sb = b.shape();
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch;
  EXPECT_TRUE(broadcast_shapes(ba, bb, &batch));
  std::vector<double> y;
  for (int64_t i = 0; i < numel(batch); ++i) {
    const std::vector<int64_t> c = unravel(i, batch);
    const int64_t ia = broadcast_index(c, ba), ib = broadcast_index(c, bb);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < n; ++col) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += a.get(ia * m * k + r * k + p) * b.get(ib * k * n + p * n + col);
        y.push_back(s);
      }
  }
  *out_shape = batch;
  if (a.rank() > 1) out_shape->push_back(m);
  if (b.rank() > 1) out_shape->push_back(n);
  return y;
}

TEST(CpuMatmul, NumpySemanticsForEveryFloatType) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 4}, {4, 5}},          {{4}, {4, 5}},       {{3, 4}, {4}},    {{4}, {4}},
      {{2, 1, 3, 4}, {3, 4, 5}}, {{5, 3, 4}, {4, 2}}, {{3}, {2, 3, 2}}, {{2, 3, 7}, {1, 7, 1}},
      {{1, 1}, {1, 1}},
  };
  uint64_t seed = 1;
  for (DType t : kFloatTypes) {
    for (const auto& [sa, sb] : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(sa), " @ ", shape_str(sb)));
      Tensor a = random_tensor(t, sa, seed++);
      Tensor b = random_tensor(t, sb, seed++);
      Shape out_shape;
      const std::vector<double> want = matmul_reference(a, b, &out_shape);
      const Tolerance tol = product_tolerance(t, sa.back());
      EXPECT_TRUE(all_close(run_op(OpKind::matmul, {}, {a, b})[0], expected(t, out_shape, want),
                            tol.rtol, tol.atol));
    }
  }
}

TEST(CpuMatmul, LargerThanOneGemmBlock) {
  // Odd extents past the GEMM's register and cache blocks, with a broadcast batch.
  Tensor a = random_tensor(DType::f32, {2, 67, 301}, 3);
  Tensor b = random_tensor(DType::f32, {301, 45}, 4);
  Shape out_shape;
  const std::vector<double> want = matmul_reference(a, b, &out_shape);
  const Tolerance tol = product_tolerance(DType::f32, 301);
  EXPECT_TRUE(all_close(run_op(OpKind::matmul, {}, {a, b})[0],
                        expected(DType::f32, out_shape, want), tol.rtol, tol.atol));
}

TEST(CpuMatmul, EmptyInnerDimGivesZeros) {
  Tensor a = Tensor::zeros(DType::f32, {2, 0});
  Tensor b = Tensor::zeros(DType::f32, {0, 3});
  EXPECT_TRUE(
      all_close(run_op(OpKind::matmul, {}, {a, b})[0], Tensor::zeros(DType::f32, {2, 3}), 0, 0));
}

// ---- gemm ------------------------------------------------------------------------

TEST(CpuGemm, TransposesAlphaBetaAndBroadcastC) {
  const int64_t m = 5, k = 7, n = 3;
  const std::vector<Shape> c_shapes = {{}, {n}, {m, 1}, {m, n}, {1, n}};
  uint64_t seed = 40;
  for (DType t : kFloatTypes) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        for (size_t ci = 0; ci <= c_shapes.size(); ++ci) {  // the last: no C
          const bool has_c = ci < c_shapes.size();
          SCOPED_TRACE(cat(dtype_name(t), " trans_a ", trans_a, " trans_b ", trans_b, " C ",
                           has_c ? shape_str(c_shapes[ci]) : "none"));
          Tensor a = random_tensor(t, trans_a ? Shape{k, m} : Shape{m, k}, seed++);
          Tensor b = random_tensor(t, trans_b ? Shape{n, k} : Shape{k, n}, seed++);
          Tensor c = has_c ? random_tensor(t, c_shapes[ci], seed++) : Tensor();
          const GemmAttrs attrs{trans_a, trans_b, 0.75, -1.5};
          std::vector<double> want;
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double s = 0;
              for (int64_t p = 0; p < k; ++p)
                s +=
                    a.get(trans_a ? p * m + i : i * k + p) * b.get(trans_b ? j * k + p : p * n + j);
              double y = attrs.alpha * s;
              if (has_c) y += attrs.beta * c.get(broadcast_index({i, j}, c.shape()));
              want.push_back(y);
            }
          std::vector<Tensor> inputs = {a, b};
          if (has_c) inputs.push_back(c);
          const Tolerance tol = product_tolerance(t, k);
          EXPECT_TRUE(all_close(run_op(OpKind::gemm, attrs, inputs)[0], expected(t, {m, n}, want),
                                tol.rtol, tol.atol));
        }
      }
    }
  }
}

TEST(CpuGemm, BetaZeroIgnoresC) {
  Tensor a = Tensor::from_doubles(DType::f32, {1, 2}, {1, 2});
  Tensor b = Tensor::from_doubles(DType::f32, {2, 1}, {3, 4});
  Tensor c = Tensor::from_doubles(DType::f32, {1, 1}, {100});
  EXPECT_TRUE(all_close(run_op(OpKind::gemm, GemmAttrs{false, false, 2.0, 0.0}, {a, b, c})[0],
                        Tensor::from_doubles(DType::f32, {1, 1}, {22}), 0, 0));
}

}  // namespace
}  // namespace fusebox::testing
