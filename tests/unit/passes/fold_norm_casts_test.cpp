// fold_norm_casts (passes/fusion.h): the casts around an f32 layer/RMS norm go into the norm's
// mixed form (ir/ops.h NormAttrs), on each side alone or both; what must not fold stays; the
// folded graph computes the unfused one's values on the CPU backend (the f64 reference rounds
// once where the unfused graph rounds to f32 first: within one unit of the low dtype); the
// mixed form's IR checks, and autodiff and the ONNX exporter refuse it with a clear error. The
// CUDA kernels of the mixed form: tests/unit/cuda/kernels/test_ops_norm_ir.cu.
#include <string>
#include <vector>

#include "fusebox/frontends/onnx.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/pipeline.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr int64_t kCols = 32;

struct Params {
  ValueId scale, bias;
};
Params f32_params(Graph& g) {
  return {g.add_constant("scale", random_tensor(DType::f32, {kCols}, 11, 0.5, 1.5)),
          g.add_constant("bias", random_tensor(DType::f32, {kCols}, 12))};
}

// x (dtype `in`) [-> cast f32] -> norm -> [cast `out` ->] relu -> output "out".
Graph norm_between_casts(OpKind op, DType in, std::optional<DType> out) {
  Graph g("norm");
  Builder b(g);
  const Params p = f32_params(g);
  ValueId v = g.add_input("x", in, {4, 6, kCols});
  if (in != DType::f32) v = b.cast(v, DType::f32);
  v = op == OpKind::layer_norm ? b.layer_norm(v, p.scale, p.bias, NormAttrs{.axis = -1})
                               : b.rms_norm(v, p.scale, NormAttrs{.axis = -1});
  if (out) v = b.cast(v, *out);
  v = b.relu(v);
  g.rename_value(v, "out");
  g.mark_output(v);
  return g;
}

const Node& only_norm(const Graph& g) {
  for (const Node& n : g.nodes())
    if (n.op == OpKind::layer_norm || n.op == OpKind::rms_norm) return n;
  throw Error("test", "no norm");
}

void expect_same_values(const Graph& before, const Graph& after, DType x_dtype, DType low) {
  const NamedTensors feeds{{"x", random_tensor(x_dtype, {4, 6, kCols}, 3, -3, 5)}};
  const Tensor want = run_graph(before, feeds).at("out");
  const Tensor got = run_graph(after, feeds).at("out");
  ASSERT_EQ(got.dtype(), want.dtype());
  // One unit in the last place of `low` (2^-8 relative for bf16, 2^-11 for f16).
  const double ulp = low == DType::bf16 ? 1.0 / 256 : low == DType::f16 ? 1.0 / 2048 : 1e-6;
  EXPECT_TRUE(all_close(got, want, ulp, 1e-6));
}

TEST(FoldNormCasts, CastsOnBothSidesGo) {
  for (OpKind op : {OpKind::layer_norm, OpKind::rms_norm}) {
    for (DType low : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(cat(op_name(op), " ", dtype_name(low)));
      const Graph before = norm_between_casts(op, low, low);
      Graph g = before;
      FusionLog log;
      EXPECT_EQ(fold_norm_casts(g, &log), 1u);
      g.verify();
      EXPECT_EQ(count_ops(g, OpKind::cast), 0);
      const Node& n = only_norm(g);
      EXPECT_EQ(g.value(n.inputs[0]).name, "x");
      EXPECT_EQ(std::get<NormAttrs>(n.attrs).y_dtype, low);
      EXPECT_EQ(g.value(n.outputs[0]).type.dtype, low);
      ASSERT_EQ(log.groups().size(), 1u);
      EXPECT_EQ(log.groups()[0].ops.size(), 3u);  // cast, norm, cast
      expect_same_values(before, g, low, low);
      EXPECT_EQ(fold_norm_casts(g), 0u);  // nothing left
    }
  }
}

TEST(FoldNormCasts, EitherSideAlone) {
  {
    SCOPED_TRACE("an f32 x (ViT's residual stream), y cast to bf16");
    const Graph before = norm_between_casts(OpKind::layer_norm, DType::f32, DType::bf16);
    Graph g = before;
    EXPECT_EQ(fold_norm_casts(g), 1u);
    EXPECT_EQ(count_ops(g, OpKind::cast), 0);
    const Node& n = only_norm(g);
    EXPECT_EQ(g.value(n.inputs[0]).type.dtype, DType::f32);
    EXPECT_EQ(g.value(n.outputs[0]).type.dtype, DType::bf16);
    expect_same_values(before, g, DType::f32, DType::bf16);
  }
  {
    SCOPED_TRACE("a bf16 x widened, the f32 y read as it is");
    const Graph before = norm_between_casts(OpKind::layer_norm, DType::bf16, std::nullopt);
    Graph g = before;
    EXPECT_EQ(fold_norm_casts(g), 1u);
    EXPECT_EQ(count_ops(g, OpKind::cast), 0);
    const Node& n = only_norm(g);
    EXPECT_EQ(g.value(n.inputs[0]).type.dtype, DType::bf16);
    EXPECT_EQ(g.value(n.outputs[0]).type.dtype, DType::f32);
    expect_same_values(before, g, DType::bf16, DType::f32);
  }
  {
    SCOPED_TRACE("the widening cast read elsewhere too: it stays for that reader");
    Graph g("shared_cast");
    Builder b(g);
    const Params p = f32_params(g);
    const ValueId wide = b.cast(g.add_input("x", DType::bf16, {4, kCols}), DType::f32);
    const ValueId y =
        b.cast(b.layer_norm(wide, p.scale, p.bias, NormAttrs{.axis = -1}), DType::bf16);
    g.mark_output(b.relu(y));
    g.mark_output(b.relu(wide));
    EXPECT_EQ(fold_norm_casts(g), 1u);
    g.verify();
    EXPECT_EQ(count_ops(g, OpKind::cast), 1);
    EXPECT_EQ(g.value(only_norm(g).inputs[0]).name, "x");
  }
}

TEST(FoldNormCasts, LeavesWhatMustNotFold) {
  auto unchanged = [](Graph g, const char* what) {
    SCOPED_TRACE(what);
    const size_t nodes = g.nodes().size();
    EXPECT_EQ(fold_norm_casts(g), 0u);
    EXPECT_EQ(g.nodes().size(), nodes);
  };
  {
    Graph g("y_read_twice");
    Builder bb(g);
    const Params p = f32_params(g);
    const ValueId y = bb.layer_norm(g.add_input("x", DType::f32, {4, kCols}), p.scale, p.bias,
                                    NormAttrs{.axis = -1});
    g.mark_output(bb.relu(bb.cast(y, DType::bf16)));
    g.mark_output(bb.relu(y));  // an f32 reader: the norm's y must stay f32
    unchanged(g, "y read by a cast and by an f32 op");
  }
  {
    Graph g("two_dtypes");
    Builder bb(g);
    const Params p = f32_params(g);
    const ValueId y = bb.layer_norm(g.add_input("x", DType::f32, {4, kCols}), p.scale, p.bias,
                                    NormAttrs{.axis = -1});
    g.mark_output(bb.relu(bb.cast(y, DType::bf16)));
    g.mark_output(bb.relu(bb.cast(y, DType::f16)));
    unchanged(g, "y cast to two dtypes");
  }
  {
    Graph g("output");
    Builder bb(g);
    const Params p = f32_params(g);
    const ValueId y = bb.layer_norm(g.add_input("x", DType::f32, {4, kCols}), p.scale, p.bias,
                                    NormAttrs{.axis = -1});
    g.mark_output(y);
    g.mark_output(bb.relu(bb.cast(y, DType::bf16)));
    unchanged(g, "y a graph output");
  }
  {
    Graph g("low_norm");
    Builder bb(g);
    const ValueId x = g.add_input("x", DType::bf16, {4, kCols});
    const ValueId s = g.add_constant("s", random_tensor(DType::bf16, {kCols}, 1));
    g.mark_output(
        bb.relu(bb.cast(bb.layer_norm(x, s, kNoValue, NormAttrs{.axis = -1}), DType::f32)));
    unchanged(g, "a norm in bf16 (not autocast's f32 one)");
  }
  {
    Graph g("f64");
    Builder bb(g);
    const Params p = f32_params(g);
    const ValueId x = bb.cast(g.add_input("x", DType::f64, {4, kCols}), DType::f32);
    g.mark_output(bb.relu(bb.layer_norm(x, p.scale, p.bias, NormAttrs{.axis = -1})));
    unchanged(g, "x narrowed from f64 (a rounding cast)");
  }
  {
    SCOPED_TRACE("x from f16, y cast to bf16: the input side alone");
    Graph g = norm_between_casts(OpKind::layer_norm, DType::f16, DType::bf16);
    EXPECT_EQ(fold_norm_casts(g), 1u);
    EXPECT_EQ(count_ops(g, OpKind::cast), 1);
    EXPECT_EQ(g.value(only_norm(g).outputs[0]).type.dtype, DType::f32);
  }
}

// Mixed precision (bf16) leaves ConvNeXt's pattern, a product, an f32 norm between casts, a
// product; the inference pipeline folds them, and its values are the pipeline's without.
TEST(FoldNormCasts, InferencePipelineTakesAutocastsCasts) {
  Graph g("block");
  Builder b(g);
  const Params p = f32_params(g);
  ValueId v = b.matmul(g.add_input("x", DType::f32, {8, 16}),
                       g.add_constant("w1", random_tensor(DType::f32, {16, kCols}, 21)));
  v = b.layer_norm(v, p.scale, p.bias, NormAttrs{.axis = -1});
  v = b.matmul(v, g.add_constant("w2", random_tensor(DType::f32, {kCols, 8}, 22)));
  g.rename_value(v, "out");
  g.mark_output(v);
  PipelineOptions with{
      .kind = PipelineKind::inference, .precision = Precision::bf16, .verify = true};
  with.fusion.product_casts = false;  // it would take the products' casts (without: the first's)
  PipelineOptions without = with;
  without.fusion.norm_casts = false;
  const Graph folded = prepare_graph(g, with), unfolded = prepare_graph(g, without);
  const Node& n = only_norm(folded);
  EXPECT_EQ(folded.value(n.inputs[0]).type.dtype, DType::bf16);
  EXPECT_EQ(folded.value(n.outputs[0]).type.dtype, DType::bf16);
  EXPECT_LT(count_ops(folded, OpKind::cast), count_ops(unfolded, OpKind::cast));
  EXPECT_EQ(count_ops(unfolded, OpKind::cast) - count_ops(folded, OpKind::cast), 2);
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {8, 16}, 5)}};
  const Tensor want = run_graph(unfolded, feeds).at("out");
  // The norm's y may differ by a bf16 unit (one rounding instead of two), which the product
  // carries on: compared in norm.
  EXPECT_LE(relative_l2(run_graph(folded, feeds).at("out"), want), 1e-2);
}

TEST(FoldNormCasts, TheMixedFormsIrChecksAndWhoRefusesIt) {
  Graph g("mixed");
  const ValueId x16 = g.add_input("x16", DType::f16, {4, kCols});
  const ValueId xb = g.add_input("xb", DType::bf16, {4, kCols});
  const ValueId x64 = g.add_input("x64", DType::f64, {4, kCols});
  const Params p = f32_params(g);
  const ValueId low_scale = g.add_constant("low_scale", random_tensor(DType::bf16, {kCols}, 2));
  auto norm = [&](ValueId x, ValueId scale, std::optional<DType> y) {
    NormAttrs a{.axis = -1};
    a.y_dtype = y;
    return g.add_node(OpKind::layer_norm, a, {x, scale, p.bias}, "ln")[0];
  };
  auto throws_naming = [](auto&& f, const char* text) {
    try {
      f();
      ADD_FAILURE() << "no error; wanted one naming '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  throws_naming([&] { norm(x16, p.scale, DType::bf16); }, "mixed form");
  throws_naming([&] { norm(xb, low_scale, DType::f32); }, "takes f32 scale and bias");
  throws_naming([&] { norm(x64, p.scale, std::nullopt); }, "mixed form");
  const ValueId y = norm(xb, p.scale, DType::bf16);
  EXPECT_EQ(g.value(y).type.dtype, DType::bf16);
  Builder b(g);
  const ValueId loss = g.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false},
                                  {b.cast(y, DType::f32)}, "loss")[0];
  throws_naming([&] { grad(g, loss, {xb}, {}); }, "mixed-dtype form");
  g.mark_output(y);
  throws_naming([&] { export_onnx_bytes(g); }, "mixed-dtype form");
}

}  // namespace
}  // namespace fusebox::testing
