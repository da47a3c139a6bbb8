// softmax_backward / log_softmax_backward, cross_entropy_backward and reduce_max_backward:
// gradient checks in f64 against central differences of the forward op
// (gradient_check.h), on non-last axes, every reduction with ignore_index and weights,
// and reduce_max's even split among ties checked explicitly.
#include <cmath>

#include "gradient_check.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cpu::test {
namespace {

using namespace fusebox::testing;

// ---- softmax / log_softmax ---------------------------------------------------------------

TEST(SoftmaxBackward, MatchesFiniteDifferencesOnEveryAxis) {
  uint64_t seed = 10;
  const Shape shape = {2, 3, 4};
  for (OpKind op : {OpKind::softmax, OpKind::log_softmax}) {
    const OpKind backward =
        op == OpKind::softmax ? OpKind::softmax_backward : OpKind::log_softmax_backward;
    for (int64_t axis : {0, 1, 2, -1}) {
      SCOPED_TRACE(cat(op_name(op), " axis ", axis));
      const SoftmaxAttrs attrs{axis};
      const Tensor x = random_tensor(DType::f64, shape, ++seed, -3, 3);
      const Tensor y = run_op(op, attrs, {x}).at(0);
      const Tensor dy = random_tensor(DType::f64, shape, ++seed);
      const Tensor dx = run_op(backward, attrs, {dy, y}).at(0);
      EXPECT_TRUE(matches_numeric(dx, op, attrs, {x}, 0, dy));
    }
  }
}

TEST(SoftmaxBackward, LowPrecisionDtypesFollowF64) {
  uint64_t seed = 50;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (OpKind op : {OpKind::softmax_backward, OpKind::log_softmax_backward}) {
      SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t)));
      const SoftmaxAttrs attrs{1};
      const Tensor x = random_tensor(t, {3, 5, 2}, ++seed, -3, 3);
      const Tensor y =
          run_op(op == OpKind::softmax_backward ? OpKind::softmax : OpKind::log_softmax, attrs, {x})
              .at(0);
      const Tensor dy = random_tensor(t, {3, 5, 2}, ++seed);
      const Tensor got = run_op(op, attrs, {dy, y}).at(0);
      const Tensor want = run_op(op, attrs, {dy.cast(DType::f64), y.cast(DType::f64)}).at(0);
      EXPECT_TRUE(close_to(got, t, {3, 5, 2}, want.to_doubles(), 2));
    }
  }
}

// ---- cross_entropy -----------------------------------------------------------------------

struct CeCase {
  Shape logits;
  Reduction reduction;
  std::optional<int64_t> ignore_index;
  bool weighted;
  DType label_dtype = DType::i64;
};

TEST(CrossEntropyBackward, MatchesFiniteDifferences) {
  std::vector<CeCase> cases;
  for (Reduction r : {Reduction::none, Reduction::sum, Reduction::mean}) {
    cases.push_back({{6, 4}, r, std::nullopt, false});
    cases.push_back({{6, 4}, r, 2, true});                    // ignore a real class index
    cases.push_back({{3, 4, 2}, r, -100, true, DType::i32});  // [N, C, D], PyTorch's default
    cases.push_back({{2, 3, 2, 2}, r, 0, false});
  }
  uint64_t seed = 100;
  for (const CeCase& c : cases) {
    const CrossEntropyAttrs attrs{.reduction = c.reduction, .ignore_index = c.ignore_index};
    SCOPED_TRACE(cat("logits ", shape_str(c.logits), " reduction ", int(c.reduction), " ignore ",
                     c.ignore_index.value_or(-1), " weighted ", c.weighted));
    const int64_t classes = c.logits[1];
    Shape labels_shape = c.logits;
    labels_shape.erase(labels_shape.begin() + 1);
    const Tensor logits = random_tensor(DType::f64, c.logits, ++seed, -2, 2);
    Tensor labels = random_tensor(c.label_dtype, labels_shape, ++seed, 0, double(classes));
    if (c.ignore_index) {  // make sure some positions are ignored, and some are not
      labels.set(0, double(*c.ignore_index));
      labels.set(labels.numel() - 1, double(((*c.ignore_index + 1) % classes + classes) % classes));
    }
    const Tensor weight =
        c.weighted ? random_tensor(DType::f64, {classes}, ++seed, 0.2, 2) : Tensor();
    const std::vector<Tensor> fwd = run_op(OpKind::cross_entropy, attrs, {logits, labels, weight});
    const Tensor dloss = random_tensor(DType::f64, fwd[0].shape(), ++seed, 0.5, 2);
    const Tensor dlogits =
        run_op(OpKind::cross_entropy_backward, attrs, {dloss, fwd[1], labels, weight}).at(0);
    EXPECT_TRUE(
        matches_numeric(dlogits, OpKind::cross_entropy, attrs, {logits, labels, weight}, 0, dloss));
    // Ignored positions get exactly 0.
    if (c.ignore_index) {
      for (int64_t j = 0; j < classes; ++j) {
        std::vector<int64_t> at(c.logits.size(), 0);
        at[1] = j;
        EXPECT_EQ(dlogits.get(ravel(at, c.logits)), 0.0) << "class " << j;
      }
    }
  }
}

TEST(CrossEntropyBackward, EveryLabelIgnoredGivesZeros) {
  const CrossEntropyAttrs attrs{.ignore_index = 1};
  const Tensor logits = random_tensor(DType::f64, {3, 4}, 1);
  const Tensor labels = Tensor::from_vector<int64_t>({3}, {1, 1, 1});
  const std::vector<Tensor> fwd = run_op(OpKind::cross_entropy, attrs, {logits, labels});
  EXPECT_TRUE(std::isnan(fwd[0].get(0)));  // 0 / 0, as PyTorch
  const Tensor dlogits = run_op(OpKind::cross_entropy_backward, attrs,
                                {Tensor::scalar(DType::f64, 1.0), fwd[1], labels})
                             .at(0);
  EXPECT_EQ(dlogits.to_doubles(), std::vector<double>(12, 0.0));
}

TEST(CrossEntropyBackward, LabelOutOfRangeIsAnError) {
  const Tensor log_prob = random_tensor(DType::f32, {2, 3}, 2);
  const Tensor labels = Tensor::from_vector<int64_t>({2}, {0, 3});
  try {
    run_op(OpKind::cross_entropy_backward, CrossEntropyAttrs{},
           {Tensor::scalar(DType::f32, 1.0), log_prob, labels});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 3 at flat position 1"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("outside [0, 3)"), std::string::npos) << e.what();
  }
}

TEST(CrossEntropyBackward, LowPrecisionDtypesFollowF64) {
  uint64_t seed = 200;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const CrossEntropyAttrs attrs{.ignore_index = 0};
    const Tensor logits = random_tensor(t, {5, 3, 2}, ++seed, -2, 2);
    const Tensor labels = random_tensor(DType::i64, {5, 2}, ++seed, 0, 3);
    const Tensor weight = random_tensor(t, {3}, ++seed, 0.5, 2);
    const Tensor log_prob = run_op(OpKind::cross_entropy, attrs, {logits, labels, weight}).at(1);
    const Tensor dloss = Tensor::scalar(t, 1.5);
    const Tensor got =
        run_op(OpKind::cross_entropy_backward, attrs, {dloss, log_prob, labels, weight}).at(0);
    const Tensor want =
        run_op(OpKind::cross_entropy_backward, attrs,
               {dloss.cast(DType::f64), log_prob.cast(DType::f64), labels, weight.cast(DType::f64)})
            .at(0);
    EXPECT_TRUE(close_to(got, t, {5, 3, 2}, want.to_doubles(), 2));
  }
}

// ---- reduce_max --------------------------------------------------------------------------

TEST(ReduceMaxBackward, MatchesFiniteDifferencesWithoutTies) {
  const std::vector<ReduceAttrs> cases = {
      {.axes = {1}},
      {.axes = {0, 2}, .keepdims = false},
      {.axes = {}},
      {.axes = {-1}, .keepdims = false},
  };
  uint64_t seed = 300;
  for (const ReduceAttrs& attrs : cases) {
    SCOPED_TRACE(cat("axes ", shape_str(attrs.axes), " keepdims ", attrs.keepdims));
    const Tensor x = distinct_values({2, 3, 4}, ++seed);
    const Tensor y = run_op(OpKind::reduce_max, attrs, {x}).at(0);
    const Tensor dy = random_tensor(DType::f64, y.shape(), ++seed);
    const Tensor dx = run_op(OpKind::reduce_max_backward, attrs, {dy, x, y}).at(0);
    EXPECT_TRUE(matches_numeric(dx, OpKind::reduce_max, attrs, {x}, 0, dy));
  }
}

TEST(ReduceMaxBackward, TiesShareTheGradientEvenly) {
  // Rows: one max; two tied maxima; three tied; a NaN (which is the max and takes all).
  const Tensor x = Tensor::from_vector<double>({4, 3}, {1, 5, 2,  //
                                                        3, 1, 3,  //
                                                        2, 2, 2,  //
                                                        1, NAN, 7});
  const ReduceAttrs attrs{.axes = {1}, .keepdims = false};
  const Tensor y = run_op(OpKind::reduce_max, attrs, {x}).at(0);
  const Tensor dy = Tensor::from_vector<double>({4}, {6, 6, 6, 6});
  const Tensor dx = run_op(OpKind::reduce_max_backward, attrs, {dy, x, y}).at(0);
  EXPECT_EQ(dx.to_doubles(), (std::vector<double>{0, 6, 0, 3, 0, 3, 2, 2, 2, 0, 6, 0}));
  // Over every dim: a three-way tie.
  const Tensor x2 = Tensor::from_vector<double>({2, 2}, {4, -1, 4, 4});
  const Tensor y2 = run_op(OpKind::reduce_max, ReduceAttrs{}, {x2}).at(0);
  const Tensor dx2 = run_op(OpKind::reduce_max_backward, ReduceAttrs{},
                            {Tensor::full(DType::f64, {1, 1}, 1.5), x2, y2})
                         .at(0);
  EXPECT_EQ(dx2.to_doubles(), (std::vector<double>{0.5, 0, 0.5, 0.5}));
}

TEST(ReduceMaxBackward, LowPrecisionDtypes) {
  uint64_t seed = 400;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const ReduceAttrs attrs{.axes = {0}};
    // Few distinct values: ties are certain once rounded.
    const Tensor x = random_tensor(DType::i64, {5, 4}, ++seed, 0, 3).cast(t);
    const Tensor y = run_op(OpKind::reduce_max, attrs, {x}).at(0);
    const Tensor dy = random_tensor(t, {1, 4}, ++seed);
    const Tensor got = run_op(OpKind::reduce_max_backward, attrs, {dy, x, y}).at(0);
    const Tensor want = run_op(OpKind::reduce_max_backward, attrs,
                               {dy.cast(DType::f64), x.cast(DType::f64), y.cast(DType::f64)})
                            .at(0);
    EXPECT_TRUE(close_to(got, t, {5, 4}, want.to_doubles()));
  }
}

}  // namespace
}  // namespace fusebox::cpu::test
