// Reductions, softmax / log_softmax and cross_entropy on the CPU backend against
// naive f64 loops.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops_test_util.h"

namespace fusebox::testing {
namespace {

// Output shape and values of a reduction over `axes` (sorted, non-negative;
// empty = all); `combine` folds the f64 values of each group, given as a vector.
std::vector<double> reduce_reference(const Tensor& x, const std::vector<int64_t>& axes,
                                     bool keepdims, Shape* out_shape,
                                     const std::function<double(const std::vector<double>&)>& f) {
  const Shape& s = x.shape();
  auto reduced = [&](size_t d) {
    return axes.empty() || std::find(axes.begin(), axes.end(), int64_t(d)) != axes.end();
  };
  Shape kept;  // the output with keepdims, for indexing
  for (size_t d = 0; d < s.size(); ++d) kept.push_back(reduced(d) ? 1 : s[d]);
  std::vector<std::vector<double>> groups(size_t(numel(kept)));
  for (int64_t i = 0; i < x.numel(); ++i) {
    std::vector<int64_t> c = unravel(i, s);
    for (size_t d = 0; d < s.size(); ++d)
      if (reduced(d)) c[d] = 0;
    groups[size_t(ravel(c, kept))].push_back(x.get(i));
  }
  out_shape->clear();
  for (size_t d = 0; d < s.size(); ++d)
    if (!reduced(d) || keepdims) out_shape->push_back(kept[d]);
  std::vector<double> y;
  for (const auto& g : groups) y.push_back(f(g));
  return y;
}

double sum_of(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double mean_of(const std::vector<double>& g) {
  return sum_of(g) / double(g.size());
}
double max_of(const std::vector<double>& g) {
  return *std::max_element(g.begin(), g.end());
}

TEST(CpuReduce, SumMeanMaxOverAxesWithAndWithoutKeepdims) {
  const Shape shape = {2, 3, 4, 5};
  const std::vector<std::vector<int64_t>> axes_cases = {{0}, {3}, {1, 2}, {0, 2}, {1, 3}, {}};
  const std::vector<std::pair<OpKind, double (*)(const std::vector<double>&)>> ops = {
      {OpKind::reduce_sum, sum_of}, {OpKind::reduce_mean, mean_of}, {OpKind::reduce_max, max_of}};
  uint64_t seed = 1;
  for (DType t : kFloatTypes) {
    for (const auto& [op, f] : ops) {
      for (const auto& axes : axes_cases) {
        for (bool keepdims : {true, false}) {
          SCOPED_TRACE(cat(dtype_name(t), " ", op_name(op), " axes ", shape_str(axes), " keepdims ",
                           keepdims));
          Tensor x = random_tensor(t, shape, seed++, -2, 3);
          Shape out_shape;
          const std::vector<double> want = reduce_reference(x, axes, keepdims, &out_shape, f);
          Tensor y = run_op(op, ReduceAttrs{axes, keepdims}, {x})[0];
          EXPECT_TRUE(close_to(y, t, out_shape, want));
        }
      }
    }
  }
}

TEST(CpuReduce, NegativeAxesAreNormalised) {
  Tensor x = random_tensor(DType::f64, {3, 4, 5}, 3);
  Shape out_shape;
  const std::vector<double> want = reduce_reference(x, {0, 2}, false, &out_shape, sum_of);
  EXPECT_TRUE(close_to(run_op(OpKind::reduce_sum, ReduceAttrs{{-1, 0}, false}, {x})[0], DType::f64,
                       out_shape, want));
}

TEST(CpuReduce, LargeReductionsInParallel) {
  Tensor x = random_tensor(DType::f32, {129, 513}, 5);
  for (const std::vector<int64_t>& axes : {std::vector<int64_t>{0}, std::vector<int64_t>{1}}) {
    Shape out_shape;
    const std::vector<double> want = reduce_reference(x, axes, true, &out_shape, sum_of);
    EXPECT_TRUE(close_to(run_op(OpKind::reduce_sum, ReduceAttrs{axes, true}, {x})[0], DType::f32,
                         out_shape, want, 10));
  }
}

TEST(CpuReduce, IntegerSumAndMax) {
  for (DType t : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_label(t));
    Tensor x = random_tensor(t, {3, 4, 2}, 9, -50, 50);
    for (const auto& [op, f] :
         {std::pair{OpKind::reduce_sum, &sum_of}, std::pair{OpKind::reduce_max, &max_of}}) {
      Shape out_shape;
      const std::vector<double> want = reduce_reference(x, {1}, false, &out_shape, f);
      EXPECT_TRUE(all_close(run_op(op, ReduceAttrs{{1}, false}, {x})[0],
                            Tensor::from_doubles(t, out_shape, want), 0, 0))
          << op_name(op);
    }
  }
}

TEST(CpuReduce, MaxPropagatesNaNAndScalarInputReducesToItself) {
  Tensor x = Tensor::from_doubles(DType::f32, {2, 3}, {1, NAN, 2, 3, 4, 5});
  Tensor y = run_op(OpKind::reduce_max, ReduceAttrs{{1}, false}, {x})[0];
  EXPECT_TRUE(std::isnan(y.get(0)));
  EXPECT_EQ(y.get(1), 5.0);
  Tensor s = Tensor::scalar(DType::f32, 4.5);
  EXPECT_TRUE(all_close(run_op(OpKind::reduce_sum, ReduceAttrs{{}, true}, {s})[0], s, 0, 0));
}

// ---- softmax -------------------------------------------------------------------

// Softmax (or log-softmax) of x along `axis`, stably, in f64.
std::vector<double> softmax_reference(const Tensor& x, int64_t axis, bool log) {
  const Shape& s = x.shape();
  std::vector<double> y(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    std::vector<int64_t> c = unravel(i, s);
    double m = -INFINITY, sum = 0;
    for (c[size_t(axis)] = 0; c[size_t(axis)] < s[size_t(axis)]; ++c[size_t(axis)])
      m = std::max(m, x.get(ravel(c, s)));
    for (c[size_t(axis)] = 0; c[size_t(axis)] < s[size_t(axis)]; ++c[size_t(axis)])
      sum += std::exp(x.get(ravel(c, s)) - m);
    y[size_t(i)] = log ? x.get(i) - m - std::log(sum) : std::exp(x.get(i) - m) / sum;
  }
  return y;
}

TEST(CpuSoftmax, EveryAxisAndFloatType) {
  const Shape shape = {2, 3, 5};
  uint64_t seed = 30;
  for (DType t : kFloatTypes) {
    for (int64_t axis : {0, 1, 2}) {
      for (OpKind op : {OpKind::softmax, OpKind::log_softmax}) {
        SCOPED_TRACE(cat(dtype_name(t), " ", op_name(op), " axis ", axis));
        Tensor x = random_tensor(t, shape, seed++, -4, 4);
        EXPECT_TRUE(close_to(run_op(op, SoftmaxAttrs{axis}, {x})[0], t, shape,
                             softmax_reference(x, axis, op == OpKind::log_softmax)));
      }
    }
  }
}

TEST(CpuSoftmax, LargeValuesDoNotOverflow) {
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(dtype_label(t));
    Tensor x = Tensor::from_doubles(t, {2, 3}, {1000, 1001, 1002, -3e4, 3e4, 3e4});
    Tensor y = run_op(OpKind::softmax, SoftmaxAttrs{-1}, {x})[0];
    Tensor ly = run_op(OpKind::log_softmax, SoftmaxAttrs{-1}, {x})[0];
    EXPECT_TRUE(close_to(y, t, {2, 3}, softmax_reference(x, 1, false)));
    EXPECT_TRUE(close_to(ly, t, {2, 3}, softmax_reference(x, 1, true)));
    EXPECT_NEAR(y.get(4), 0.5, 1e-2);
    EXPECT_EQ(y.get(3), 0.0);
  }
}

// ---- cross_entropy -------------------------------------------------------------

struct CrossEntropyCase {
  Shape logits;
  std::vector<int64_t> labels;
};

TEST(CpuCrossEntropy, ReductionsIgnoreIndexAndWeights) {
  const std::vector<CrossEntropyCase> cases = {
      {{4, 5}, {0, 4, -1, 2}},                 // N, C
      {{2, 3, 4}, {0, 1, 2, -1, 2, 2, 0, 1}},  // N, C, D
      {{1, 3, 2, 2}, {2, -1, 1, 0}},           // N, C, D1, D2
  };
  uint64_t seed = 70;
  for (DType t : {DType::f32, DType::f64, DType::f16}) {
    for (DType label_type : {DType::i64, DType::i32}) {
      for (const CrossEntropyCase& c : cases) {
        for (bool weighted : {false, true}) {
          for (Reduction red : {Reduction::none, Reduction::sum, Reduction::mean}) {
            SCOPED_TRACE(cat(dtype_name(t), " labels ", dtype_name(label_type), " logits ",
                             shape_str(c.logits), " weighted ", weighted, " reduction ", int(red)));
            const int64_t classes = c.logits[1];
            Shape label_shape = c.logits;
            label_shape.erase(label_shape.begin() + 1);
            Tensor logits = random_tensor(t, c.logits, seed++, -3, 3);
            std::vector<double> label_values(c.labels.begin(), c.labels.end());
            Tensor labels = Tensor::from_doubles(label_type, label_shape, label_values);
            Tensor weight = weighted ? random_tensor(t, {classes}, seed++, 0.2, 2) : Tensor();
            std::vector<Tensor> out =
                run_op(OpKind::cross_entropy, CrossEntropyAttrs{red, -1}, {logits, labels, weight});
            ASSERT_EQ(out.size(), 2u);

            const std::vector<double> log_prob = softmax_reference(logits, 1, true);
            std::vector<double> loss;
            double total = 0, total_weight = 0;
            for (int64_t p = 0; p < labels.numel(); ++p) {
              const int64_t l = c.labels[size_t(p)];
              if (l == -1) {
                loss.push_back(0);
                continue;
              }
              std::vector<int64_t> lc = unravel(p, label_shape);
              lc.insert(lc.begin() + 1, l);
              const double w = weighted ? weight.get(l) : 1.0;
              loss.push_back(-w * log_prob[size_t(ravel(lc, c.logits))]);
              total += loss.back();
              total_weight += w;
            }
            EXPECT_TRUE(close_to(out[1], t, c.logits, log_prob));
            if (red == Reduction::none) {
              EXPECT_TRUE(close_to(out[0], t, label_shape, loss));
            } else {
              const double want = red == Reduction::sum ? total : total / total_weight;
              EXPECT_TRUE(close_to(out[0], t, {}, {want}, 2));
            }
          }
        }
      }
    }
  }
}

TEST(CpuCrossEntropy, LabelOutOfRangeNamesNodeLabelAndPosition) {
  Tensor logits = random_tensor(DType::f32, {2, 3, 2}, 1);
  for (int64_t bad : {3, -2}) {
    Tensor labels = Tensor::from_vector<int64_t>({2, 2}, {0, 1, bad, 2});
    try {
      run_op(OpKind::cross_entropy, CrossEntropyAttrs{Reduction::mean, -1}, {logits, labels});
      FAIL() << "expected an error for label " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.where(), "cross_entropy 'node'");
      EXPECT_NE(msg.find(cat("label ", bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("[1, 0]"), std::string::npos) << msg;
    }
  }
  // Without ignore_index, -1 is just out of range.
  Tensor labels = Tensor::from_vector<int32_t>({2, 2}, {0, -1, 1, 2});
  EXPECT_THROW(run_op(OpKind::cross_entropy, CrossEntropyAttrs{Reduction::sum, std::nullopt},
                      {logits, labels}),
               Error);
}

TEST(CpuCrossEntropy, AllIgnoredMeanIsNaNAndSumIsZero) {
  Tensor logits = random_tensor(DType::f32, {2, 3}, 2);
  Tensor labels = Tensor::from_vector<int64_t>({2}, {7, 7});
  EXPECT_TRUE(std::isnan(
      run_op(OpKind::cross_entropy, CrossEntropyAttrs{Reduction::mean, 7}, {logits, labels})[0].get(
          0)));
  EXPECT_EQ(
      run_op(OpKind::cross_entropy, CrossEntropyAttrs{Reduction::sum, 7}, {logits, labels})[0].get(
          0),
      0.0);
}

}  // namespace
}  // namespace fusebox::testing
