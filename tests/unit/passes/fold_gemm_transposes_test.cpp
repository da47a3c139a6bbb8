// fold_gemm_transposes (passes/simplify.h): a gemm's operand transposes fold into its flags (both
// operands, each flag either way), the values stay the same bit for bit (CPU), and a transpose
// read elsewhere or returned by the graph stays.
#include "fusebox/ir/builder.h"
#include "fusebox/passes/simplify.h"
#include "fusebox/runtime/executor.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

TEST(FoldGemmTransposes, OperandTransposesBecomeFlags) {
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      SCOPED_TRACE(cat("trans_a ", trans_a, " trans_b ", trans_b));
      Graph g("gemm");
      Builder b(g);
      // A [4, 6] (as stored: [6, 4] when trans_a), B [6, 5] ([5, 6] when trans_b), each given
      // transposed once more so that a transpose makes the operand.
      const ValueId a = g.add_input("a", DType::f32, trans_a ? Shape{4, 6} : Shape{6, 4});
      const ValueId w = g.add_input("w", DType::f32, trans_b ? Shape{6, 5} : Shape{5, 6});
      const ValueId c = g.add_input("c", DType::f32, {5});
      const ValueId y = g.add_node(OpKind::gemm, GemmAttrs{trans_a, trans_b, 1.0, 1.0},
                                   {b.transpose(a, {1, 0}), b.transpose(w, {1, 0}), c}, "gemm")[0];
      g.rename_value(y, "y");
      g.mark_output(y);
      const Graph before = g;
      EXPECT_EQ(fold_gemm_transposes(g), 2u);
      EXPECT_EQ(count_ops(g, OpKind::transpose), 0);
      for (const Node& n : g.nodes()) {
        if (n.op != OpKind::gemm) continue;
        const auto& attrs = std::get<GemmAttrs>(n.attrs);
        EXPECT_EQ(attrs.trans_a, !trans_a);
        EXPECT_EQ(attrs.trans_b, !trans_b);
      }
      g.verify();
      const NamedTensors feeds{
          {"a", random_tensor(DType::f32, g.value(*g.find_value("a")).type.shape, 1)},
          {"w", random_tensor(DType::f32, g.value(*g.find_value("w")).type.shape, 2)},
          {"c", random_tensor(DType::f32, {5}, 3)}};
      EXPECT_TRUE(all_close(run_graph(g, feeds).at("y"), run_graph(before, feeds).at("y"), 0, 0));
    }
  }
}

TEST(FoldGemmTransposes, SharedOrReturnedTransposesStay) {
  Graph g("shared");
  Builder b(g);
  const ValueId a = g.add_input("a", DType::f32, {4, 6});
  const ValueId w = g.add_input("w", DType::f32, {5, 6});
  const ValueId wt = b.transpose(w, {1, 0});
  g.mark_output(g.add_node(OpKind::gemm, GemmAttrs{}, {a, wt}, "gemm")[0]);
  g.mark_output(b.relu(wt));  // a second reader
  const ValueId v = g.add_input("v", DType::f32, {5, 6});
  const ValueId vt = b.transpose(v, {1, 0});
  g.mark_output(g.add_node(OpKind::gemm, GemmAttrs{}, {a, vt}, "gemm2")[0]);
  g.mark_output(vt);  // returned by the graph
  EXPECT_EQ(fold_gemm_transposes(g), 0u);
}

}  // namespace
}  // namespace fusebox::testing
