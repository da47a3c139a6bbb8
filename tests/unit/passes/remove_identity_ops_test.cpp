// remove_identity_ops (passes/simplify.h): every kind of identity goes and its readers read
// its input; the look-alikes that do move data stay (a pad by one, a reversing slice, a
// transpose, a cast to another dtype, a concat of two); an identity that is a graph output
// stays; the graph computes the same values on the CPU, bit for bit.
#include <limits>

#include "fusebox/ir/builder.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/passes/simplify.h"
#include "fusebox/runtime/executor.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// Swin's pattern and the other identities, each followed by a relu that reads it, summed.
Graph with_identities() {
  Graph g("identities");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 6, 6, 4});
  std::vector<ValueId> outs;
  // pad by zeros, then a slice of everything (Swin's pad to a window multiple and crop).
  ValueId padded = b.pad(x, PadAttrs{.pads = {0, 0, 0, 0, 0, 0, 0, 0}});
  outs.push_back(b.relu(b.slice(
      padded, SliceAttrs{.starts = {0, 0}, .ends = {6, 6}, .axes = {1, 2}, .steps = {1, 1}})));
  outs.push_back(b.relu(b.transpose(x, {0, 1, 2, 3})));
  outs.push_back(b.relu(b.cast(x, DType::f32)));
  outs.push_back(b.relu(b.concat({x}, 3)));
  outs.push_back(b.relu(b.reshape(x, {2, 6, 6, 4})));
  outs.push_back(b.relu(g.add_node(OpKind::expand, ExpandAttrs{{2, 6, 6, 4}}, {x})[0]));
  ValueId sum = outs[0];
  for (size_t i = 1; i < outs.size(); ++i) sum = b.add(sum, outs[i]);
  g.mark_output(sum);
  return g;
}

TEST(RemoveIdentityOps, EveryIdentityGoesAndTheValuesStay) {
  const Graph before = with_identities();
  Graph g = before;
  EXPECT_EQ(remove_identity_ops(g), 7u);  // pad, slice, transpose, cast, concat, reshape, expand
  for (OpKind op : {OpKind::pad, OpKind::slice, OpKind::transpose, OpKind::cast, OpKind::concat,
                    OpKind::reshape, OpKind::expand})
    EXPECT_EQ(count_ops(g, op), 0) << op_name(op);
  EXPECT_EQ(count_ops(g, OpKind::relu), 6);
  g.verify();
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {2, 6, 6, 4}, 3)}};
  const NamedTensors want = run_graph(before, feeds), got = run_graph(g, feeds);
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 0, 0)) << name;
  EXPECT_EQ(remove_identity_ops(g), 0u);  // nothing left to remove
}

TEST(RemoveIdentityOps, LookAlikesThatMoveDataStay) {
  Graph g("look_alikes");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 6, 6, 4});
  std::vector<ValueId> outs = {
      b.pad(x, PadAttrs{.pads = {0, 0, 0, 0, 0, 1, 0, 0}}),
      b.slice(x, SliceAttrs{.starts = {5},  // every element, reversed
                            .ends = {std::numeric_limits<int64_t>::min()},
                            .axes = {1},
                            .steps = {-1}}),
      b.transpose(x, {0, 2, 1, 3}),
      b.cast(x, DType::bf16),
      b.concat({x, x}, 3),
      b.reshape(x, {2, 36, 4}),
  };
  for (ValueId v : outs) g.mark_output(b.relu(v));
  const size_t nodes = g.nodes().size();
  EXPECT_EQ(remove_identity_ops(g), 0u);
  EXPECT_EQ(g.nodes().size(), nodes);
}

// An identity whose output the graph returns keeps its node (and the output its name).
TEST(RemoveIdentityOps, GraphOutputsStay) {
  Graph g("output");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {3, 4});
  const ValueId y = b.transpose(b.relu(x), {0, 1});
  g.rename_value(y, "y");
  g.mark_output(y);
  EXPECT_EQ(remove_identity_ops(g), 0u);
  EXPECT_EQ(count_ops(g, OpKind::transpose), 1);
}

// The pipelines run it first; FUSEBOX_FUSION=0 (InferenceFusionOptions::none) leaves it out.
TEST(RemoveIdentityOps, InferencePipelineRemovesThem) {
  PipelineLog log;
  const Graph g = prepare_graph(with_identities(), {.kind = PipelineKind::inference, .log = &log});
  ASSERT_FALSE(log.passes.empty());
  EXPECT_EQ(log.passes[0].pass, "remove_identity_ops");
  EXPECT_EQ(log.passes[0].rewrites, 7u);
  EXPECT_EQ(count_ops(g, OpKind::pad), 0);
}

}  // namespace
}  // namespace fusebox::testing
