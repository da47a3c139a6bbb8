// The blocked GEMM (src/backends/cpu/gemm.h) against a plain triple loop in long
// double: every transpose combination, odd sizes, sizes past the cache blocks (M > 96,
// K > 256, N > 512), padded leading dimensions, alpha/beta, beta == 0 over NaN
// garbage, K == 0, and the batched form with a broadcast operand.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/gemm.h"
#include "testing.h"

namespace fusebox::cpu {
namespace {

template <class T>
struct GemmCase {
  bool trans_a = false, trans_b = false;
  int64_t m = 1, n = 1, k = 1, lda = 1, ldb = 1, ldc = 1;
  T alpha = 1, beta = 0;
};

template <class T>
std::vector<T> random_values(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  std::vector<T> v(count);
  for (auto& x : v) x = T(d(rng));
  return v;
}

// C = alpha * op(A) op(B) + beta * C, the definition, accumulated in long double.
template <class T>
std::vector<T> reference_gemm(const GemmCase<T>& g, const std::vector<T>& a,
                              const std::vector<T>& b, std::vector<T> c) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      long double sum = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        T av = g.trans_a ? a[size_t(p * g.lda + i)] : a[size_t(i * g.lda + p)];
        T bv = g.trans_b ? b[size_t(j * g.ldb + p)] : b[size_t(p * g.ldb + j)];
        sum += (long double)av * bv;
      }
      T& out = c[size_t(i * g.ldc + j)];
      long double prior = g.beta == T(0) ? 0.0L : (long double)g.beta * out;
      out = T((long double)g.alpha * sum + prior);
    }
  }
  return c;
}

// Runs one case and compares every element of C (including the padding columns,
// which must be left alone).
template <class T>
::testing::AssertionResult check_gemm(const GemmCase<T>& g, uint64_t seed) {
  const int64_t a_rows = g.trans_a ? g.k : g.m, b_rows = g.trans_b ? g.n : g.k;
  std::vector<T> a = random_values<T>(size_t(a_rows * g.lda), seed);
  std::vector<T> b = random_values<T>(size_t(b_rows * g.ldb), seed + 1);
  std::vector<T> c = random_values<T>(size_t(g.m * g.ldc), seed + 2);
  std::vector<T> c_in = c;
  if (g.beta == T(0)) {  // C must not be read: NaN garbage in the product's part
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j)
        c_in[size_t(i * g.ldc + j)] = std::numeric_limits<T>::quiet_NaN();
  }
  std::vector<T> expected = reference_gemm(g, a, b, c);
  blas_gemm<T>(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a.data(), g.lda, b.data(), g.ldb,
               g.beta, c_in.data(), g.ldc);
  // Each element sums k products of values in [-1, 1].
  const double tol = 4.0 * double(std::numeric_limits<T>::epsilon()) * double(g.k + 2);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.ldc; ++j) {
      const size_t at = size_t(i * g.ldc + j);
      const double got = double(c_in[at]), want = double(expected[at]);
      if (!(std::fabs(got - want) <= tol)) {
        return ::testing::AssertionFailure()
               << "m=" << g.m << " n=" << g.n << " k=" << g.k << " trans_a=" << g.trans_a
               << " trans_b=" << g.trans_b << " lda=" << g.lda << " ldb=" << g.ldb
               << " ldc=" << g.ldc << " alpha=" << g.alpha << " beta=" << g.beta << ": C[" << i
               << "][" << j << "] = " << got << ", expected " << want;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

template <class T>
void run_gemm_sweep() {
  const int64_t sizes[][3] = {{1, 1, 1},      {1, 7, 3},      {5, 1, 9},     {7, 13, 5},
                              {6, 16, 1},     {13, 31, 33},   {97, 17, 11},  {3, 130, 300},
                              {100, 70, 257}, {200, 530, 40}, {37, 600, 520}};
  uint64_t seed = 1;
  for (const auto& s : sizes) {
    for (int t = 0; t < 4; ++t) {
      for (int variant = 0; variant < 2; ++variant) {
        GemmCase<T> g;
        g.trans_a = (t & 1) != 0;
        g.trans_b = (t & 2) != 0;
        g.m = s[0];
        g.n = s[1];
        g.k = s[2];
        // Variant 1 pads every leading dimension and uses alpha/beta; variant 0 is
        // the tight layout with beta = 0 over NaN garbage.
        const int64_t pad = variant == 1 ? 3 : 0;
        g.lda = (g.trans_a ? g.m : g.k) + pad;
        g.ldb = (g.trans_b ? g.k : g.n) + pad;
        g.ldc = g.n + pad;
        g.alpha = variant == 1 ? T(-0.75) : T(1);
        g.beta = variant == 1 ? T(0.5) : T(0);
        EXPECT_TRUE(check_gemm(g, seed += 3));
      }
    }
  }
}

TEST(CpuBlasGemm, MatchesTripleLoopF32) {
  run_gemm_sweep<float>();
}
TEST(CpuBlasGemm, MatchesTripleLoopF64) {
  run_gemm_sweep<double>();
}

TEST(CpuBlasGemm, EmptyReductionScalesC) {
  std::vector<double> c = {1, 2, 3, 4, 5, 6};
  blas_gemm<double>(false, false, 2, 3, 0, 1.0, nullptr, 1, nullptr, 3, 2.0, c.data(), 3);
  EXPECT_EQ(c, (std::vector<double>{2, 4, 6, 8, 10, 12}));
  std::vector<float> nan_c(6, std::numeric_limits<float>::quiet_NaN());
  blas_gemm<float>(true, true, 2, 3, 0, 1.0f, nullptr, 2, nullptr, 1, 0.0f, nan_c.data(), 3);
  EXPECT_EQ(nan_c, std::vector<float>(6, 0.0f));
}

TEST(CpuBlasGemm, ExactSmallProduct) {
  // [[1, 2], [3, 4]] x [[5, 6], [7, 8]] = [[19, 22], [43, 50]]; with A and B given
  // transposed the same numbers come out.
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, at = {1, 3, 2, 4}, bt = {5, 7, 6, 8};
  std::vector<float> c(4);
  blas_gemm<float>(false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{19, 22, 43, 50}));
  blas_gemm<float>(true, true, 2, 2, 2, 1.0f, at.data(), 2, bt.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{19, 22, 43, 50}));
}

TEST(CpuBlasGemm, BatchedWithBroadcastOperand) {
  // Three products sharing one B (stride 0): C_i = A_i B.
  const int64_t batch = 3, m = 11, n = 29, k = 19;
  std::vector<double> a = random_values<double>(size_t(batch * m * k), 7);
  std::vector<double> b = random_values<double>(size_t(k * n), 8);
  std::vector<double> c(size_t(batch * m * n), std::numeric_limits<double>::quiet_NaN());
  blas_gemm_batched<double>(batch, false, false, m, n, k, 1.0, a.data(), k, m * k, b.data(), n, 0,
                            0.0, c.data(), n, m * n);
  for (int64_t i = 0; i < batch; ++i) {
    GemmCase<double> g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = k;
    g.ldb = n;
    g.ldc = n;
    std::vector<double> a_i(a.begin() + i * m * k, a.begin() + (i + 1) * m * k);
    std::vector<double> expected =
        reference_gemm(g, a_i, b, std::vector<double>(size_t(m * n), 0.0));
    for (int64_t j = 0; j < m * n; ++j)
      ASSERT_NEAR(c[size_t(i * m * n + j)], expected[size_t(j)], 1e-13) << "batch " << i;
  }
}

}  // namespace
}  // namespace fusebox::cpu
