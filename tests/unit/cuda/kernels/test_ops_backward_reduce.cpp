// CUDA gradients of the reductions against the CPU backend: softmax_backward and
// log_softmax_backward (last and middle axes, rows of 1 and 65,536), cross_entropy_backward
// (every reduction, class weights, ignore_index, i32/i64 labels, spatial dims, every label
// ignored, a bad label failing the run; the lse_stash form, forward too) and reduce_max_backward
// (ties split evenly, NaN rows, several axis sets, long reductions). Outputs are poisoned
// (OpHarness). Tolerances: the row sums are f64 on both sides; the elementwise step runs in f32 on
// the GPU (f64 on the CPU), so dy - s loses up to an ulp of max(|dy|, |s|): an absolute tolerance
// of a few f32 ulps of the operands' scale, tolerance_for(dtype) otherwise.
#include <cmath>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

class BackwardReduceTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

TEST_F(BackwardReduceTest, SoftmaxAndLogSoftmaxBackwardMatchCpu) {
  OpHarness h;
  struct Case {
    Shape shape;
    int64_t axis;
  };
  const Case cases[] = {{{1, 1}, 1},     {{7, 5}, 1},     {{3, 65536}, 1}, {{4, 2000}, 1},
                        {{3, 17, 5}, 1}, {{65536, 2}, 0}, {{5}, 0},        {{2, 3, 1}, 2}};
  uint64_t seed = 100;
  for (OpKind forward : {OpKind::softmax, OpKind::log_softmax}) {
    const OpKind backward =
        forward == OpKind::softmax ? OpKind::softmax_backward : OpKind::log_softmax_backward;
    for (DType t : kFloatTypes) {
      for (const Case& c : cases) {
        SCOPED_TRACE(
            cat(op_name(backward), " ", dtype_name(t), " ", shape_str(c.shape), " axis ", c.axis));
        const SoftmaxAttrs attrs{c.axis};
        Tensor x = random_tensor(t, c.shape, seed++, -4, 4);
        Tensor y = run_op(forward, attrs, {x})[0];
        Tensor dy = random_tensor(t, c.shape, seed++, -1, 1);
        const Tolerance tol = tolerance_for(t);
        const double atol = t == DType::f32 ? 2e-6 : tol.atol;
        EXPECT_TRUE(all_close(h.run(softmax_backward, backward, attrs, {dy, y})[0],
                              run_op(backward, attrs, {dy, y})[0], tol.rtol * 2, atol));
      }
    }
  }
}

struct CrossEntropyCase {
  Shape logits;
  Reduction reduction;
  bool weighted;
  std::optional<int64_t> ignore_index;
  DType labels;
};

// (dloss, log_prob, labels, weight?) for a case: log_prob from the CPU forward, labels in
// [0, C) with about a quarter replaced by the ignore_index.
std::vector<Tensor> cross_entropy_inputs(const CrossEntropyCase& c, DType t, uint64_t seed) {
  const int64_t classes = c.logits[1];
  Shape label_shape = c.logits;
  label_shape.erase(label_shape.begin() + 1);
  Tensor logits = random_tensor(t, c.logits, seed, -3, 3);
  Tensor labels = random_tensor(DType::i64, label_shape, seed + 1, 0, double(classes));
  if (c.ignore_index) {
    std::vector<double> values = labels.to_doubles();
    for (size_t i = 0; i < values.size(); i += 4) values[i] = double(*c.ignore_index);
    labels = Tensor::from_doubles(DType::i64, label_shape, values);
  }
  labels = Tensor::from_doubles(c.labels, label_shape, labels.to_doubles());
  Tensor weight = c.weighted ? random_tensor(t, {classes}, seed + 2, 0.5, 2) : Tensor();
  const CrossEntropyAttrs attrs{c.reduction, c.ignore_index};
  std::vector<Tensor> forward_inputs{logits, labels};
  if (c.weighted) forward_inputs.push_back(weight);
  std::vector<Tensor> forward = run_op(OpKind::cross_entropy, attrs, forward_inputs);
  Tensor dloss = random_tensor(t, forward[0].shape(), seed + 3, 0.5, 2);
  std::vector<Tensor> inputs{dloss, forward[1], labels};
  if (c.weighted) inputs.push_back(weight);
  return inputs;
}

TEST_F(BackwardReduceTest, CrossEntropyBackwardMatchesCpu) {
  OpHarness h;
  std::vector<CrossEntropyCase> cases;
  for (Reduction r : {Reduction::none, Reduction::sum, Reduction::mean}) {
    cases.push_back({{8, 10}, r, false, std::nullopt, DType::i64});
    cases.push_back({{8, 10}, r, true, std::nullopt, DType::i32});
    cases.push_back({{33, 7}, r, true, int64_t(-100), DType::i64});
    cases.push_back({{4, 5, 3, 6}, r, false, int64_t(2), DType::i32});
    cases.push_back({{4, 5, 3, 6}, r, true, int64_t(-1), DType::i64});
    cases.push_back({{1, 1}, r, false, std::nullopt, DType::i64});
    cases.push_back({{2, 65536}, r, true, std::nullopt, DType::i64});
    // The column walk (classes >= 256 with positions after them), a partial last tile.
    cases.push_back({{2, 300, 37}, r, true, int64_t(-100), DType::i64});
    cases.push_back({{3, 512, 64}, r, false, std::nullopt, DType::i32});
  }
  uint64_t seed = 200;
  for (DType t : kFloatTypes) {
    for (const CrossEntropyCase& c : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.logits), " reduction ", int(c.reduction),
                       c.weighted ? " weighted" : "", c.ignore_index ? " ignore" : "", " labels ",
                       dtype_name(c.labels)));
      std::vector<Tensor> inputs = cross_entropy_inputs(c, t, seed);
      seed += 4;
      const CrossEntropyAttrs attrs{c.reduction, c.ignore_index};
      // Both sides compute in f64 and round once: the dtype's rounding only.
      const Tolerance tol = tolerance_for(t);
      EXPECT_TRUE(
          all_close(h.run(cross_entropy_backward, OpKind::cross_entropy_backward, attrs, inputs)[0],
                    run_op(OpKind::cross_entropy_backward, attrs, inputs)[0], tol.rtol,
                    t == DType::f32 ? 1e-9 : tol.atol));
    }
  }
}

// The lse_stash form (ir/ops.h): forward (loss, lse) and backward (recomputed from the logits,
// 0 past `classes`) against the CPU's, rows of every walk with and without padding columns.
TEST_F(BackwardReduceTest, CrossEntropyLseStashMatchesCpu) {
  OpHarness h;
  struct Case {
    Shape logits;
    std::optional<int64_t> classes;
    bool weighted;
    std::optional<int64_t> ignore_index;
  };
  const Case cases[] = {
      {{8, 10}, 7, true, int64_t(-100)},        // warp rows, padding
      {{33, 2000}, 1993, false, std::nullopt},  // block rows (GPT-2's LM head's form)
      {{5, 4000}, std::nullopt, true, int64_t(3)},
      {{4, 5, 3, 6}, 4, false, int64_t(2)},     // a thread per row
      {{2, 300, 37}, 290, true, std::nullopt},  // the column walk
  };
  uint64_t seed = 900;
  for (DType t : kFloatTypes) {
    const DType stat = stash_dtype(t);
    for (Reduction r : {Reduction::none, Reduction::mean}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.logits), " classes ",
                         c.classes.value_or(-1), " reduction ", int(r)));
        const int64_t classes = c.classes.value_or(c.logits[1]);
        Shape label_shape = c.logits;
        label_shape.erase(label_shape.begin() + 1);
        const CrossEntropyAttrs attrs{r, c.ignore_index, true, c.classes};
        Tensor logits = random_tensor(t, c.logits, seed++, -3, 3);
        std::vector<double> labels =
            random_tensor(DType::i64, label_shape, seed++, 0, double(classes)).to_doubles();
        if (c.ignore_index)
          for (size_t i = 0; i < labels.size(); i += 4) labels[i] = double(*c.ignore_index);
        const Tensor label_tensor = Tensor::from_doubles(DType::i64, label_shape, labels);
        const Tensor weight =
            c.weighted ? random_tensor(stat, {classes}, seed++, 0.5, 2) : Tensor();
        const std::vector<Tensor> forward_inputs{logits, label_tensor, weight};
        const std::vector<Tensor> want = run_op(OpKind::cross_entropy, attrs, forward_inputs);
        const std::vector<Tensor> got =
            h.run(cross_entropy, OpKind::cross_entropy, attrs, forward_inputs);
        // f32 statistics on both sides (f64 for f64): the GPU's f32 sums.
        const double rtol = t == DType::f64 ? 1e-12 : 1e-5;
        EXPECT_TRUE(all_close(got[0], want[0], rtol, rtol)) << "loss";
        EXPECT_TRUE(all_close(got[1], want[1], rtol, rtol)) << "lse";
        const Tensor dloss = random_tensor(stat, want[0].shape(), seed++, 0.5, 2);
        const std::vector<Tensor> backward_inputs{dloss, want[1], label_tensor, weight, logits};
        const Tensor dlogits = h.run(cross_entropy_backward, OpKind::cross_entropy_backward, attrs,
                                     backward_inputs)[0];
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(
            all_close(dlogits, run_op(OpKind::cross_entropy_backward, attrs, backward_inputs)[0],
                      t == DType::f32 ? 1e-5 : tol.rtol, t == DType::f32 ? 1e-7 : tol.atol));
        // The padding columns' gradient is exactly 0.
        if (c.classes) {
          const std::vector<double> d = dlogits.to_doubles();
          const int64_t inner = numel(Shape(c.logits.begin() + 2, c.logits.end()));
          for (size_t i = 0; i < d.size(); ++i)
            if (int64_t(i) / inner % c.logits[1] >= classes) {
              ASSERT_EQ(d[i], 0.0) << i;
            }
        }
      }
    }
  }
}

// Long rows (the block's one-read statistics) with infinities and NaN, as the CPU's: -inf
// entries take no part, a row of -inf, a +inf or a NaN gives NaN.
TEST_F(BackwardReduceTest, CrossEntropyLseStashOfNonFiniteRowsMatchesCpu) {
  OpHarness h;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<double> x = random_tensor(DType::f32, {4, 3000}, 31, -3, 3).to_doubles();
    for (int64_t j = 0; j < 3000; j += 7) x[size_t(j)] = -INFINITY;      // row 0: some -inf
    for (int64_t j = 0; j < 3000; ++j) x[size_t(3000 + j)] = -INFINITY;  // row 1: all
    x[size_t(2 * 3000 + 1234)] = INFINITY;                               // row 2: a +inf
    x[size_t(3 * 3000 + 2999)] = NAN;                                    // row 3: a NaN
    const Tensor logits = Tensor::from_doubles(t, {4, 3000}, x);
    const Tensor labels = Tensor::from_doubles(DType::i64, {4}, {1, 2, 3, 4});
    const CrossEntropyAttrs attrs{Reduction::none, std::nullopt, true, std::nullopt};
    const std::vector<Tensor> want = run_op(OpKind::cross_entropy, attrs, {logits, labels});
    const std::vector<Tensor> got =
        h.run(cross_entropy, OpKind::cross_entropy, attrs, {logits, labels});
    EXPECT_TRUE(all_close(got[0], want[0], 1e-5, 1e-5)) << "loss";
    EXPECT_TRUE(all_close(got[1], want[1], 1e-5, 1e-5)) << "lse";
    EXPECT_FALSE(std::isnan(got[0].get(0)));
  }
}

TEST_F(BackwardReduceTest, CrossEntropyBackwardAllIgnoredGivesZeros) {
  OpHarness h;
  const CrossEntropyAttrs attrs{Reduction::mean, int64_t(3)};
  Tensor log_prob =
      run_op(OpKind::log_softmax, SoftmaxAttrs{1}, {random_tensor(DType::f32, {4, 6}, 1)})[0];
  Tensor labels = Tensor::from_doubles(DType::i64, {4}, {3, 3, 3, 3});
  Tensor dloss = Tensor::from_doubles(DType::f32, {}, {1.0});
  Tensor got = h.run(cross_entropy_backward, OpKind::cross_entropy_backward, attrs,
                     {dloss, log_prob, labels})[0];
  EXPECT_TRUE(all_close(got, Tensor::zeros(DType::f32, {4, 6}), 0, 0));
}

TEST_F(BackwardReduceTest, CrossEntropyBackwardRejectsBadLabels) {
  OpHarness h;
  for (Reduction r : {Reduction::none, Reduction::mean}) {
    const CrossEntropyAttrs attrs{r, int64_t(-100)};
    Tensor log_prob =
        run_op(OpKind::log_softmax, SoftmaxAttrs{1}, {random_tensor(DType::f32, {3, 5}, 2)})[0];
    Tensor labels = Tensor::from_doubles(DType::i32, {3}, {1, 5, -100});
    Tensor dloss = r == Reduction::none ? random_tensor(DType::f32, {3}, 3)
                                        : Tensor::from_doubles(DType::f32, {}, {1.0});
    try {
      h.run(cross_entropy_backward, OpKind::cross_entropy_backward, attrs,
            {dloss, log_prob, labels});
      ADD_FAILURE() << "no error for label 5 of 5 classes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("label 5"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("outside [0, 5)"), std::string::npos) << e.what();
    }
  }
  // The flags were consumed: a good run after it passes.
  const CrossEntropyAttrs attrs{Reduction::sum, std::nullopt};
  Tensor log_prob =
      run_op(OpKind::log_softmax, SoftmaxAttrs{1}, {random_tensor(DType::f32, {3, 5}, 4)})[0];
  Tensor labels = Tensor::from_doubles(DType::i64, {3}, {0, 4, 2});
  Tensor dloss = Tensor::from_doubles(DType::f32, {}, {0.5});
  EXPECT_TRUE(all_close(h.run(cross_entropy_backward, OpKind::cross_entropy_backward, attrs,
                              {dloss, log_prob, labels})[0],
                        run_op(OpKind::cross_entropy_backward, attrs, {dloss, log_prob, labels})[0],
                        1e-6, 1e-9));
}

// (dy, x, y) for reduce_max over `attrs`, y from the CPU forward.
std::vector<Tensor> reduce_max_inputs(const Tensor& x, const ReduceAttrs& attrs, uint64_t seed) {
  Tensor y = run_op(OpKind::reduce_max, attrs, {x})[0];
  Tensor dy = random_tensor(x.dtype(), y.shape(), seed, -2, 2);
  return {dy, x, y};
}

TEST_F(BackwardReduceTest, ReduceMaxBackwardSplitsTiesAsCpu) {
  OpHarness h;
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
    bool keepdims;
  };
  const Case cases[] = {
      {{7, 9}, {1}, true},      {{7, 9}, {0}, false},      {{4, 5, 6}, {0, 2}, true},
      {{4, 5, 6}, {1}, false},  {{3, 4, 5, 6}, {}, false}, {{2, 65536}, {1}, true},
      {{65536, 3}, {0}, false}, {{1}, {0}, true},          {{5, 1, 3}, {1}, false},
  };
  uint64_t seed = 300;
  for (DType t : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(c.shape), " axes ", shape_str(c.axes)));
      // Small integers: many ties per output.
      const Tensor ints = random_tensor(DType::i32, c.shape, seed++, 0, 5);
      const Tensor x = Tensor::from_doubles(t, c.shape, ints.to_doubles());
      const ReduceAttrs attrs{c.axes, c.keepdims};
      std::vector<Tensor> inputs = reduce_max_inputs(x, attrs, seed++);
      const Tolerance tol = tolerance_for(t);
      EXPECT_TRUE(
          all_close(h.run(reduce_max_backward, OpKind::reduce_max_backward, attrs, inputs)[0],
                    run_op(OpKind::reduce_max_backward, attrs, inputs)[0], tol.rtol, tol.atol));
    }
  }
}

TEST_F(BackwardReduceTest, ReduceMaxBackwardSendsNaNRowsToTheirNaNs) {
  OpHarness h;
  const Tensor x = Tensor::from_doubles(
      DType::f32, {3, 4},
      {1, NAN, 3, NAN, 2, 2, -INFINITY, 1, -INFINITY, -INFINITY, -INFINITY, -INFINITY});
  const ReduceAttrs attrs{{1}, true};
  std::vector<Tensor> inputs = reduce_max_inputs(x, attrs, 9);
  EXPECT_TRUE(all_close(h.run(reduce_max_backward, OpKind::reduce_max_backward, attrs, inputs)[0],
                        run_op(OpKind::reduce_max_backward, attrs, inputs)[0], 0, 0));
}

}  // namespace
}  // namespace fusebox::cuda::testing
