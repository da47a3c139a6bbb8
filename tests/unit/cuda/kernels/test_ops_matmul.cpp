// CUDA matmul and gemm (cuBLASLt) against the CPU backend: plain, odd and 1-row sizes,
// batch broadcasting (stride-0 batches, folded batches, outer loops), 1-D operands, K = 0,
// gemm transposes, alpha / beta and every broadcast of C; f32, f16, bf16 and f64;
// outputs poisoned first.
//
// Tolerances (relative L2 error): f32 2e-6 (cuBLASLt runs true f32 unless
// FUSEBOX_ALLOW_TF32_MATMUL=1, which these tests do not set), f16 2e-3 and bf16 1e-2 (the
// output's rounding), f64 1e-13; plus every element finite.
#include <cmath>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

double matmul_tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-13;
    case DType::f32:
      return 2e-6;
    case DType::f16:
      return 2e-3;
    default:
      return 1e-2;
  }
}

::testing::AssertionResult close_in_norm(const Tensor& got, const Tensor& want, double tol) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure()
           << "got " << dtype_name(got.dtype()) << " " << shape_str(got.shape()) << ", want "
           << dtype_name(want.dtype()) << " " << shape_str(want.shape());
  }
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i]))
      return ::testing::AssertionFailure() << "element " << i << " is " << g[i];
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  const double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative L2 error " << rel << " > " << tol;
}

class MatmulTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

struct MatmulCase {
  Shape a, b;
};

const MatmulCase kMatmulCases[] = {
    {{1, 1}, {1, 1}},
    {{7, 5}, {5, 3}},
    {{33, 129}, {129, 65}},
    {{128, 256}, {256, 64}},
    {{1, 300}, {300, 17}},         // one row
    {{2, 3, 9, 8}, {8, 10}},       // batch folds into M
    {{4, 9, 8}, {4, 8, 6}},        // plain batch
    {{2, 1, 5, 4}, {3, 4, 6}},     // a broadcasts over dim 1, b over dim 0
    {{5, 4}, {2, 3, 4, 7}},        // a (no batch) broadcast: stride 0
    {{3, 1, 6, 5}, {1, 2, 5, 4}},  // outer loop of batched calls
    {{16}, {16, 9}},               // 1-D a
    {{9, 16}, {16}},               // 1-D b
    {{16}, {16}},                  // dot product
    {{2, 3, 16}, {16}},            // batched matrix-vector
    {{6, 0}, {0, 4}},              // K = 0
};

TEST_F(MatmulTest, MatmulMatchesCpu) {
  OpHarness h;
  uint64_t seed = 1;
  for (DType t : kFloatTypes) {
    for (const MatmulCase& c : kMatmulCases) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.a), " x ", shape_str(c.b)));
      Tensor a = random_tensor(t, c.a, seed++), b = random_tensor(t, c.b, seed++);
      const std::vector<Tensor> want = run_op(OpKind::matmul, {}, {a, b});
      const std::vector<Tensor> got = h.run(&matmul, OpKind::matmul, {}, {a, b});
      EXPECT_TRUE(close_in_norm(got[0], want[0], matmul_tolerance(t)));
    }
  }
}

TEST_F(MatmulTest, MatmulOnUnalignedOperands) {
  // Views one element into their buffers: cuBLASLt must get plans for 2- or 4-byte
  // alignment, not the default 256.
  OpHarness h;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor base_a = random_tensor(t, {1 + 13 * 11}, 1), base_b = random_tensor(t, {1 + 11 * 9}, 2);
    Tensor a = gather(base_a, {13, 11}, {11, 1}, 1), b = gather(base_b, {11, 9}, {9, 1}, 1);
    const BuiltNode built = build_node(OpKind::matmul, {}, {a, b});
    DeviceTensor av = h.view(base_a, {13, 11}, {11, 1}, 1), bv = h.view(base_b, {11, 9}, {9, 1}, 1);
    const std::vector<Tensor> got = h.run_device(&matmul, built, {&av, &bv});
    EXPECT_TRUE(close_in_norm(got[0], run_op(OpKind::matmul, {}, {a, b})[0], matmul_tolerance(t)));
  }
}

struct GemmCase {
  int64_t m, n, k;
  bool trans_a, trans_b;
  double alpha, beta;
  Shape c;  // empty + no_c: no C
  bool has_c;
};

TEST_F(MatmulTest, GemmMatchesCpu) {
  OpHarness h;
  const GemmCase cases[] = {
      {7, 5, 3, false, false, 1.0, 1.0, {}, false},
      {7, 5, 3, true, false, 0.5, 1.0, {7, 5}, true},
      {7, 5, 3, false, true, 1.0, -2.0, {5}, true},
      {7, 5, 3, true, true, 2.0, 0.5, {7, 1}, true},
      {64, 96, 130, false, true, 1.0, 1.0, {1, 96}, true},
      {33, 17, 65, true, true, -1.0, 3.0, {}, true},    // scalar C
      {9, 4, 6, false, false, 1.0, 0.0, {9, 4}, true},  // beta 0: C ignored
      {5, 6, 0, false, false, 1.0, 2.0, {5, 6}, true},  // K = 0: y = beta * C
      {5, 6, 0, true, false, 1.0, 1.0, {}, false},      // K = 0, no C: zeros
      {1, 1, 1, false, false, 1.5, 1.0, {1, 1}, true},
  };
  uint64_t seed = 100;
  for (DType t : kFloatTypes) {
    for (const GemmCase& c : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " m ", c.m, " n ", c.n, " k ", c.k, " ta ", c.trans_a, " tb ",
                       c.trans_b, " alpha ", c.alpha, " beta ", c.beta, " C ",
                       c.has_c ? shape_str(c.c) : "none"));
      const GemmAttrs attrs{c.trans_a, c.trans_b, c.alpha, c.beta};
      Tensor a = random_tensor(t, c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}, seed++);
      Tensor b = random_tensor(t, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, seed++);
      Tensor cc = c.has_c ? random_tensor(t, c.c, seed++) : Tensor();
      std::vector<Tensor> inputs = {a, b};
      if (c.has_c) inputs.push_back(cc);
      const std::vector<Tensor> want = run_op(OpKind::gemm, attrs, inputs);
      const std::vector<Tensor> got = h.run(&gemm, OpKind::gemm, attrs, inputs);
      EXPECT_TRUE(close_in_norm(got[0], want[0], matmul_tolerance(t)));
    }
  }
}

// gemm's fused activation (GemmAttrs::activation): relu and gelu(tanh) as cuBLASLt epilogues
// (where it has an algorithm), the others by one pass after the GEMM; with and without C,
// transposed B (nn.Linear's layout) and K = 0.
TEST_F(MatmulTest, GemmActivationsMatchCpu) {
  OpHarness h;
  const FusedActivation activations[] = {
      {Activation::relu},    {Activation::gelu}, {Activation::gelu_tanh},       {Activation::silu},
      {Activation::sigmoid}, {Activation::tanh}, {Activation::clip, -0.25, 0.5}};
  const GemmCase cases[] = {
      {64, 96, 130, false, true, 1.0, 1.0, {96}, true},
      {7, 5, 3, false, false, 0.5, 1.0, {}, false},
      {5, 6, 0, false, false, 1.0, 2.0, {5, 6}, true},  // K = 0: activation(beta * C)
  };
  uint64_t seed = 500;
  for (DType t : kFloatTypes) {
    for (const FusedActivation& act : activations) {
      for (const GemmCase& c : cases) {
        SCOPED_TRACE(cat(dtype_name(t), " ", activation_name(act.kind), " m ", c.m, " n ", c.n,
                         " k ", c.k, " C ", c.has_c ? shape_str(c.c) : "none"));
        GemmAttrs attrs{c.trans_a, c.trans_b, c.alpha, c.beta};
        attrs.activation = act;
        Tensor a = random_tensor(t, Shape{c.m, c.k}, seed++, -2, 2);
        Tensor b = random_tensor(t, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, seed++);
        std::vector<Tensor> inputs = {a, b};
        if (c.has_c) inputs.push_back(random_tensor(t, c.c, seed++));
        const std::vector<Tensor> want = run_op(OpKind::gemm, attrs, inputs);
        const std::vector<Tensor> got = h.run(&gemm, OpKind::gemm, attrs, inputs);
        // f32: a few ulps of the activation's own formula on top of the product's.
        const double tol = t == DType::f32 ? 1e-5 : matmul_tolerance(t);
        EXPECT_TRUE(close_in_norm(got[0], want[0], tol));
      }
    }
  }
}

// A linear layer's bias ([N], beta 1) is cuBLASLt's BIAS epilogue (with RELU or GELU where
// gemm has that activation; the others after it): ViT-sized and odd problems, every float
// dtype but f64, each activation. A bias one element into its buffer (not 16-byte aligned)
// takes the copy-then-accumulate path and must give the same.
TEST_F(MatmulTest, GemmBiasEpilogueMatchesCpu) {
  OpHarness h;
  const FusedActivation activations[] = {
      {Activation::none}, {Activation::relu}, {Activation::gelu_tanh}, {Activation::gelu}};
  struct Size {
    int64_t m, n, k;
  };
  const Size sizes[] = {{256, 768, 768}, {197, 72, 40}, {3, 8, 5}};
  uint64_t seed = 900;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (const FusedActivation& act : activations) {
      for (const Size& z : sizes) {
        for (bool aligned : {true, false}) {
          SCOPED_TRACE(cat(dtype_name(t), " ", activation_name(act.kind), " m ", z.m, " n ", z.n,
                           " k ", z.k, aligned ? " aligned" : " bias one element in"));
          GemmAttrs attrs{false, true, 1.0, 1.0};
          attrs.activation = act;
          Tensor a = random_tensor(t, {z.m, z.k}, seed++, -2, 2);
          Tensor b = random_tensor(t, {z.n, z.k}, seed++);  // nn.Linear's [out, in]
          Tensor base = random_tensor(t, {1 + z.n}, seed++);
          Tensor bias = gather(base, {z.n}, {1}, aligned ? 0 : 1);
          const BuiltNode built = build_node(OpKind::gemm, attrs, {a, b, bias});
          DeviceTensor da = h.upload(a), db = h.upload(b);
          DeviceTensor dc = aligned ? h.upload(bias) : h.view(base, {z.n}, {1}, 1);
          const std::vector<Tensor> got = h.run_device(&gemm, built, {&da, &db, &dc});
          const std::vector<Tensor> want = run_op(OpKind::gemm, attrs, {a, b, bias});
          const double tol = t == DType::f32 ? 1e-5 : matmul_tolerance(t);
          EXPECT_TRUE(close_in_norm(got[0], want[0], tol));
        }
      }
    }
  }
}

// Products whose N is not a multiple of 16 bytes' elements, with enough flops to pay for the
// copies, run with N padded (matmul.cpp's record_padded): B [K, N] and nn.Linear's [N, K], an
// odd N with the bias epilogue and GELU; a transposed A of odd M (not padded). The products
// are too large for the CPU oracle whole: every element is checked finite (outputs are
// poisoned) and 48 rows spread over Y against the oracle's product of those rows of op(A).
TEST_F(MatmulTest, UnalignedColumnCountsRunPadded) {
  OpHarness h;
  struct Case {
    int64_t m, n, k;
    bool trans_a, trans_b, bias;
    FusedActivation act;
  };
  const Case cases[] = {
      {2048, 1025, 1024, false, false, false, {}},                      // B [K, N]
      {2048, 1025, 1024, false, true, false, {}},                       // B [N, K]
      {1025, 1024, 2048, true, false, false, {}},                       // A [K, M]: as it is
      {2048, 1027, 1024, false, false, true, {Activation::gelu_tanh}},  // bias + GELU epilogue
  };
  uint64_t seed = 1300;
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " m ", c.m, " n ", c.n, " k ", c.k, " ta ", c.trans_a,
                       " bias ", c.bias));
      GemmAttrs attrs{c.trans_a, c.trans_b, 1.0, c.bias ? 1.0 : 0.0};
      attrs.activation = c.act;
      Tensor a = random_tensor(t, c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}, seed++);
      Tensor b = random_tensor(t, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, seed++);
      std::vector<Tensor> inputs = {a, b};
      if (c.bias) inputs.push_back(random_tensor(t, {c.n}, seed++));
      const Tensor got = h.run(&gemm, OpKind::gemm, attrs, inputs)[0];
      const std::vector<double> y = got.to_doubles(), av = a.to_doubles();
      bool finite = true;
      for (double v : y) finite = finite && std::isfinite(v);
      EXPECT_TRUE(finite) << "an element of y is not finite (unwritten: poisoned)";
      // Rows of op(A) and the same rows of y.
      const int64_t rows = 48;
      std::vector<double> a_rows, y_rows;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = i * (c.m - 1) / (rows - 1);
        for (int64_t kk = 0; kk < c.k; ++kk)
          a_rows.push_back(c.trans_a ? av[size_t(kk * c.m + r)] : av[size_t(r * c.k + kk)]);
        y_rows.insert(y_rows.end(), y.begin() + r * c.n, y.begin() + (r + 1) * c.n);
      }
      std::vector<Tensor> sub = inputs;
      sub[0] = Tensor::from_doubles(t, {rows, c.k}, a_rows);
      GemmAttrs sub_attrs = attrs;
      sub_attrs.trans_a = false;
      const Tensor want = run_op(OpKind::gemm, sub_attrs, sub)[0];
      EXPECT_TRUE(close_in_norm(Tensor::from_doubles(t, {rows, c.n}, y_rows), want,
                                t == DType::f32 ? 1e-5 : matmul_tolerance(t)));
    }
  }
}

// gemm's mixed form (ir/ops.h GemmAttrs::y_dtype f32): bf16 / f16 operands, the f32
// accumulator stored: a small product (cuBLASLt on y's unaligned f32 rows), a padded one (N
// not a multiple of 8) in one block of rows, and one of 70,000 rows whose padded f32 product
// takes two blocks (matmul.cpp: kPadBlockBytes); the sampled rows span both blocks.
TEST_F(MatmulTest, MixedGemmStoresTheF32Accumulator) {
  OpHarness h;
  struct Case {
    int64_t m, n, k;
    bool trans_b;
  };
  const Case cases[] = {{33, 65, 129, false}, {2048, 1025, 1024, true}, {70000, 1025, 1024, false}};
  uint64_t seed = 1400;
  for (DType t : {DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " m ", c.m, " n ", c.n, " k ", c.k));
      GemmAttrs attrs{.trans_b = c.trans_b};
      attrs.y_dtype = DType::f32;
      const Tensor a = random_tensor(t, {c.m, c.k}, seed++);
      const Tensor b = random_tensor(t, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, seed++);
      const Tensor got = h.run(&gemm, OpKind::gemm, attrs, {a, b})[0];
      ASSERT_EQ(got.dtype(), DType::f32);
      const std::vector<double> y = got.to_doubles(), av = a.to_doubles();
      const int64_t rows = std::min<int64_t>(c.m, 48);
      std::vector<double> a_rows, y_rows;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = rows == 1 ? 0 : i * (c.m - 1) / (rows - 1);
        a_rows.insert(a_rows.end(), av.begin() + r * c.k, av.begin() + (r + 1) * c.k);
        y_rows.insert(y_rows.end(), y.begin() + r * c.n, y.begin() + (r + 1) * c.n);
      }
      const Tensor want =
          run_op(OpKind::gemm, attrs, {Tensor::from_doubles(t, {rows, c.k}, a_rows), b})[0];
      ASSERT_EQ(want.dtype(), DType::f32);
      // The f32 sums of the same operands, not rounded to t (whose unit is 4e-3 / 5e-4).
      EXPECT_TRUE(close_in_norm(Tensor::from_doubles(DType::f32, {rows, c.n}, y_rows), want, 1e-5));
    }
  }
}

TEST_F(MatmulTest, RepeatedShapesReuseThePlanAndStayCorrect) {
  OpHarness h;
  for (int step = 0; step < 3; ++step) {
    Tensor a = random_tensor(DType::bf16, {4, 64, 32}, 10 + step);
    Tensor b = random_tensor(DType::bf16, {4, 32, 48}, 20 + step);
    const std::vector<Tensor> got = h.run(&matmul, OpKind::matmul, {}, {a, b});
    EXPECT_TRUE(close_in_norm(got[0], run_op(OpKind::matmul, {}, {a, b})[0], 1e-2)) << step;
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
