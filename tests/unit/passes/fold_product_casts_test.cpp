// fold_product_casts (passes/fusion.h): a bf16 / f16 product read only by a widening cast to
// f32 becomes gemm's mixed form (ir/ops.h GemmAttrs::y_dtype), a matmul of rows through
// reshapes; what must not fold stays; the folded graph computes the product in f32 from the
// same low-precision operands on the CPU backend (the unfolded graph: the same rounded once to
// the low dtype); the mixed form's IR checks, and autodiff and the ONNX exporter refuse it.
// The CUDA kernel of the mixed form: tests/unit/cuda/kernels/test_ops_matmul.cpp.
#include <string>

#include "fusebox/frontends/onnx.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/pipeline.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr int64_t kK = 16, kN = 20;  // N not a multiple of 8, as GPT-2's vocabulary

// x (`low`, shape `x_shape`) matmul w (`low`, [K, N]) -> cast f32 -> output "out".
Graph product_then_cast(DType low, const Shape& x_shape) {
  Graph g("lm_head");
  Builder b(g);
  const ValueId w = g.add_constant("w", random_tensor(low, {kK, kN}, 7));
  ValueId v = b.cast(b.matmul(g.add_input("x", low, x_shape), w), DType::f32);
  g.rename_value(v, "out");
  g.mark_output(v);
  return g;
}

// The product computed in f32 from the same low-precision operands: the mixed form's values.
Graph product_in_f32(DType low, const Shape& x_shape) {
  Graph g("lm_head_f32");
  Builder b(g);
  const ValueId w = g.add_constant("w", random_tensor(low, {kK, kN}, 7));
  ValueId v = b.matmul(b.cast(g.add_input("x", low, x_shape), DType::f32), b.cast(w, DType::f32));
  g.rename_value(v, "out");
  g.mark_output(v);
  return g;
}

const Node& only_gemm(const Graph& g) {
  for (const Node& n : g.nodes())
    if (n.op == OpKind::gemm) return n;
  throw Error("test", "no gemm");
}

TEST(FoldProductCasts, MatmulOfRowsBecomesTheMixedGemm) {
  for (DType low : {DType::bf16, DType::f16}) {
    for (const Shape& x : {Shape{6, kK}, Shape{2, 3, kK}}) {
      SCOPED_TRACE(cat(dtype_name(low), " x ", shape_str(x)));
      const Graph before = product_then_cast(low, x);
      Graph g = before;
      FusionLog log;
      EXPECT_EQ(fold_product_casts(g, &log), 1u);
      g.verify();
      EXPECT_EQ(count_ops(g, OpKind::cast), 0);
      EXPECT_EQ(count_ops(g, OpKind::matmul), 0);
      EXPECT_EQ(count_ops(g, OpKind::reshape), x.size() > 2 ? 2 : 0);
      const Node& gemm = only_gemm(g);
      EXPECT_EQ(std::get<GemmAttrs>(gemm.attrs).y_dtype, DType::f32);
      EXPECT_EQ(g.value(gemm.inputs[0]).type.dtype, low);
      ASSERT_EQ(g.outputs().size(), 1u);
      const Value& out = g.value(g.outputs()[0]);
      EXPECT_EQ(out.name, "out");
      EXPECT_EQ(out.type, (TensorType{DType::f32, before.value(before.outputs()[0]).type.shape}));
      ASSERT_EQ(log.groups().size(), 1u);
      EXPECT_EQ(log.groups()[0].ops.size(), 2u);  // the product, the cast
      const NamedTensors feeds{{"x", random_tensor(low, x, 3, -2, 2)}};
      const Tensor got = run_graph(g, feeds).at("out");
      // The same f32 sums (the summation order may differ by the f32 rounding only) ...
      EXPECT_TRUE(all_close(got, run_graph(product_in_f32(low, x), feeds).at("out"), 1e-5, 1e-5));
      // ... which the unfolded graph rounded to the low dtype: within its unit.
      const double ulp = low == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
      EXPECT_TRUE(all_close(got, run_graph(before, feeds).at("out"), ulp, 1e-6));
      EXPECT_EQ(fold_product_casts(g), 0u);  // nothing left
    }
  }
}

TEST(FoldProductCasts, GemmKeepsItsTransposes) {
  Graph g("gemm");
  Builder b(g);
  const ValueId a = g.add_input("a", DType::bf16, {kK, 5});  // [K, M]
  const ValueId w = g.add_constant("w", random_tensor(DType::bf16, {kN, kK}, 9));
  ValueId v =
      b.cast(b.gemm(a, w, kNoValue, GemmAttrs{.trans_a = true, .trans_b = true}), DType::f32);
  g.rename_value(v, "out");
  g.mark_output(v);
  const Graph before = g;
  EXPECT_EQ(fold_product_casts(g), 1u);
  g.verify();
  const auto& attrs = std::get<GemmAttrs>(only_gemm(g).attrs);
  EXPECT_TRUE(attrs.trans_a && attrs.trans_b);
  EXPECT_EQ(attrs.y_dtype, DType::f32);
  EXPECT_EQ(count_ops(g, OpKind::reshape), 0);
  const NamedTensors feeds{{"a", random_tensor(DType::bf16, {kK, 5}, 4)}};
  EXPECT_TRUE(all_close(run_graph(g, feeds).at("out"), run_graph(before, feeds).at("out"),
                        1.0 / 256, 1e-6));
}

TEST(FoldProductCasts, LeavesWhatMustNotFold) {
  auto folds = [](Graph g) { return fold_product_casts(g); };
  {  // the product read by another node too
    Graph g("shared");
    Builder b(g);
    const ValueId p =
        b.matmul(g.add_input("x", DType::bf16, {4, kK}), g.add_input("w", DType::bf16, {kK, kN}));
    g.mark_output(b.cast(p, DType::f32));
    g.mark_output(b.relu(p));
    EXPECT_EQ(folds(g), 0u);
  }
  {  // the product itself an output
    Graph g("output");
    Builder b(g);
    const ValueId p =
        b.matmul(g.add_input("x", DType::bf16, {4, kK}), g.add_input("w", DType::bf16, {kK, kN}));
    g.mark_output(p);
    g.mark_output(b.cast(p, DType::f32));
    EXPECT_EQ(folds(g), 0u);
  }
  {  // a narrowing or same-width cast; an f32 product; a cast of something else (one input)
    Graph g("casts");
    Builder b(g);
    g.mark_output(b.cast(b.relu(g.add_input("r", DType::bf16, {4})), DType::f32));
    g.mark_output(b.cast(
        b.matmul(g.add_input("x", DType::bf16, {4, kK}), g.add_input("w", DType::bf16, {kK, kN})),
        DType::f16));
    g.mark_output(b.cast(
        b.matmul(g.add_input("x32", DType::f32, {4, kK}), g.add_input("w32", DType::f32, {kK, kN})),
        DType::f64));
    EXPECT_EQ(folds(g), 0u);
  }
  {  // a gemm with C; a batched matmul (3-D B); an empty product
    Graph g("others");
    Builder b(g);
    g.mark_output(
        b.cast(b.gemm(g.add_input("a", DType::bf16, {4, kK}),
                      g.add_input("b", DType::bf16, {kK, kN}), g.add_input("c", DType::bf16, {kN})),
               DType::f32));
    g.mark_output(b.cast(b.matmul(g.add_input("xb", DType::bf16, {2, 4, kK}),
                                  g.add_input("wb", DType::bf16, {2, kK, kN})),
                         DType::f32));
    g.mark_output(b.cast(
        b.matmul(g.add_input("x0", DType::bf16, {0, kK}), g.add_input("w0", DType::bf16, {kK, kN})),
        DType::f32));
    EXPECT_EQ(folds(g), 0u);
  }
}

// Mixed precision (bf16) leaves an f32 model's last product as bf16 between casts, the graph
// output f32: the inference pipeline folds it, and its values are the f32 graph's within bf16's
// operand rounding.
TEST(FoldProductCasts, InferencePipelineTakesTheOutputsCast) {
  Graph g("head");
  Builder b(g);
  ValueId v = b.matmul(g.add_input("x", DType::f32, {2, 4, kK}),
                       g.add_constant("w", random_tensor(DType::f32, {kK, kN}, 21)));
  g.rename_value(v, "out");
  g.mark_output(v);
  PipelineOptions with{
      .kind = PipelineKind::inference, .precision = Precision::bf16, .verify = true};
  PipelineOptions without = with;
  without.fusion.product_casts = false;
  const Graph folded = prepare_graph(g, with), unfolded = prepare_graph(g, without);
  EXPECT_EQ(std::get<GemmAttrs>(only_gemm(folded).attrs).y_dtype, DType::f32);
  EXPECT_EQ(count_ops(unfolded, OpKind::cast) - count_ops(folded, OpKind::cast), 1);
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {2, 4, kK}, 5)}};
  const Tensor want = run_graph(g, feeds).at("out");
  EXPECT_LE(relative_l2(run_graph(folded, feeds).at("out"), want), 1e-2);
  // Closer to the f32 graph than the unfolded one, which also rounds the product.
  EXPECT_LE(relative_l2(run_graph(folded, feeds).at("out"), want),
            relative_l2(run_graph(unfolded, feeds).at("out"), want));
}

TEST(FoldProductCasts, TheMixedFormsIrChecksAndWhoRefusesIt) {
  Graph g("mixed");
  const ValueId a = g.add_input("a", DType::bf16, {4, kK});
  const ValueId w = g.add_input("w", DType::bf16, {kK, kN});
  const ValueId c = g.add_input("c", DType::bf16, {kN});
  const ValueId a32 = g.add_input("a32", DType::f32, {4, kK});
  const ValueId w32 = g.add_input("w32", DType::f32, {kK, kN});
  auto gemm = [&](ValueId x, ValueId y, ValueId bias, DType to) {
    GemmAttrs attrs;
    attrs.y_dtype = to;
    std::vector<ValueId> in = {x, y};
    if (bias != kNoValue) in.push_back(bias);
    return g.add_node(OpKind::gemm, attrs, in, "head")[0];
  };
  auto throws_naming = [](auto&& f, const char* text) {
    try {
      f();
      ADD_FAILURE() << "no error; wanted one naming '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  throws_naming([&] { gemm(a, w, kNoValue, DType::f16); }, "mixed form");
  throws_naming([&] { gemm(a, w, c, DType::f32); }, "without C");
  throws_naming([&] { gemm(a32, w32, kNoValue, DType::f64); }, "mixed form");
  EXPECT_EQ(g.value(gemm(a32, w32, kNoValue, DType::f32)).type.dtype, DType::f32);  // plain
  const ValueId y = gemm(a, w, kNoValue, DType::f32);
  EXPECT_EQ(g.value(y).type.dtype, DType::f32);
  const ValueId loss =
      g.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false}, {y}, "loss")[0];
  throws_naming([&] { grad(g, loss, {a}, {}); }, "mixed-dtype form");
  g.mark_output(y);
  throws_naming([&] { export_onnx_bytes(g); }, "mixed-dtype form");
}

}  // namespace
}  // namespace fusebox::testing
