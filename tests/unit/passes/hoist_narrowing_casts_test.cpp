// hoist_narrowing_casts (passes/simplify.h): a narrowing cast moves above the transposes,
// reshapes, slices and expands it reads, up a chain, the same values bit for bit on the CPU;
// a widening cast, a mover read elsewhere too or returned by the graph, and a cast after a
// computing op stay; in the inference pipeline a norm behind a transpose then writes bf16.
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/passes/simplify.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

const Node& producer_of(const Graph& g, ValueId v) {
  return g.node(g.value(v).producer);
}

TEST(HoistNarrowingCasts, MovesUpAChainOfMoversExactly) {
  Graph g("chain");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {4, 6, 8});
  ValueId v = b.relu(x);
  v = b.transpose(v, {1, 0, 2});                                                      // [6, 4, 8]
  v = b.reshape(v, {24, 8});                                                          // [24, 8]
  v = b.slice(v, SliceAttrs{.starts = {1}, .ends = {7}, .axes = {1}, .steps = {2}});  // [24, 3]
  v = g.add_node(OpKind::expand, ExpandAttrs{{2, 24, 3}}, {v})[0];
  v = b.cast(v, DType::bf16);
  g.rename_value(v, "out");
  g.mark_output(v);
  const Graph before = g;
  EXPECT_EQ(hoist_narrowing_casts(g), 4u);  // above expand, slice, reshape, transpose
  g.verify();
  const ValueId out = g.outputs()[0];
  EXPECT_EQ(g.value(out).name, "out");
  EXPECT_EQ(g.value(out).type.dtype, DType::bf16);
  // The cast now reads the relu; every mover reads bf16.
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::cast) {
      EXPECT_EQ(producer_of(g, n.inputs[0]).op, OpKind::relu);
    } else if (n.op != OpKind::relu) {
      EXPECT_EQ(g.value(n.inputs[0]).type.dtype, DType::bf16) << n.name;
    }
  }
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {4, 6, 8}, 9, -3, 3)}};
  EXPECT_TRUE(all_close(run_graph(g, feeds).at("out"), run_graph(before, feeds).at("out"), 0, 0));
  EXPECT_EQ(hoist_narrowing_casts(g), 0u);
}

TEST(HoistNarrowingCasts, LeavesWhatMustStay) {
  auto unchanged = [](Graph g, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(hoist_narrowing_casts(g), 0u);
  };
  {
    Graph g("widening");
    Builder b(g);
    g.mark_output(b.cast(b.transpose(g.add_input("x", DType::bf16, {3, 4}), {1, 0}), DType::f32));
    unchanged(g, "a widening cast (moving it up would move more bytes)");
  }
  {
    Graph g("shared");
    Builder b(g);
    const ValueId t = b.transpose(g.add_input("x", DType::f32, {3, 4}), {1, 0});
    g.mark_output(b.cast(t, DType::bf16));
    g.mark_output(b.relu(t));
    unchanged(g, "the transpose read by another op too");
  }
  {
    Graph g("output");
    Builder b(g);
    const ValueId t = b.transpose(g.add_input("x", DType::f32, {3, 4}), {1, 0});
    g.mark_output(t);
    g.mark_output(b.cast(t, DType::bf16));
    unchanged(g, "the transpose's output returned");
  }
  {
    Graph g("computing");
    Builder b(g);
    g.mark_output(b.cast(b.relu(g.add_input("x", DType::f32, {3, 4})), DType::bf16));
    unchanged(g, "a cast after a computing op");
  }
}

// ViT's pattern: the residual stream (f32) -> layer norm -> transpose -> matmul. In bf16 the
// cast to bf16 goes above the transpose, and the norm then writes bf16 itself.
TEST(HoistNarrowingCasts, NormBehindATransposeWritesBf16InThePipeline) {
  Graph g("vit_block");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 5, 16});
  const ValueId scale = g.add_constant("scale", random_tensor(DType::f32, {16}, 1, 0.5, 1.5));
  const ValueId bias = g.add_constant("bias", random_tensor(DType::f32, {16}, 2));
  ValueId v = b.layer_norm(x, scale, bias, NormAttrs{.axis = -1});
  v = b.transpose(v, {1, 0, 2});
  v = b.matmul(v, g.add_constant("w", random_tensor(DType::f32, {16, 8}, 3)));
  g.rename_value(v, "out");
  g.mark_output(v);
  PipelineOptions with{
      .kind = PipelineKind::inference, .precision = Precision::bf16, .verify = true};
  PipelineOptions without = with;
  without.fusion.hoist_casts = false;
  const Graph hoisted = prepare_graph(g, with), plain = prepare_graph(g, without);
  auto norm_y = [](const Graph& p) {
    for (const Node& n : p.nodes())
      if (n.op == OpKind::layer_norm) return p.value(n.outputs[0]).type.dtype;
    return DType::boolean;
  };
  EXPECT_EQ(norm_y(hoisted), DType::bf16);
  EXPECT_EQ(norm_y(plain), DType::f32);
  for (const Node& n : hoisted.nodes())
    if (n.op == OpKind::transpose) EXPECT_EQ(hoisted.value(n.inputs[0]).type.dtype, DType::bf16);
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {2, 5, 16}, 4, -2, 2)}};
  // The same values up to the norm's one rounding where the unfolded graph rounds twice.
  EXPECT_LE(relative_l2(run_graph(hoisted, feeds).at("out"), run_graph(plain, feeds).at("out")),
            1e-2);
}

}  // namespace
}  // namespace fusebox::testing
