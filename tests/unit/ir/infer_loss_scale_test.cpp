// Inference of f16 loss scaling's IR (ops.h): the optimizer updates' optional grad_scale
// and skip inputs, nonfinite_any and loss_scale_update, and their errors.
#include <tuple>

#include "fusebox/ir/op_info.h"
#include "fusebox/passes/autodiff.h"
#include "infer_testing.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

using Types = std::vector<TensorType>;

TensorType i64(Shape s) {
  return typed(DType::i64, std::move(s));
}

TEST(InferLossScaling, UpdatesTakeGradScaleAndSkip) {
  const TensorType p = f32({4, 3});
  // Both, either one (an absent grad_scale before a present skip), any dtype of skip.
  EXPECT_EQ(infer(OpKind::sgd_update, {}, {p, p, p, f32({}), f32({}), f32({})}).types,
            (Types{p, p}));
  EXPECT_EQ(infer(OpKind::sgd_update, {}, {p, p, p, f32({}), std::nullopt, i64({})}).types,
            (Types{p, p}));
  EXPECT_EQ(infer(OpKind::sgd_update, {}, {p, p, p, f32({}), typed(DType::f64, {})}).types,
            (Types{p, p}));
  EXPECT_EQ(infer(OpKind::adamw_update, {},
                  {p, p, p, p, f32({}), i64({}), f32({}), typed(DType::boolean, {})})
                .types,
            (Types{p, p, p}));
  EXPECT_EQ(op_info(OpKind::sgd_update).max_inputs, 7);  // and low_param (below)
  EXPECT_EQ(op_info(OpKind::adamw_update).max_inputs, 9);
}

// Mixed precision's form (ops.h low_param): a bf16 / f16 gradient beside an f32 param, and the
// low copy, whose next value is a last output of its dtype; either only beside an f32 param.
TEST(InferLossScaling, UpdatesTakeALowGradientAndCopy) {
  const TensorType p = f32({4, 3}), low = typed(DType::bf16, {4, 3});
  EXPECT_EQ(infer(OpKind::sgd_update, {}, {p, low, p, f32({})}).types, (Types{p, p}));
  EXPECT_EQ(
      infer(OpKind::sgd_update, {}, {p, low, p, f32({}), std::nullopt, std::nullopt, low}).types,
      (Types{p, p, low}));
  const TensorType half = typed(DType::f16, {4, 3});
  EXPECT_EQ(
      infer(OpKind::adamw_update, {}, {p, half, p, p, f32({}), i64({}), f32({}), f32({}), half})
          .types,
      (Types{p, p, p, half}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {low, half, low, f32({})},
                         {"input 1 (grad) is f16[4, 3] but must be bf16[4, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {p, typed(DType::bf16, {3, 4}), p, f32({})},
                         {"input 1 (grad)", "(or bf16 / f16 of its shape)"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {p, p, p, f32({}), std::nullopt, std::nullopt, p},
                         {"input 6 (low_param) is f32[4, 3] but must be bf16 or f16"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {},
                         {low, low, low, f32({}), std::nullopt, std::nullopt, low},
                         {"input 6 (low_param)", "beside an f32 input 0 (param)"}));
}

TEST(InferLossScalingErrors, UpdateScalars) {
  const TensorType p = f32({4, 3});
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {p, p, p, f32({}), i64({})},
                         {"input 4 (grad_scale) is i64 but must be a float"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {p, p, p, f32({}), f32({1})},
                         {"input 4 (grad_scale) must be a scalar (shape []) but is [1]"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {}, {p, p, p, f32({}), f32({}), f32({4, 3})},
                         {"input 5 (skip) must be a scalar (shape []) but is [4, 3]"}));
  EXPECT_TRUE(fails_with(OpKind::adamw_update, {}, {p, p, p, p, f32({}), i64({}), i64({})},
                         {"input 6 (grad_scale) is i64"}));
  EXPECT_TRUE(fails_with(OpKind::adamw_update, {},
                         {p, p, p, p, f32({}), i64({}), f32({}), f32({2})},
                         {"input 7 (skip) must be a scalar"}));
  EXPECT_TRUE(fails_with(OpKind::sgd_update, {},
                         {p, p, p, f32({}), f32({}), f32({}), typed(DType::bf16, {4, 3}), f32({})},
                         {"takes 4 to 7 inputs", "grad_scale?, skip?, low_param?", "but got 8"}));
}

TEST(InferLossScaling, NonfiniteAnyIsAnF32Scalar) {
  Inferred r = infer(OpKind::nonfinite_any, {}, {f32({2, 3})});
  EXPECT_EQ(r.types, (Types{f32({})}));
  r = infer(
      OpKind::nonfinite_any, {},
      {typed(DType::f16, {8, 3, 3, 3}), typed(DType::bf16, {}), typed(DType::f64, {5}), f32({0})});
  EXPECT_EQ(r.types, (Types{f32({})}));
}

TEST(InferLossScalingErrors, NonfiniteAny) {
  EXPECT_TRUE(fails_with(OpKind::nonfinite_any, {}, {}, {"takes at least 1 input but got 0"}));
  EXPECT_TRUE(fails_with(OpKind::nonfinite_any, {}, {f32({2}), i64({3})},
                         {"input 1 is i64 but nonfinite_any needs a floating-point dtype"}));
  EXPECT_TRUE(fails_with(OpKind::nonfinite_any, {}, {f32({2}), std::nullopt},
                         {"input 1 is required but absent"}));
  EXPECT_TRUE(fails_with(OpKind::nonfinite_any, LossScaleAttrs{}, {f32({2})},
                         {"takes no attributes but the node holds LossScaleAttrs"}));
}

TEST(InferLossScaling, LossScaleUpdateKeepsItsStatesTypes) {
  Inferred r = infer(OpKind::loss_scale_update, {}, {f32({}), i64({}), f32({})});
  EXPECT_EQ(r.types, (Types{f32({}), i64({})}));
  EXPECT_EQ(r.attrs<LossScaleAttrs>().growth_factor, 2.0);
  EXPECT_EQ(r.attrs<LossScaleAttrs>().backoff_factor, 0.5);
  EXPECT_EQ(r.attrs<LossScaleAttrs>().growth_interval, 2000);
  r = infer(OpKind::loss_scale_update,
            LossScaleAttrs{.growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 1},
            {typed(DType::f64, {}), typed(DType::i32, {}), typed(DType::boolean, {}), i64({})});
  EXPECT_EQ(r.types, (Types{typed(DType::f64, {}), typed(DType::i32, {}), i64({})}));
}

TEST(InferLossScalingErrors, LossScaleUpdate) {
  const std::vector<In> ok = {f32({}), i64({}), f32({})};
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, LossScaleAttrs{.growth_factor = 1}, ok,
                         {"growth_factor 1 must be finite and > 1"}));
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, LossScaleAttrs{.backoff_factor = 1}, ok,
                         {"backoff_factor 1 must be in (0, 1)"}));
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, LossScaleAttrs{.backoff_factor = 0}, ok,
                         {"backoff_factor 0 must be in (0, 1)"}));
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, LossScaleAttrs{.growth_interval = 0}, ok,
                         {"growth_interval 0 must be >= 1"}));
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, {}, {i64({}), i64({}), f32({})},
                         {"input 0 (scale) is i64 but must be a float"}));
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, {}, {f32({}), f32({}), f32({})},
                         {"input 1 (growth_tracker) is f32 but must be i64"}));
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, {}, {f32({}), i64({}), f32({1})},
                         {"input 2 (found_inf) must be a scalar"}));
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, {}, {f32({}), i64({}), f32({}), f32({})},
                         {"input 3 (skipped) is f32 but must be i64"}));
  EXPECT_TRUE(fails_with(OpKind::loss_scale_update, {}, {f32({2}), i64({}), f32({})},
                         {"input 0 (scale) must be a scalar (shape []) but is [2]"}));
}

// Autodiff refuses to differentiate through them, like the optimizer updates.
TEST(InferLossScaling, NoGradientThroughLossScaling) {
  Graph g("amp");
  const ValueId x = g.add_input("x", DType::f32, {3});
  const ValueId found = g.add_node(OpKind::nonfinite_any, {}, {x}, "found")[0];
  const ValueId tracker = g.add_input("tracker", DType::i64, {});
  const ValueId scale = g.add_input("scale", DType::f32, {});
  const ValueId next = g.add_node(OpKind::loss_scale_update, {}, {scale, tracker, found}, "u")[0];
  for (const auto& [loss, wrt, op] :
       {std::tuple{found, x, "nonfinite_any"}, std::tuple{next, scale, "loss_scale_update"}}) {
    std::string error = "no error";
    try {
      grad(g, loss, {wrt});
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(cat(op, " has no gradient rule")), std::string::npos) << error;
  }
}

TEST(InferLossScaling, DumpShowsTheAttributes) {
  Graph g("amp");
  const ValueId scale = g.add_input("scale", DType::f32, {});
  const ValueId tracker = g.add_input("tracker", DType::i64, {});
  g.add_node(OpKind::loss_scale_update, LossScaleAttrs{.growth_interval = 7},
             {scale, tracker, scale}, "u");
  const std::string text = g.dump();
  EXPECT_NE(text.find("{growth_factor=2 backoff_factor=0.5 growth_interval=7}"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace fusebox::ir_test
