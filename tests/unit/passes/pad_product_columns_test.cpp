// pad_product_columns (passes/simplify.h): a product by a weight of unaligned columns becomes
// the padded product over flattened rows and its slice; the values and the gradients autodiff
// derives from the rewritten graph are the original's (f64, CPU); aligned, small and
// non-weight products stay; the GPT-2 LM head's shape is rewritten at the default threshold.
#include "fusebox/ir/builder.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/simplify.h"
#include "fusebox/runtime/executor.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// loss = sum(matmul(x, w) * c): x [2, 3, 16], w [16, cols]; y, dloss/dx and dloss/dw are
// the graph's outputs ("y", "dx", "dw").
// Thresholds that take any product of unaligned columns (the tests' shapes are small).
constexpr PadColumnsThresholds kAlways{.min_flops = 0, .min_flops_per_copied_byte = 0};

Graph head(int64_t cols, bool pad) {
  Graph g("head");
  Builder b(g);
  const ValueId y =
      b.matmul(g.add_input("x", DType::f64, {2, 3, 16}), g.add_input("w", DType::f64, {16, cols}));
  g.rename_value(y, "y");
  g.mark_output(y);
  if (pad) {
    EXPECT_EQ(pad_product_columns(g, nullptr, kAlways), 1u);
  }
  // The loss after the rewrite (which rebuilds the graph): the ids are the new graph's.
  Builder after(g);
  const ValueId x = *g.find_value("x"), w = *g.find_value("w");
  const ValueId c = g.add_constant("c", random_tensor(DType::f64, {2, 3, cols}, 7));
  const ValueId loss = after.reduce_sum(after.mul(*g.find_value("y"), c), {}, false);
  const GradResult r = grad(g, loss, {x, w});
  g.rename_value(r.of(x), "dx");
  g.rename_value(r.of(w), "dw");
  g.mark_output(r.of(x));
  g.mark_output(r.of(w));
  g.verify();
  return g;
}

TEST(PadProductColumns, ValuesAndGradientsStay) {
  const Graph plain = head(50, false);
  const Graph padded = head(50, true);
  EXPECT_GE(count_ops(padded, OpKind::pad),
            1);  // the weight's (the slice's gradient may be one too)
  EXPECT_GE(count_ops(padded, OpKind::slice), 1);
  // One product over the flattened rows: its weight gradient is one product too, not a
  // batch of them summed.
  for (const Node& n : padded.nodes()) {
    if (n.op == OpKind::matmul) {
      EXPECT_EQ(padded.value(n.outputs[0]).type.shape.size(), 2u) << n.name;
    }
  }
  const NamedTensors feeds{{"x", random_tensor(DType::f64, {2, 3, 16}, 1)},
                           {"w", random_tensor(DType::f64, {16, 50}, 2)}};
  const NamedTensors want = run_graph(plain, feeds), got = run_graph(padded, feeds);
  for (const char* name : {"y", "dx", "dw"}) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_EQ(got.at(name).shape(), want.at(name).shape()) << name;
    EXPECT_TRUE(all_close(got.at(name), want.at(name), 1e-12, 1e-12)) << name;
  }
}

TEST(PadProductColumns, AlignedSmallAndUnweightedProductsStay) {
  Graph g("stay");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {4, 16});
  g.mark_output(b.matmul(x, g.add_input("aligned", DType::f32, {16, 48})));
  g.mark_output(b.matmul(x, g.add_input("small", DType::f32, {16, 50})));
  const ValueId batched = g.add_input("batched", DType::f32, {4, 16, 50});  // not a 2-D weight
  g.mark_output(b.matmul(g.add_input("rows", DType::f32, {4, 3, 16}), batched));
  EXPECT_EQ(pad_product_columns(g), 0u);  // "small" does not pay at the default thresholds
  EXPECT_EQ(pad_product_columns(g, nullptr, kAlways), 1u);  // only "small"
  Graph again = g;
  EXPECT_EQ(pad_product_columns(again, nullptr, kAlways), 0u);  // its padded product is aligned
}

TEST(PadProductColumns, Gpt2HeadIsPaddedByDefault) {
  Graph g("gpt2_head");
  Builder b(g);
  const ValueId h = g.add_input("h", DType::f32, {16, 1024, 768});
  const ValueId w = g.add_input("w", DType::f32, {768, 50257});
  const ValueId y = b.matmul(h, w);
  g.rename_value(y, "logits");
  g.mark_output(y);
  EXPECT_EQ(pad_product_columns(g), 1u);
  const ValueId out = g.outputs().at(0);
  EXPECT_EQ(g.value(out).name, "logits");
  EXPECT_EQ(g.value(out).type.shape, (Shape{16, 1024, 50257}));
  bool padded = false;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::matmul) padded = g.value(n.outputs[0]).type.shape == Shape{16384, 50264};
  EXPECT_TRUE(padded) << g.dump();
  // A GPT-2 batch of one sequence of 16 tokens is too small to pay.
  Graph small("small");
  Builder bs(small);
  small.mark_output(bs.matmul(small.add_input("h", DType::f32, {1, 16, 768}),
                              small.add_input("w", DType::f32, {768, 50257})));
  EXPECT_EQ(pad_product_columns(small), 0u);
}

}  // namespace
}  // namespace fusebox::testing
