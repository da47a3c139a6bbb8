// gather / gather_backward, gather_elements, cumsum, the comparisons, logic ops and where on
// the CPU backend against naive index loops and hand-worked values, and their errors (an
// index out of range names its position).
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops_test_util.h"

namespace fusebox::testing {
namespace {

TEST(CpuGather, EveryAxisAgainstIndexLoops) {
  const Tensor data = random_tensor(DType::f32, {3, 4, 5}, 1);
  for (int64_t axis : {0, 1, 2}) {
    SCOPED_TRACE(cat("axis ", axis));
    const int64_t extent = data.shape()[size_t(axis)];
    const Tensor idx = Tensor::from_vector<int32_t>({2, 2}, {0, int32_t(extent - 1), -1, 1});
    const Tensor y = run_op(OpKind::gather, GatherAttrs{axis}, {data, idx})[0];
    Shape want_shape = data.shape();
    want_shape.erase(want_shape.begin() + axis);
    want_shape.insert(want_shape.begin() + axis, {2, 2});
    ASSERT_EQ(y.shape(), want_shape);
    for (int64_t i = 0; i < y.numel(); ++i) {
      // y's coordinates: [outer..., j0, j1, inner...]
      Shape c(want_shape.size());
      int64_t rem = i;
      for (size_t d = c.size(); d-- > 0;) {
        c[d] = rem % want_shape[d];
        rem /= want_shape[d];
      }
      int64_t k = int64_t(idx.get(c[size_t(axis)] * 2 + c[size_t(axis) + 1]));
      if (k < 0) k += extent;
      Shape src(c.begin(), c.begin() + axis);
      src.push_back(k);
      src.insert(src.end(), c.begin() + axis + 2, c.end());
      const int64_t flat = (src[0] * 4 + src[1]) * 5 + src[2];
      ASSERT_EQ(y.get(i), data.get(flat)) << "element " << i;
    }
  }
}

TEST(CpuGather, ScalarIndexDropsTheAxis) {
  const Tensor data = random_tensor(DType::i64, {3, 4}, 2, -50, 50);
  const Tensor y =
      run_op(OpKind::gather, GatherAttrs{1}, {data, Tensor::from_vector<int64_t>({}, {-2})})[0];
  ASSERT_EQ(y.shape(), (Shape{3}));
  for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(y.get(r), data.get(r * 4 + 2));
}

TEST(CpuGather, IndexOutOfRangeNamesItsPosition) {
  const Tensor data = random_tensor(DType::f32, {5, 3}, 3);
  try {
    run_op(OpKind::gather, GatherAttrs{0},
           {data, Tensor::from_vector<int64_t>({2, 2}, {0, 4, -6, 1})});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "index -6 at position [1, 0] of input 1 (indices) is outside [-5, 5)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuGather, BackwardSumsRepeatedIndices) {
  const Tensor dy = random_tensor(DType::f32, {2, 3, 2}, 4);
  const Tensor idx = Tensor::from_vector<int64_t>({3}, {2, 0, -2});  // -2 is 2 again (extent 4)
  const Tensor dx =
      run_op(OpKind::gather_backward, GatherBackwardAttrs{GatherAttrs{1}, {2, 4, 2}}, {dy, idx})[0];
  ASSERT_EQ(dx.shape(), (Shape{2, 4, 2}));
  for (int64_t o = 0; o < 2; ++o) {
    for (int64_t i = 0; i < 2; ++i) {
      auto g = [&](int64_t j) { return dy.get((o * 3 + j) * 2 + i); };
      auto d = [&](int64_t k) { return dx.get((o * 4 + k) * 2 + i); };
      EXPECT_FLOAT_EQ(d(0), g(1));
      EXPECT_EQ(d(1), 0.0);
      EXPECT_FLOAT_EQ(d(2), float(g(0) + g(2)));
      EXPECT_EQ(d(3), 0.0);
    }
  }
}

TEST(CpuGather, GatherElementsIsTorchGather) {
  // torch.gather(x, 1, idx): y[i][j] = x[i][idx[i][j]]; indices shorter than x along dim 0.
  const Tensor x = Tensor::from_vector<float>({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  const Tensor idx = Tensor::from_vector<int32_t>({2, 4}, {2, 0, -1, 1, 1, 1, 0, 2});
  EXPECT_EQ(run_op(OpKind::gather_elements, GatherAttrs{1}, {x, idx})[0].to_doubles(),
            (std::vector<double>{3, 1, 3, 2, 5, 5, 4, 6}));
  // Along dim 0: y[i][j] = x[idx[i][j]][j].
  const Tensor rows = Tensor::from_vector<int64_t>({1, 3}, {2, 0, 1});
  EXPECT_EQ(run_op(OpKind::gather_elements, GatherAttrs{0}, {x, rows})[0].to_doubles(),
            (std::vector<double>{7, 2, 6}));
  // The backward adds the repeated reads: x[0][2] is read twice above, x[1][1] twice.
  const Tensor dy = Tensor::from_vector<float>({2, 4}, {1, 2, 4, 8, 16, 32, 64, 128});
  EXPECT_EQ(run_op(OpKind::gather_elements_backward, GatherBackwardAttrs{GatherAttrs{1}, {3, 3}},
                   {dy, idx})[0]
                .to_doubles(),
            (std::vector<double>{2, 8, 5, 64, 48, 128, 0, 0, 0}));
  try {
    run_op(OpKind::gather_elements, GatherAttrs{0},
           {x, Tensor::from_vector<int64_t>({1, 3}, {0, 3, 0})});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 3 at position [0, 1] of input 1 (indices) is "
                                         "outside [-3, 3)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuCumSum, ExclusiveAndReverse) {
  const Tensor x = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 10, 20, 30});
  struct Case {
    bool exclusive, reverse;
    std::vector<double> want;
  };
  for (const Case& c :
       {Case{false, false, {1, 3, 6, 10, 30, 60}}, Case{true, false, {0, 1, 3, 0, 10, 30}},
        Case{false, true, {6, 5, 3, 60, 50, 30}}, Case{true, true, {5, 3, 0, 50, 30, 0}}}) {
    SCOPED_TRACE(cat("exclusive ", c.exclusive, " reverse ", c.reverse));
    const CumSumAttrs a{.axis = -1, .exclusive = c.exclusive, .reverse = c.reverse};
    EXPECT_EQ(run_op(OpKind::cumsum, a, {x})[0].to_doubles(), c.want);
  }
  // Along dim 0, and integers wrap: INT32_MAX + 1 is INT32_MIN.
  const Tensor i = Tensor::from_vector<int32_t>({2, 2}, {2147483647, 5, 1, -7});
  EXPECT_EQ(run_op(OpKind::cumsum, CumSumAttrs{}, {i})[0].to_doubles(),
            (std::vector<double>{2147483647, 5, -2147483648.0, -2}));
}

TEST(CpuCumSum, HalfPrecisionRoundsEachOutputOnce) {
  // A running sum kept in bf16 would stick at 256 (256 + 1 rounds back to 256); the f64 sum
  // rounded once gives 257 -> 256 (a tie, to even) and 259 -> 260.
  const Tensor x = Tensor::full(DType::bf16, {259}, 1.0);
  const std::vector<double> y = run_op(OpKind::cumsum, CumSumAttrs{}, {x})[0].to_doubles();
  EXPECT_EQ(y[255], 256.0);
  EXPECT_EQ(y[256], 256.0);
  EXPECT_EQ(y[258], 260.0);
}

// top_k: hand-worked rows: ties keep the lower index first, NaN is above every number
// (first for largest, last for smallest), -0 equals +0.
TEST(CpuTopK, TiesNaNAndBothDirections) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = Tensor::from_doubles(DType::f32, {2, 6},
                                        {3, 1, nan, 3, -0.0, 0.0,  //
                                         2, 2, 2, 1, 5, -1});
  const auto largest = run_op(OpKind::top_k, TopKAttrs{.k = 4}, {x});
  EXPECT_EQ(largest[1].to_doubles(), (std::vector<double>{2, 0, 3, 1, 4, 0, 1, 2}));
  const std::vector<double> v = largest[0].to_doubles();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(std::vector<double>(v.begin() + 1, v.end()),
            (std::vector<double>{3, 3, 1, 5, 2, 2, 2}));
  const auto smallest = run_op(OpKind::top_k, TopKAttrs{.k = 6, .largest = false}, {x});
  EXPECT_EQ(smallest[1].to_doubles(), (std::vector<double>{4, 5, 1, 0, 3, 2, 5, 3, 0, 1, 2, 4}));
  EXPECT_EQ(largest[0].dtype(), DType::f32);
  EXPECT_EQ(largest[1].dtype(), DType::i64);
}

TEST(CpuTopK, MiddleAxisAgainstSortedCopies) {
  const Tensor x = random_tensor(DType::f32, {3, 7, 4}, 5);
  const auto out = run_op(OpKind::top_k, TopKAttrs{.k = 3, .axis = 1}, {x});
  ASSERT_EQ(out[0].shape(), (Shape{3, 3, 4}));
  for (int64_t o = 0; o < 3; ++o) {
    for (int64_t i = 0; i < 4; ++i) {
      std::vector<std::pair<double, int64_t>> row;
      for (int64_t j = 0; j < 7; ++j) row.push_back({x.get((o * 7 + j) * 4 + i), j});
      std::stable_sort(row.begin(), row.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      for (int64_t t = 0; t < 3; ++t) {
        EXPECT_EQ(out[0].get((o * 3 + t) * 4 + i), row[size_t(t)].first);
        EXPECT_EQ(out[1].get((o * 3 + t) * 4 + i), double(row[size_t(t)].second));
      }
    }
  }
  // Integers, and k = 0 (empty outputs).
  const Tensor ints = Tensor::from_vector<int64_t>({5}, {7, -3, 7, 100, -3});
  EXPECT_EQ(run_op(OpKind::top_k, TopKAttrs{.k = 3, .largest = false}, {ints})[1].to_doubles(),
            (std::vector<double>{1, 4, 0}));
  EXPECT_EQ(run_op(OpKind::top_k, TopKAttrs{.k = 0}, {ints})[0].numel(), 0);
}

TEST(CpuTopK, BadKNamesTheNode) {
  const Tensor x = random_tensor(DType::f32, {2, 3}, 1);
  for (int64_t k : {-1, 4}) {
    try {
      run_op(OpKind::top_k, TopKAttrs{.k = k}, {x});
      ADD_FAILURE() << "k " << k << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("outside [0, 3]"), std::string::npos) << e.what();
    }
  }
}

TEST(CpuLogic, ComparisonsBroadcastAndNaNComparesFalse) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor a = Tensor::from_doubles(DType::bf16, {2, 1}, {1.0, nan});
  const Tensor b = Tensor::from_doubles(DType::bf16, {3}, {0.5, 1.0, 2.0});
  struct Case {
    OpKind op;
    std::vector<double> want;  // row 0: 1 vs (0.5, 1, 2); row 1: NaN vs them, all false
  };
  for (const Case& c :
       {Case{OpKind::equal, {0, 1, 0, 0, 0, 0}}, Case{OpKind::less, {0, 0, 1, 0, 0, 0}},
        Case{OpKind::greater, {1, 0, 0, 0, 0, 0}}, Case{OpKind::less_equal, {0, 1, 1, 0, 0, 0}},
        Case{OpKind::greater_equal, {1, 1, 0, 0, 0, 0}}}) {
    SCOPED_TRACE(op_name(c.op));
    EXPECT_TRUE(all_close(run_op(c.op, {}, {a, b})[0],
                          Tensor::from_doubles(DType::boolean, {2, 3}, c.want), 0, 0));
  }
}

TEST(CpuLogic, IntegersCompareExactly) {
  // 2^53 + 1 and 2^53 are one apart, but equal as doubles.
  const int64_t big = (int64_t(1) << 53) + 1;
  const Tensor a = Tensor::from_vector<int64_t>({2}, {big, big - 1});
  const Tensor b = Tensor::from_vector<int64_t>({1}, {big - 1});
  EXPECT_TRUE(all_close(run_op(OpKind::equal, {}, {a, b})[0],
                        Tensor::from_doubles(DType::boolean, {2}, {0, 1}), 0, 0));
  EXPECT_TRUE(all_close(run_op(OpKind::greater, {}, {a, b})[0],
                        Tensor::from_doubles(DType::boolean, {2}, {1, 0}), 0, 0));
}

TEST(CpuLogic, LogicOpsTruthTables) {
  const Tensor p = Tensor::from_doubles(DType::boolean, {4}, {0, 0, 1, 1});
  const Tensor q = Tensor::from_doubles(DType::boolean, {4}, {0, 1, 0, 1});
  auto is = [](const Tensor& t, std::vector<double> want) {
    return all_close(t, Tensor::from_doubles(DType::boolean, {int64_t(want.size())}, want), 0, 0);
  };
  EXPECT_TRUE(is(run_op(OpKind::logical_not, {}, {p})[0], {1, 1, 0, 0}));
  EXPECT_TRUE(is(run_op(OpKind::logical_and, {}, {p, q})[0], {0, 0, 0, 1}));
  EXPECT_TRUE(is(run_op(OpKind::logical_or, {}, {p, q})[0], {0, 1, 1, 1}));
  EXPECT_TRUE(is(run_op(OpKind::logical_xor, {}, {p, q})[0], {0, 1, 1, 0}));
  EXPECT_TRUE(is(run_op(OpKind::equal, {}, {p, q})[0], {1, 0, 0, 1}));
}

TEST(CpuLogic, WhereBroadcastsAllThree) {
  const Tensor cond = Tensor::from_doubles(DType::boolean, {2, 1}, {1, 0});
  const Tensor a = Tensor::from_vector<int32_t>({3}, {1, 2, 3});
  const Tensor b = Tensor::from_vector<int32_t>({}, {-7});
  EXPECT_TRUE(all_close(run_op(OpKind::where, {}, {cond, a, b})[0],
                        Tensor::from_vector<int32_t>({2, 3}, {1, 2, 3, -7, -7, -7}), 0, 0));
}

TEST(CpuLogic, BadOperandsNameTheNode) {
  const Tensor f = random_tensor(DType::f32, {2}, 5);
  const Tensor i = Tensor::from_vector<int64_t>({2}, {1, 2});
  EXPECT_THROW(run_op(OpKind::logical_and, {}, {f, f}), Error);         // not bool
  EXPECT_THROW(run_op(OpKind::less, {}, {f, i}), Error);                // dtypes differ
  EXPECT_THROW(run_op(OpKind::where, {}, {f, f, f}), Error);            // condition not bool
  EXPECT_THROW(run_op(OpKind::gather, GatherAttrs{0}, {f, f}), Error);  // float indices
}

}  // namespace
}  // namespace fusebox::testing
