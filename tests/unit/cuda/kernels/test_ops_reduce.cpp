// CUDA reductions, softmax / log_softmax and cross_entropy against the CPU backend:
// row, column, split and permuted reductions, rows of 1 and 65,536 elements, every float
// dtype (and integer sum / max), NaN and infinities, labels out of range reported through
// the error flags.
#include <cmath>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

class ReduceTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

struct ReduceCase {
  Shape shape;
  std::vector<int64_t> axes;
};

// Row, column, all, long rows (split), long columns (split), rows of 1, permuted layouts,
// extent-1 dims, an empty reduced dim (sum only).
const ReduceCase kReduceCases[] = {
    {{7, 13}, {1}},         {{7, 13}, {0}},         {{7, 13}, {}},
    {{1, 65536}, {1}},      {{3, 65536}, {1}},      {{65536, 3}, {0}},
    {{3, 70000, 2}, {1}},   {{4096, 1}, {1}},       {{2, 3, 4, 5}, {0, 2}},
    {{2, 3, 4, 5}, {1, 3}}, {{2, 3, 4, 5}, {1, 2}}, {{2, 1, 4, 1, 5}, {1, 3}},
    {{1000003}, {0}},       {{64, 1000}, {1}},      {{5, 3000}, {1}},
    {{1, 1, 1}, {0, 1, 2}}, {{300, 40, 50}, {0, 2}}};

double sum_atol(const Shape& shape, DType t) {
  // f32 accumulation vs the CPU's f64: error grows with the count summed.
  const double count = double(numel(shape));
  return tolerance_for(t).atol + 2e-7 * std::sqrt(count) * 4;
}

TEST_F(ReduceTest, FloatReductionsMatchCpu) {
  OpHarness h;
  uint64_t seed = 1;
  for (const ReduceCase& c : kReduceCases) {
    for (OpKind op : {OpKind::reduce_sum, OpKind::reduce_mean, OpKind::reduce_max}) {
      for (DType t : kFloatTypes) {
        for (bool keepdims : {true, false}) {
          SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t), " ", shape_str(c.shape), " axes ",
                           c.axes.size(), " keepdims ", keepdims));
          Tensor x = random_tensor(t, c.shape, seed++, -1, 2);
          ReduceAttrs attrs{c.axes, keepdims};
          const Tolerance tol = tolerance_for(t);
          EXPECT_TRUE(all_close(h.run(reduce, op, attrs, {x})[0], run_op(op, attrs, {x})[0],
                                tol.rtol, op == OpKind::reduce_max ? 0 : sum_atol(c.shape, t)));
        }
      }
    }
  }
}

TEST_F(ReduceTest, SumOverAnEmptyDimIsZero) {
  OpHarness h;
  Tensor x = Tensor::zeros(DType::f32, {5, 0, 3});
  ReduceAttrs attrs{{1}, true};
  Tensor got = h.run(reduce, OpKind::reduce_sum, attrs, {x})[0];
  EXPECT_TRUE(all_close(got, run_op(OpKind::reduce_sum, attrs, {x})[0], 0, 0));
  EXPECT_EQ(got.numel(), 15);
}

TEST_F(ReduceTest, MaxPropagatesNaNAndInfinities) {
  OpHarness h;
  Tensor x = random_tensor(DType::f32, {4, 5000}, 9, -1, 1);
  x.set(1 * 5000 + 4321, NAN);
  x.set(2 * 5000 + 7, INFINITY);
  for (int64_t i = 0; i < 5000; ++i) x.set(3 * 5000 + i, -INFINITY);
  for (const std::vector<int64_t>& axes : {std::vector<int64_t>{1}, std::vector<int64_t>{0}}) {
    ReduceAttrs attrs{axes, true};
    EXPECT_TRUE(all_close(h.run(reduce, OpKind::reduce_max, attrs, {x})[0],
                          run_op(OpKind::reduce_max, attrs, {x})[0], 0, 0));
    EXPECT_TRUE(all_close(h.run(reduce, OpKind::reduce_sum, attrs, {x})[0],
                          run_op(OpKind::reduce_sum, attrs, {x})[0], 1e-5, 1e-4));
  }
}

TEST_F(ReduceTest, IntegerSumAndMaxMatchCpu) {
  OpHarness h;
  uint64_t seed = 50;
  for (DType t : {DType::i32, DType::i64}) {
    for (const ReduceCase& c : kReduceCases) {
      for (OpKind op : {OpKind::reduce_sum, OpKind::reduce_max}) {
        SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t), " ", shape_str(c.shape)));
        // Large values so that i32 sums wrap.
        Tensor x = random_tensor(t, c.shape, seed++, -2e9, 2e9);
        ReduceAttrs attrs{c.axes, true};
        EXPECT_TRUE(all_close(h.run(reduce, op, attrs, {x})[0], run_op(op, attrs, {x})[0], 0, 0));
      }
    }
  }
}

TEST_F(ReduceTest, ReductionsAreDeterministic) {
  OpHarness h;
  Tensor x = random_tensor(DType::f32, {3, 300000}, 77, -1, 1);
  ReduceAttrs attrs{{1}, true};
  Tensor first = h.run(reduce, OpKind::reduce_sum, attrs, {x})[0];
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(all_close(h.run(reduce, OpKind::reduce_sum, attrs, {x})[0], first, 0, 0));
}

// ---- softmax ------------------------------------------------------------------------

struct SoftmaxCase {
  Shape shape;
  int64_t axis;
};
const SoftmaxCase kSoftmaxCases[] = {
    {{5, 1}, 1},     {{7, 5}, 1},     {{64, 32}, 1},   {{9, 1000}, 1},  {{9, 1024}, 1},
    {{9, 1025}, 1},  {{2, 65536}, 1}, {{3, 17, 5}, 1}, {{3, 17, 5}, 0}, {{4, 3, 8, 8}, 1},
    {{1, 70000}, 1}, {{1000, 2}, 0},  {{1}, 0}};

TEST_F(ReduceTest, SoftmaxAndLogSoftmaxMatchCpu) {
  OpHarness h;
  uint64_t seed = 200;
  for (const SoftmaxCase& c : kSoftmaxCases) {
    for (OpKind op : {OpKind::softmax, OpKind::log_softmax}) {
      for (DType t : kFloatTypes) {
        SCOPED_TRACE(
            cat(op_name(op), " ", dtype_name(t), " ", shape_str(c.shape), " axis ", c.axis));
        Tensor x = random_tensor(t, c.shape, seed++, -8, 8);
        SoftmaxAttrs attrs{c.axis};
        const Tolerance tol = tolerance_for(t);
        // log_softmax values reach |-20|: f32 error of the lse term is absolute.
        const double atol = t == DType::f32 ? 1e-5 : tol.atol;
        EXPECT_TRUE(all_close(h.run(softmax, op, attrs, {x})[0], run_op(op, attrs, {x})[0],
                              tol.rtol * 2, atol));
      }
    }
  }
}

TEST_F(ReduceTest, SoftmaxHandlesInfinitiesAndNaN) {
  OpHarness h;
  // Rows: all -inf, one +inf, a NaN, a -inf among finite values.
  const double inf = INFINITY;
  Tensor x = Tensor::from_doubles(DType::f32, {4, 3},
                                  {-inf, -inf, -inf, 1.0, inf, 2.0, 1.0, NAN, 0.0, -inf, 1.0, 2.0});
  for (OpKind op : {OpKind::softmax, OpKind::log_softmax}) {
    for (int64_t axis : {0, 1}) {
      SCOPED_TRACE(cat(op_name(op), " axis ", axis));
      SoftmaxAttrs attrs{axis};
      EXPECT_TRUE(
          all_close(h.run(softmax, op, attrs, {x})[0], run_op(op, attrs, {x})[0], 1e-6, 1e-6));
    }
  }
}

// ---- cross_entropy --------------------------------------------------------------------

struct CrossEntropyCase {
  Shape logits;
  bool weighted;
  std::optional<int64_t> ignore_index;
};
const CrossEntropyCase kCrossEntropyCases[] = {
    {{8, 10}, false, std::nullopt},
    {{8, 10}, true, 3},
    {{1, 1}, false, std::nullopt},
    {{33, 2000}, true, std::nullopt},
    {{4, 5, 6, 7}, false, 0},
    {{2, 3, 65}, true, -100},
    {{300, 7}, false, std::nullopt},
    // The column walk (a class axis of >= 256 with positions after it: a decoder's
    // [batch, vocab, tokens]): 32-row tiles, a partial last tile, several tiles per batch.
    {{3, 300, 40}, true, -100},
    {{2, 1000, 70}, false, std::nullopt}};

TEST_F(ReduceTest, CrossEntropyMatchesCpu) {
  OpHarness h;
  uint64_t seed = 400;
  for (const CrossEntropyCase& c : kCrossEntropyCases) {
    for (DType t : kFloatTypes) {
      for (DType label_type : {DType::i64, DType::i32}) {
        for (Reduction reduction : {Reduction::none, Reduction::sum, Reduction::mean}) {
          SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.logits), " labels ",
                           dtype_name(label_type), " reduction ", int(reduction), " weighted ",
                           c.weighted));
          Shape label_shape = c.logits;
          label_shape.erase(label_shape.begin() + 1);
          const int64_t classes = c.logits[1];
          Tensor logits = random_tensor(t, c.logits, seed++, -4, 4);
          Tensor labels = random_tensor(label_type, label_shape, seed++, 0, double(classes));
          if (c.ignore_index && *c.ignore_index < 0 && labels.numel() > 2) {
            labels.set(0, double(*c.ignore_index));
            labels.set(labels.numel() - 1, double(*c.ignore_index));
          }
          Tensor weight = c.weighted ? random_tensor(t, {classes}, seed++, 0.1, 2) : Tensor();
          CrossEntropyAttrs attrs{reduction, c.ignore_index};
          std::vector<Tensor> inputs{logits, labels};
          if (c.weighted) inputs.push_back(weight);
          std::vector<Tensor> got = h.run(cross_entropy, OpKind::cross_entropy, attrs, inputs);
          std::vector<Tensor> want = run_op(OpKind::cross_entropy, attrs, inputs);
          const Tolerance tol = tolerance_for(t);
          const double atol = t == DType::f32 ? 2e-5 : tol.atol;
          EXPECT_TRUE(all_close(got[0], want[0], tol.rtol * 2, atol)) << "loss";
          EXPECT_TRUE(all_close(got[1], want[1], tol.rtol * 2, atol)) << "log_prob";
        }
      }
    }
  }
}

TEST_F(ReduceTest, CrossEntropyAllIgnoredMeanIsNaN) {
  OpHarness h;
  Tensor logits = random_tensor(DType::f32, {3, 4}, 5, -1, 1);
  Tensor labels = Tensor::from_doubles(DType::i64, {3}, {2, 2, 2});
  CrossEntropyAttrs attrs{Reduction::mean, 2};
  std::vector<Tensor> got = h.run(cross_entropy, OpKind::cross_entropy, attrs, {logits, labels});
  EXPECT_TRUE(std::isnan(got[0].get(0)));
  EXPECT_TRUE(
      all_close(got[1], run_op(OpKind::cross_entropy, attrs, {logits, labels})[1], 1e-5, 1e-6));
}

TEST_F(ReduceTest, CrossEntropyLabelOutOfRangeFailsTheRun) {
  OpHarness h;
  for (Shape shape : {Shape{4, 10}, Shape{2, 10, 3}}) {
    Tensor logits = random_tensor(DType::f32, shape, 6, -1, 1);
    Shape label_shape = shape;
    label_shape.erase(label_shape.begin() + 1);
    Tensor labels = random_tensor(DType::i64, label_shape, 7, 0, 10);
    labels.set(labels.numel() - 1, 10.0);  // one past the last class
    CrossEntropyAttrs attrs{Reduction::mean, std::nullopt};
    try {
      h.run(cross_entropy, OpKind::cross_entropy, attrs, {logits, labels});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string last = shape.size() == 2 ? "[3]" : "[1, 2]";
      EXPECT_NE(std::string(e.what()).find("label 10 at position " + last + " is outside [0, 10)"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
