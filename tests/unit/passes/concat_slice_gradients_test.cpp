// concat_slice_gradients (passes/simplify.h): the gradient of a value split into parts that
// tile an axis (GPT-2's qkv) becomes one concat of the parts' gradients, with the same values;
// parts that leave a gap, overlap or slice two axes keep their scatters and adds.
#include "fusebox/ir/builder.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/simplify.h"
#include "fusebox/runtime/executor.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// loss = sum over the parts of sum(slice(x) * c_i); x [2, 3, 12]; the parts' [start, end) of
// axis `axis` (the others whole). Output "dx".
Graph split(const std::vector<std::pair<int64_t, int64_t>>& parts, int64_t axis = 2) {
  Graph g("split");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {2, 3, 12});
  ValueId loss = kNoValue;
  uint64_t seed = 1;
  for (const auto& [start, end] : parts) {
    const ValueId part = b.slice(x, SliceAttrs{.starts = {start}, .ends = {end}, .axes = {axis}});
    const ValueId c =
        g.add_constant(cat("c", seed), random_tensor(DType::f64, g.value(part).type.shape, seed));
    ++seed;
    const ValueId term = b.reduce_sum(b.mul(part, c), {}, false);
    loss = loss == kNoValue ? term : b.add(loss, term);
  }
  const GradResult r = grad(g, loss, {x});
  g.rename_value(r.of(x), "dx");
  g.mark_output(r.of(x));
  return g;
}

TEST(ConcatSliceGradients, AQkvSplitsGradientIsOneConcat) {
  const Graph plain = split({{0, 4}, {4, 8}, {8, 12}});
  Graph folded = plain;
  EXPECT_EQ(concat_slice_gradients(folded), 1u);
  EXPECT_EQ(count_ops(folded, OpKind::slice_backward), 0);
  EXPECT_EQ(count_ops(folded, OpKind::concat), 1);
  folded.verify();
  const NamedTensors in{{"x", random_tensor(DType::f64, {2, 3, 12}, 9)}};
  EXPECT_TRUE(all_close(run_graph(folded, in).at("dx"), run_graph(plain, in).at("dx"), 0, 0));
  // Out of order, another axis.
  Graph shuffled = split({{1, 3}, {0, 1}}, 1);
  const Graph shuffled_plain = shuffled;
  EXPECT_EQ(concat_slice_gradients(shuffled), 1u);
  EXPECT_TRUE(
      all_close(run_graph(shuffled, in).at("dx"), run_graph(shuffled_plain, in).at("dx"), 0, 0));
}

TEST(ConcatSliceGradients, GapsAndOverlapsStay) {
  for (const auto& parts : std::vector<std::vector<std::pair<int64_t, int64_t>>>{
           {{0, 4}, {5, 12}}, {{0, 6}, {4, 12}}, {{0, 12}}}) {
    Graph g = split(parts);
    EXPECT_EQ(concat_slice_gradients(g), 0u) << parts.size();
  }
}

}  // namespace
}  // namespace fusebox::testing
