// CUDA top_k (CUB's stable segmented sort on order-preserving keys) against the CPU backend,
// exactly: every dtype, first / middle / last axis, largest and smallest, rows with ties,
// NaN, -0 and infinities, one long row (100k elements) and many short ones, k = len, k = 0.
#include <cmath>
#include <limits>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

class TopKTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

void expect_matches_cpu(OpHarness& h, const Tensor& x, const TopKAttrs& a) {
  const std::vector<Tensor> got = h.run(top_k, OpKind::top_k, a, {x});
  const std::vector<Tensor> want = run_op(OpKind::top_k, a, {x});
  EXPECT_TRUE(all_close(got[0], want[0], 0, 0)) << "values";
  EXPECT_TRUE(all_close(got[1], want[1], 0, 0)) << "indices";
}

TEST_F(TopKTest, EveryDtypeAxisAndDirectionMatchesCpu) {
  OpHarness h;
  uint64_t seed = 1;
  for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32}) {
    for (int64_t axis : {0, 1, 2}) {
      for (bool largest : {true, false}) {
        SCOPED_TRACE(cat(dtype_name(t), " axis ", axis, largest ? " largest" : " smallest"));
        // Few distinct values (ties in every row) for the integer and 16-bit types.
        const Tensor x = random_tensor(t, {5, 9, 6}, seed++, -4, 4);
        const int64_t len = x.shape()[size_t(axis)];
        for (int64_t k : {int64_t(1), len / 2, len})
          expect_matches_cpu(h, x, TopKAttrs{.k = k, .axis = axis, .largest = largest});
      }
    }
  }
}

TEST_F(TopKTest, NaNInfinitiesAndSignedZeros) {
  OpHarness h;
  const double nan = std::numeric_limits<double>::quiet_NaN(),
               inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = Tensor::from_doubles(t, {2, 8},
                                          {nan, 1, -inf, inf, -0.0, 0.0, nan, -1,  //
                                           0.0, -0.0, 2, 2, -inf, -inf, inf, 1});
    for (bool largest : {true, false})
      expect_matches_cpu(h, x, TopKAttrs{.k = 8, .largest = largest});
  }
}

TEST_F(TopKTest, LongRowAndManyRows) {
  OpHarness h;
  const Tensor row = random_tensor(DType::f32, {1, 100000}, 7, -1, 1);
  expect_matches_cpu(h, row, TopKAttrs{.k = 1000});
  const Tensor logits = random_tensor(DType::bf16, {512, 1000}, 8, -3, 3);  // top-5 classes
  expect_matches_cpu(h, logits, TopKAttrs{.k = 5});
  expect_matches_cpu(h, logits, TopKAttrs{.k = 0});
}

}  // namespace
}  // namespace fusebox::cuda::testing
