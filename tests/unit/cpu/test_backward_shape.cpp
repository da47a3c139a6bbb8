// slice_backward and pad_backward: gradient checks in f64 against central differences
// of the forward slice / pad (gradient_check.h), with negative steps, clamped bounds,
// negative pads (crops) and every pad mode, plus hand-worked examples.
#include <cmath>

#include "gradient_check.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cpu::test {
namespace {

using namespace fusebox::testing;

// ---- slice ---------------------------------------------------------------------------

TEST(SliceBackward, MatchesFiniteDifferences) {
  const Shape shape = {4, 5, 3};
  const std::vector<SliceAttrs> cases = {
      {.starts = {1}, .ends = {3}},
      {.starts = {-1}, .ends = {-100}, .axes = {1}, .steps = {-2}},  // 4, 2, 0
      {.starts = {3, 0}, .ends = {0, 3}, .axes = {0, 2}, .steps = {-1, 2}},
      {.starts = {0, 4, 2}, .ends = {100, -6, -100}, .steps = {3, -3, -1}},
      {.starts = {2}, .ends = {2}, .axes = {-1}},  // empty
  };
  uint64_t seed = 10;
  for (const SliceAttrs& s : cases) {
    SCOPED_TRACE(cat("starts ", shape_str(s.starts), " ends ", shape_str(s.ends), " axes ",
                     shape_str(s.axes), " steps ", shape_str(s.steps)));
    const Tensor x = random_tensor(DType::f64, shape, ++seed);
    const Tensor y = run_op(OpKind::slice, s, {x}).at(0);
    const Tensor dy = random_tensor(DType::f64, y.shape(), ++seed);
    const Tensor dx =
        run_op(OpKind::slice_backward, SliceBackwardAttrs{.slice = s, .input_shape = shape}, {dy})
            .at(0);
    EXPECT_TRUE(matches_numeric(dx, OpKind::slice, s, {x}, 0, dy));
  }
}

TEST(SliceBackward, ScattersNegativeStepsByHand) {
  const SliceBackwardAttrs a{.slice = {.starts = {-1}, .ends = {-100}, .steps = {-2}},
                             .input_shape = {5}};
  // Reads x[4], x[2], x[0].
  for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    const Tensor dy = Tensor::from_doubles(t, {3}, {1, 2, 3});
    EXPECT_EQ(run_op(OpKind::slice_backward, a, {dy}).at(0).to_doubles(),
              (std::vector<double>{3, 0, 2, 0, 1}))
        << dtype_name(t);
  }
}

// ---- pad -----------------------------------------------------------------------------

TEST(PadBackward, MatchesFiniteDifferencesForEveryMode) {
  const Shape shape = {3, 4};
  const std::vector<std::vector<int64_t>> pads = {
      {1, 2, 2, 1}, {2, 0, 0, 3}, {-1, 1, 2, -2}, {0, 0, 0, 0}};
  uint64_t seed = 100;
  for (PadMode mode : {PadMode::constant, PadMode::reflect, PadMode::edge}) {
    for (const std::vector<int64_t>& p : pads) {
      SCOPED_TRACE(cat("mode ", int(mode), " pads ", shape_str(p)));
      const PadAttrs attrs{.pads = p, .mode = mode, .value = 0.5};
      const Tensor x = random_tensor(DType::f64, shape, ++seed);
      const Tensor y = run_op(OpKind::pad, attrs, {x}).at(0);
      const Tensor dy = random_tensor(DType::f64, y.shape(), ++seed);
      const Tensor dx =
          run_op(OpKind::pad_backward, PadBackwardAttrs{.pad = attrs, .input_shape = shape}, {dy})
              .at(0);
      EXPECT_TRUE(matches_numeric(dx, OpKind::pad, attrs, {x}, 0, dy));
    }
  }
  // Rank 3 with large edge pads (one element copied many times).
  const PadAttrs attrs{.pads = {1, 0, 4, 0, 2, 1}, .mode = PadMode::edge};
  const Tensor x = random_tensor(DType::f64, {2, 1, 3}, 7);
  const Tensor dy = random_tensor(DType::f64, {3, 3, 8}, 8);
  const Tensor dx =
      run_op(OpKind::pad_backward, PadBackwardAttrs{.pad = attrs, .input_shape = {2, 1, 3}}, {dy})
          .at(0);
  EXPECT_TRUE(matches_numeric(dx, OpKind::pad, attrs, {x}, 0, dy));
}

TEST(PadBackward, ByHand) {
  // x [4] padded by 2 / 1: reflect reads x[2] x[1] | x[0..3] | x[2]; edge x[0] x[0] | .. | x[3].
  const Tensor dy = Tensor::from_vector<float>({7}, {1, 2, 4, 8, 16, 32, 64});
  auto grad = [&](PadMode mode) {
    return run_op(OpKind::pad_backward,
                  PadBackwardAttrs{.pad = {.pads = {2, 1}, .mode = mode}, .input_shape = {4}}, {dy})
        .at(0)
        .to_doubles();
  };
  EXPECT_EQ(grad(PadMode::constant), (std::vector<double>{4, 8, 16, 32}));
  EXPECT_EQ(grad(PadMode::reflect), (std::vector<double>{4, 8 + 2, 16 + 1 + 64, 32}));
  EXPECT_EQ(grad(PadMode::edge), (std::vector<double>{4 + 1 + 2, 8, 16, 32 + 64}));
  // A crop: the cropped element gets 0.
  const Tensor d2 = Tensor::from_vector<float>({2}, {5, 7});
  EXPECT_EQ(run_op(OpKind::pad_backward,
                   PadBackwardAttrs{.pad = {.pads = {-1, -1}}, .input_shape = {4}}, {d2})
                .at(0)
                .to_doubles(),
            (std::vector<double>{0, 5, 7, 0}));
}

TEST(PadBackward, LowPrecisionDtypesFollowF64) {
  uint64_t seed = 200;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const PadBackwardAttrs a{.pad = {.pads = {2, 1, 1, 2}, .mode = PadMode::reflect},
                             .input_shape = {3, 3}};
    const Tensor dy = random_tensor(t, {6, 6}, ++seed);
    const Tensor got = run_op(OpKind::pad_backward, a, {dy}).at(0);
    const Tensor want = run_op(OpKind::pad_backward, a, {dy.cast(DType::f64)}).at(0);
    EXPECT_TRUE(close_to(got, t, {3, 3}, want.to_doubles()));
  }
}

}  // namespace
}  // namespace fusebox::cpu::test
