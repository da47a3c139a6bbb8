// swap_transposed_products (passes/simplify.h): a large product's classes-first transpose
// becomes the swapped product (b a constant, transposed at compile; or b a transpose, whose input
// is read instead), the values the same on the CPU, and the products it must leave (small, read
// elsewhere, a large beside the product, b neither constant nor a transpose) keep their
// transpose.
#include "fusebox/ir/builder.h"
#include "fusebox/passes/simplify.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr int64_t kBatch = 2, kRows = 128, kInner = 64, kClasses = 16400;  // the product 16.8 MB

// logits = transpose(matmul(h, head), [0, 2, 1]) with head [K, N]: a constant ("constant"), a
// transpose of a constant [N, K] ("tied", GPT-2's tied LM head), or an input ("input").
Graph logits_graph(const std::string& head_kind, int64_t classes = kClasses,
                   bool read_twice = false, int64_t rows = kRows) {
  Graph g("logits");
  Builder b(g);
  const ValueId h = g.add_input("h", DType::f32, {kBatch, rows, kInner});
  ValueId head = kNoValue;
  if (head_kind == "constant") {
    head = g.add_constant("head", random_tensor(DType::f32, {kInner, classes}, 2, -0.5, 0.5));
  } else if (head_kind == "tied") {
    const ValueId wte =
        g.add_constant("wte", random_tensor(DType::f32, {classes, kInner}, 3, -0.5, 0.5));
    head = b.transpose(wte, {1, 0});
  } else {
    head = g.add_input("head", DType::f32, {kInner, classes});
  }
  const ValueId product = b.matmul(h, head);
  const ValueId logits = b.transpose(product, {0, 2, 1});
  g.rename_value(logits, "logits");
  g.mark_output(logits);
  if (read_twice) {
    g.rename_value(product, "product");
    g.mark_output(product);
  }
  return g;
}

NamedTensors feeds_of(const Graph& g) {
  NamedTensors feeds;
  for (ValueId v : g.inputs())
    feeds[g.value(v).name] = random_tensor(DType::f32, g.value(v).type.shape, 5, -1, 1);
  return feeds;
}

TEST(SwapTransposedProducts, TheProductWritesTheTransposedOrder) {
  for (const char* kind : {"constant", "tied"}) {
    SCOPED_TRACE(kind);
    const Graph before = logits_graph(kind);
    Graph g = before;
    EXPECT_EQ(swap_transposed_products(g), 1u);
    g.verify();
    // The logits come from a matmul of the head transposed (a constant [N, K], the tied
    // head's own constant) by h transposed; the only transpose left is h's.
    const Node& writer = g.node(g.value(*g.find_value("logits")).producer);
    ASSERT_EQ(writer.op, OpKind::matmul);
    EXPECT_TRUE(g.is_constant(writer.inputs[0]));
    EXPECT_EQ(g.value(writer.inputs[0]).type.shape, (Shape{kClasses, kInner}));
    EXPECT_EQ(count_ops(g, OpKind::transpose), 1);
    EXPECT_EQ(g.value(g.node(g.value(writer.inputs[1]).producer).inputs[0]).name, "h");
    const NamedTensors feeds = feeds_of(before);
    const Tensor want = run_graph(before, feeds).at("logits"),
                 got = run_graph(g, feeds).at("logits");
    EXPECT_TRUE(all_close(got, want, 1e-6, 1e-6));
  }
}

TEST(SwapTransposedProducts, LeavesWhatItCannotOrNeedNotSwap) {
  struct Case {
    const char* why;
    Graph g;
  };
  const Case cases[] = {
      {"a small product", logits_graph("constant", 1000)},
      {"the product read elsewhere", logits_graph("constant", kClasses, /*read_twice=*/true)},
      {"b an input", logits_graph("input")},
      {"a as large as an eighth of the product", logits_graph("constant", 500, false, 4200)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.why);
    Graph g = c.g;
    EXPECT_EQ(swap_transposed_products(g), 0u);
    EXPECT_EQ(g.nodes().size(), c.g.nodes().size());
  }
}

}  // namespace
}  // namespace fusebox::testing
