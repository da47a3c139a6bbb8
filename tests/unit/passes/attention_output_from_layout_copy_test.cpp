// attention_output_from_layout_copy (passes/simplify.h): attention_backward reads the forward's
// output through the inverse of the transpose and reshape that made the output projection's
// rows, so that only the rows are kept for the backward; the gradients do not change.
#include "fusebox/ir/builder.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/simplify.h"
#include "fusebox/runtime/executor.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// q, k, v [2, 2, 5, 4] -> attention -> transpose to [2, 5, 2, 4] -> rows [10, 8] -> x w ->
// mean of squares; the gradients of q, k, v and w are the outputs. `extra_reader`: the
// attention output is also read by something else (an add), which keeps it anyway.
Graph attention_step(bool extra_reader) {
  Graph g("attention_step");
  Builder b(g);
  const Shape s{2, 2, 5, 4};
  const ValueId q = g.add_input("q", DType::f32, s);
  const ValueId k = g.add_input("k", DType::f32, s);
  const ValueId v = g.add_input("v", DType::f32, s);
  const ValueId w = g.add_input("w", DType::f32, {8, 3});
  const ValueId o =
      b.op(OpKind::attention, AttentionAttrs{.scale = 0.5, .with_lse = true}, {q, k, v})[0];
  const ValueId rows = b.reshape(b.transpose(o, {0, 2, 1, 3}), {10, 8});
  const ValueId y = b.matmul(rows, w);
  ValueId loss = b.reduce_mean(b.mul(y, y), {}, false);
  if (extra_reader) loss = b.add(loss, b.reduce_mean(o, {}, false));
  g.mark_output(loss);
  const GradResult r = grad(g, loss, {q, k, v, w});
  for (const auto& [in, name] : {std::pair{q, "dq"}, {k, "dk"}, {v, "dv"}, {w, "dw"}}) {
    g.rename_value(r.of(in), name);
    g.mark_output(r.of(in));
  }
  return g;
}

TEST(AttentionOutputFromLayoutCopy, TheBackwardReadsTheRowsAndTheGradientsStay) {
  const Graph plain = attention_step(false);
  Graph g = plain;
  EXPECT_EQ(attention_output_from_layout_copy(g), 1u);
  g.verify();
  // The attention output's only reader is the forward's transpose now; attention_backward
  // reads a transpose of a reshape of the rows.
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::attention) {
      int readers = 0;
      for (const Node& m : g.nodes())
        for (ValueId in : m.inputs) readers += in == n.outputs[0];
      EXPECT_EQ(readers, 1) << "the attention output is still read by the backward";
    }
    if (n.op != OpKind::attention_backward) continue;
    const Node& t = g.node(g.value(n.inputs[4]).producer);
    ASSERT_EQ(t.op, OpKind::transpose);
    EXPECT_EQ(std::get<TransposeAttrs>(t.attrs).perm, (std::vector<int64_t>{0, 2, 1, 3}));
    const Node& r = g.node(g.value(t.inputs[0]).producer);
    ASSERT_EQ(r.op, OpKind::reshape);
    EXPECT_EQ(g.value(r.inputs[0]).type.shape, (Shape{10, 8}));
  }
  const NamedTensors in{{"q", random_tensor(DType::f32, {2, 2, 5, 4}, 1)},
                        {"k", random_tensor(DType::f32, {2, 2, 5, 4}, 2)},
                        {"v", random_tensor(DType::f32, {2, 2, 5, 4}, 3)},
                        {"w", random_tensor(DType::f32, {8, 3}, 4)}};
  const NamedTensors want = run_graph(plain, in);
  const NamedTensors got = run_graph(g, in);
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 0, 0)) << name;
}

TEST(AttentionOutputFromLayoutCopy, AnOutputReadElsewhereStays) {
  Graph g = attention_step(true);
  EXPECT_EQ(attention_output_from_layout_copy(g), 0u);
}

}  // namespace
}  // namespace fusebox::testing
