// form_linears (passes/fusion.h): matmul by a 2-D weight + an add of a bias along the last dim
// (nn.Linear as ONNX exporters write it) becomes one gemm with the bias, through reshape views
// for N-D activations; a bias-less one of an N-D x a gemm without it. On the CPU backend: the same
// values and gradients as the matmul + add; what is not such a pair stays; in bf16 inference the
// layer's output stays bf16 (no f32 add).
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/pipeline.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// x [x_shape] @ w [8, 8] + bias [bias_shape] -> gelu -> "out"; `read_twice` also outputs the
// product itself.
Graph linear(const Shape& x_shape, const Shape& bias_shape, bool read_twice = false) {
  Graph g("linear");
  const ValueId x = g.add_input("x", DType::f32, x_shape);
  const ValueId w = g.add_constant("w", random_tensor(DType::f32, {8, 8}, 1));
  const ValueId b = g.add_constant("b", random_tensor(DType::f32, bias_shape, 2));
  const ValueId p = g.add_node(OpKind::matmul, {}, {x, w}, "fc/MatMul")[0];
  const ValueId y = g.add_node(OpKind::add, {}, {b, p}, "fc/Add")[0];
  const ValueId out = g.add_node(OpKind::gelu, GeluAttrs{}, {y}, "act")[0];
  g.rename_value(out, "out");
  g.mark_output(out);
  if (read_twice) {
    g.rename_value(p, "product");
    g.mark_output(p);
  }
  return g;
}

TEST(FormLinears, MatmulAndBiasBecomeOneGemm) {
  for (const Shape& x_shape : {Shape{6, 8}, Shape{2, 3, 8}, Shape{2, 2, 3, 8}}) {
    for (const Shape& bias_shape : {Shape{8}, Shape{1, 1, 8}}) {
      if (bias_shape.size() > x_shape.size()) continue;
      SCOPED_TRACE(cat("x ", shape_str(x_shape), " bias ", shape_str(bias_shape)));
      const Graph before = linear(x_shape, bias_shape);
      Graph g = before;
      FusionLog log;
      ASSERT_EQ(form_linears(g, &log), 1u);
      EXPECT_EQ(count_ops(g, OpKind::gemm), 1);
      EXPECT_EQ(count_ops(g, OpKind::matmul) + count_ops(g, OpKind::add), 0);
      EXPECT_EQ(count_ops(g, OpKind::reshape),
                (x_shape.size() > 2 ? 2 : 0) + (bias_shape.size() > 1 ? 1 : 0));
      ASSERT_EQ(log.groups().size(), 1u);
      const NamedTensors feeds = {{"x", random_tensor(DType::f32, x_shape, 3)}};
      EXPECT_TRUE(
          all_close(run_graph(g, feeds).at("out"), run_graph(before, feeds).at("out"), 1e-6, 1e-6));
      // The gradients through the gemm and the reshapes: those of the matmul + add.
      auto gradients = [&](Graph graph) {
        const ValueId loss = graph.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false},
                                            {graph.outputs()[0]}, "loss")[0];
        grad(graph, loss, {graph.inputs()[0]}, {.mark_outputs = true});
        return run_graph(graph, feeds);
      };
      const NamedTensors want = gradients(before), got = gradients(g);
      for (const auto& [name, t] : want) {
        if (name == "out") continue;
        ASSERT_TRUE(got.count(name)) << name;
        EXPECT_TRUE(all_close(got.at(name), t, 1e-6, 1e-6)) << name;
      }
    }
  }
}

// A matmul of an N-D x by a 2-D weight with no bias to take (none, one read elsewhere, one per
// row) becomes a bias-less gemm, the add kept; the values and gradients are the matmul's. A 2-D
// x's matmul stays (it is one product already), and so does one whose columns are not a
// multiple of 8.
TEST(FormLinears, BiasLessLinearsBecomeGemms) {
  struct Case {
    const char* name;
    Graph graph;
  };
  Graph bare("bare");
  {
    const ValueId x = bare.add_input("x", DType::f32, {2, 2, 3, 8});
    const ValueId w = bare.add_constant("w", random_tensor(DType::f32, {8, 8}, 1));
    const ValueId p = bare.add_node(OpKind::matmul, {}, {x, w}, "reduction/MatMul")[0];
    const ValueId out = bare.add_node(OpKind::gelu, GeluAttrs{}, {p}, "act")[0];
    bare.rename_value(out, "out");
    bare.mark_output(out);
  }
  const Case cases[] = {
      {"no bias", bare},
      {"the product read elsewhere", linear({2, 3, 8}, {8}, /*read_twice=*/true)},
      {"a bias per row", linear({2, 3, 8}, {3, 8})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Graph g = c.graph;
    ASSERT_EQ(form_linears(g), 1u);
    EXPECT_EQ(count_ops(g, OpKind::gemm), 1);
    EXPECT_EQ(count_ops(g, OpKind::matmul), 0);
    EXPECT_EQ(count_ops(g, OpKind::add), count_ops(c.graph, OpKind::add));
    for (const Node& n : g.nodes()) {
      if (n.op == OpKind::gemm) {
        EXPECT_EQ(n.inputs.size(), 2u);
      }
    }
    const Shape x_shape = c.graph.value(c.graph.inputs()[0]).type.shape;
    const NamedTensors feeds = {{"x", random_tensor(DType::f32, x_shape, 3)}};
    const NamedTensors want_forward = run_graph(c.graph, feeds), got_forward = run_graph(g, feeds);
    for (const auto& [name, t] : want_forward)
      EXPECT_TRUE(all_close(got_forward.at(name), t, 1e-6, 1e-6)) << name;
    auto gradients = [&](Graph graph) {
      const ValueId loss = graph.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false},
                                          {graph.outputs()[0]}, "loss")[0];
      grad(graph, loss, {graph.inputs()[0]}, {.mark_outputs = true});
      return run_graph(graph, feeds);
    };
    const NamedTensors want = gradients(c.graph), got = gradients(g);
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_TRUE(all_close(got.at(name), t, 1e-6, 1e-6)) << name;
    }
  }
  Graph flat = linear({6, 8}, {6, 8});  // a 2-D x with a bias per row
  EXPECT_EQ(form_linears(flat), 0u);
  // Columns that are not a multiple of 8 stay a matmul (pad_product_columns pads them).
  Graph unaligned("unaligned");
  const ValueId x = unaligned.add_input("x", DType::f32, {2, 3, 8});
  const ValueId w = unaligned.add_constant("w", random_tensor(DType::f32, {8, 5}, 1));
  unaligned.mark_output(unaligned.add_node(OpKind::matmul, {}, {x, w}, "head")[0]);
  EXPECT_EQ(form_linears(unaligned), 0u);
}

TEST(FormLinears, LeavesWhatIsNotALinear) {
  // A batched weight [2, 8, 4] is no linear layer.
  Graph batched("batched");
  const ValueId x = batched.add_input("x", DType::f32, {2, 3, 8});
  const ValueId w = batched.add_input("w", DType::f32, {2, 8, 4});
  const ValueId p = batched.add_node(OpKind::matmul, {}, {x, w}, "mm")[0];
  const ValueId y = batched.add_node(
      OpKind::add, {}, {p, batched.add_constant("b", Tensor::zeros(DType::f32, {4}))}, "add")[0];
  batched.mark_output(y);
  EXPECT_EQ(form_linears(batched), 0u);
}

// In bf16 inference the exported linear runs as one bf16 gemm: no f32 add, no cast of its
// output (the matmul + f32 bias add would promote the layer's output to f32).
TEST(FormLinears, Bf16InferenceKeepsTheLayerInBf16) {
  const Graph model = linear({2, 3, 8}, {8});
  const Graph g =
      prepare_graph(model, {.kind = PipelineKind::inference, .precision = Precision::bf16});
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::gemm) continue;
    EXPECT_EQ(g.value(n.outputs[0]).type.dtype, DType::bf16);
    EXPECT_EQ(n.inputs.size(), 3u);  // the bias taken in
  }
  EXPECT_EQ(count_ops(g, OpKind::gemm), 1);
  EXPECT_EQ(count_ops(g, OpKind::add), 0);
}

}  // namespace
}  // namespace fusebox::testing
