#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "fusebox/core/parallel.h"
#include "fusebox/core/tensor.h"

namespace fusebox {
namespace {

TEST(Shape, Basics) {
  EXPECT_EQ(numel({}), 1);
  EXPECT_EQ(numel({2, 0, 3}), 0);
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
  Shape out;
  ASSERT_TRUE(broadcast_shapes({3, 1, 5}, {4, 1}, &out));
  EXPECT_EQ(out, (Shape{3, 4, 5}));
  ASSERT_TRUE(broadcast_shapes({}, {2, 2}, &out));
  EXPECT_EQ(out, (Shape{2, 2}));
  EXPECT_FALSE(broadcast_shapes({3}, {4}, &out));
  int64_t a;
  EXPECT_TRUE(normalize_axis(-1, 4, &a));
  EXPECT_EQ(a, 3);
  EXPECT_FALSE(normalize_axis(4, 4, &a));
  EXPECT_FALSE(normalize_axis(-5, 4, &a));
}

TEST(Tensor, CreateAndAccess) {
  Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.dim(-1), 3);
  EXPECT_EQ(t.get(4), 5.0);
  t.set(4, 7.5);
  EXPECT_EQ(t.data<float>()[4], 7.5f);
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(t.dim(2), Error);
  EXPECT_THROW(Tensor::from_vector<float>({2, 2}, {1, 2, 3}), Error);
  EXPECT_THROW(Tensor::empty(DType::f32, {2, -1}), Error);
  Tensor z = Tensor::zeros(DType::i64, {0, 4});
  EXPECT_TRUE(z.defined());
  EXPECT_EQ(z.numel(), 0);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, FullSetsEveryElementOfEveryDtype) {
  for (DType dtype :
       {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i64, DType::i32, DType::boolean}) {
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      const double value = dtype == DType::boolean ? 1.0 : -3.0;
      Tensor t = Tensor::full(dtype, {n}, value);
      ASSERT_EQ(t.numel(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(t.get(i), value) << dtype_name(dtype) << " of " << n << " at " << i;
    }
  }
  EXPECT_EQ(Tensor::scalar(DType::f32, 2.5).get(0), 2.5);
}

TEST(Tensor, OwnershipCopySharesCloneDoesNot) {
  Tensor a = Tensor::full(DType::f32, {4}, 1.0);
  Tensor shared = a;
  Tensor own = a.clone();
  a.set(0, 9.0);
  EXPECT_EQ(shared.get(0), 9.0);
  EXPECT_EQ(own.get(0), 1.0);
  Tensor view = a.reshaped({2, 2});
  EXPECT_EQ(view.get(0), 9.0);
  EXPECT_THROW(a.reshaped({3}), Error);
}

TEST(Tensor, CastRoundsAndTruncates) {
  Tensor f = Tensor::from_vector<float>({5}, {1.5f, -2.7f, 3.9f, 0.0f, 1.0f + 1.0f / 2048});
  Tensor i = f.cast(DType::i32);
  EXPECT_EQ(i.get(0), 1);
  EXPECT_EQ(i.get(1), -2);
  EXPECT_EQ(i.get(2), 3);
  Tensor b = f.cast(DType::boolean);
  EXPECT_EQ(b.get(3), 0);
  EXPECT_EQ(b.get(1), 1);
  Tensor h = f.cast(DType::f16);
  EXPECT_EQ(h.data<Half>()[4].bits, 0x3c00);  // tie rounds to even
  Tensor nan = Tensor::from_vector<float>({1}, {NAN}).cast(DType::i64);
  EXPECT_EQ(nan.get(0), 0);
}

// cast() converts each dtype pair in one typed loop over the pool's chunks: every pair must give
// the bits of the element-wise set(get(i)) path (the double one), on values that round
// differently (ties, subnormals, overflow, NaN, infinities) and across chunk boundaries.
TEST(Tensor, CastMatchesTheElementwisePathForEveryDtypePair) {
  const int64_t n = (int64_t(1) << 19) + 37;  // more than one chunk, a ragged last one
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f + 1.0f / 2048,
                            1.0f + 3.0f / 2048,
                            1.00390625f,
                            65519.0f,
                            65520.0f,
                            1e-8f,
                            -3.5f,
                            2.5f,
                            1e30f,
                            -1e30f,
                            NAN,
                            -NAN,
                            INFINITY,
                            -INFINITY,
                            5.9604645e-8f,
                            3e9f,
                            -3e9f,
                            0.5f};
  std::vector<float> values(static_cast<size_t>(n));
  uint32_t state = 12345;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float r = float(state >> 8) / float(1 << 24);  // [0, 1)
    values[size_t(i)] =
        (i % 7 == 0) ? specials[(i / 7) % std::size(specials)] : (r - 0.5f) * float(1 << (i % 31));
  }
  const Tensor source = Tensor::from_vector<float>({n}, values);
  for (int a = 0; a < kNumDTypes; ++a) {
    const Tensor from = source.cast(DType(a));  // itself checked as the pair (f32, a) below
    for (int b = 0; b < kNumDTypes; ++b) {
      const Tensor fast = from.cast(DType(b));
      Tensor slow = Tensor::empty(DType(b), {n});
      for (int64_t i = 0; i < n; ++i) slow.set(i, from.get(i));
      ASSERT_EQ(std::memcmp(fast.raw(), slow.raw(), fast.nbytes()), 0)
          << dtype_name(DType(a)) << " -> " << dtype_name(DType(b));
    }
  }
}

TEST(Tensor, PoisonMakesFloatsNaN) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Tensor x = Tensor::zeros(t, {3});
    x.poison();
    EXPECT_TRUE(std::isnan(x.get(1))) << dtype_name(t);
  }
}

TEST(Parallel, CoversEveryIndexOnce) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    parallel_for(n, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(Parallel, NestedCallsAndExceptions) {
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(100, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 800);
  EXPECT_THROW(parallel_for(1000, 1,
                            [&](int64_t, int64_t e) {
                              if (e == 1000) throw std::runtime_error("last chunk failed");
                            }),
               std::runtime_error);
}

}  // namespace
}  // namespace fusebox
