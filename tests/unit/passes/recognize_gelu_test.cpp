// recognize_gelu (passes/simplify.h): both GELU forms, in the orders and associations exporters
// write, in f32, f16 and bf16, become one gelu reading x that computes the same values on the
// CPU; a wrong constant, an intermediate read elsewhere or returned, and x^2 stay as they are;
// in the inference pipeline the gelu after a linear layer becomes its gemm's epilogue.
#include <functional>
#include <string>

#include "fusebox/ir/builder.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/passes/simplify.h"
#include "fusebox/runtime/executor.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// The constants as exporters write them: f32's roundings of sqrt(2), 1/sqrt(2), sqrt(2/pi).
constexpr double kSqrt2F32 = 1.4142135381698608;
constexpr double kInvSqrt2F32 = 0.7071067690849304;
constexpr double kSqrt2OverPiF32 = 0.7978845834732056;

// Builds one GELU over x into a graph; the constants are graph constants of x's dtype.
struct GeluBuilder {
  Graph& g;
  Builder b{g};
  DType dtype;
  int constants = 0;
  bool as_constant_nodes = false;  // ONNX Constant nodes instead of initializers

  ValueId c(double v) {
    const Tensor t = Tensor::scalar(dtype, v);
    if (as_constant_nodes) return b.constant(t);
    return g.add_constant(cat("c", constants++), t);
  }
};

// The erf form's spellings: torch's nn.GELU export and the other orders and associations.
enum class ErfForm { torch, inverse_scale_half_first, half_last_swapped, half_with_sum };
// The tanh form's: GPT-2's export (pow, 0.5 x first), and x * x * x in other orders.
enum class TanhForm { gpt2, cube_by_products, cube_nested };

ValueId erf_gelu(GeluBuilder& gb, ValueId x, ErfForm form, double half = 0.5) {
  Builder& b = gb.b;
  switch (form) {
    case ErfForm::torch:  // div -> erf -> add 1 -> mul x -> mul 0.5
      return b.mul(b.mul(x, b.add(b.erf(b.div(x, gb.c(kSqrt2F32))), gb.c(1.0))), gb.c(half));
    case ErfForm::inverse_scale_half_first:  // (x * 0.5) * (1 + erf(x * 0.7071))
      return b.mul(b.mul(x, gb.c(half)), b.add(gb.c(1.0), b.erf(b.mul(x, gb.c(kInvSqrt2F32)))));
    case ErfForm::half_last_swapped:  // 0.5 * ((1 + erf(0.7071 * x)) * x)
      return b.mul(gb.c(half), b.mul(b.add(gb.c(1.0), b.erf(b.mul(gb.c(kInvSqrt2F32), x))), x));
    case ErfForm::half_with_sum:  // x * (0.5 * (erf(x / sqrt2) + 1))
      return b.mul(x, b.mul(gb.c(half), b.add(b.erf(b.div(x, gb.c(kSqrt2F32))), gb.c(1.0))));
  }
  return kNoValue;
}

ValueId tanh_gelu(GeluBuilder& gb, ValueId x, TanhForm form, double exponent = 3.0) {
  Builder& b = gb.b;
  switch (form) {
    case TanhForm::gpt2: {  // GPT-2's ops in its order: /Mul, /Pow_1, /Mul_1, /Add_3, ...
      const ValueId half_x = b.mul(x, gb.c(0.5));
      const Tensor e = Tensor::scalar(gb.dtype, exponent);
      const ValueId cube = b.pow(x, gb.g.add_constant(cat("exponent", gb.constants++), e));
      const ValueId inner = b.add(x, b.mul(gb.c(0.044715), cube));
      const ValueId t = b.tanh(b.mul(gb.c(kSqrt2OverPiF32), inner));
      return b.mul(half_x, b.add(gb.c(1.0), t));
    }
    case TanhForm::cube_by_products: {  // ((x * x) * x) * 0.044715, the sums the other way
      const ValueId cube = b.mul(b.mul(x, x), x);
      const ValueId inner = b.add(b.mul(cube, gb.c(0.044715)), x);
      const ValueId t = b.tanh(b.mul(inner, gb.c(kSqrt2OverPiF32)));
      return b.mul(b.mul(x, b.add(t, gb.c(1.0))), gb.c(0.5));
    }
    case TanhForm::cube_nested: {  // 0.044715 * (x * (x * x)), 0.5 with the sum
      const ValueId cubic = b.mul(gb.c(0.044715), b.mul(x, b.mul(x, x)));
      const ValueId t = b.tanh(b.mul(gb.c(kSqrt2OverPiF32), b.add(x, cubic)));
      return b.mul(x, b.mul(b.add(gb.c(1.0), t), gb.c(0.5)));
    }
  }
  return kNoValue;
}

// x -> gelu (as `spell` writes it) -> "y", the graph's output; x also read by a relu, "r"
// (x may have readers outside the pattern).
Graph gelu_graph(DType dtype, const std::function<ValueId(GeluBuilder&, ValueId)>& spell,
                 bool as_constant_nodes = false) {
  Graph g("gelu");
  GeluBuilder gb{g, Builder(g), dtype};
  gb.as_constant_nodes = as_constant_nodes;
  const ValueId x = g.add_input("x", dtype, {4, 64});
  g.rename_value(spell(gb, x), "y");
  g.mark_output(g.find_value("y").value());
  g.mark_output(gb.b.relu(x));
  return g;
}

const Node* only_gelu(const Graph& g) {
  const Node* gelu = nullptr;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::relu) continue;
    if (n.op != OpKind::gelu || gelu != nullptr) return nullptr;
    gelu = &n;
  }
  return gelu;
}

// Formed once, one gelu of the form reading x and writing "y", the same values as the spelled
// -out ops on the CPU within |got - want| <= atol + rtol |want|.
void expect_formed(const Graph& before, bool tanh_approximation, double rtol, double atol) {
  Graph g = before;
  ASSERT_EQ(recognize_gelu(g), 1u);
  g.verify();
  const Node* gelu = only_gelu(g);
  ASSERT_NE(gelu, nullptr) << g.dump();
  EXPECT_EQ(std::get<GeluAttrs>(gelu->attrs).tanh_approximation, tanh_approximation);
  EXPECT_EQ(g.value(gelu->inputs[0]).name, "x");
  EXPECT_EQ(g.value(gelu->outputs[0]).name, "y");
  EXPECT_EQ(g.value(g.outputs()[0]).name, "y");
  EXPECT_TRUE(g.constants().empty());  // nothing reads them any more
  const DType dtype = g.value(gelu->inputs[0]).type.dtype;
  const NamedTensors feeds{{"x", random_tensor(dtype, {4, 64}, 11, -5, 5)}};
  const NamedTensors want = run_graph(before, feeds), got = run_graph(g, feeds);
  EXPECT_TRUE(all_close(got.at("y"), want.at("y"), rtol, atol));
  EXPECT_TRUE(all_close(got.at(g.value(g.outputs()[1]).name),
                        want.at(before.value(before.outputs()[1]).name), 0, 0));
  EXPECT_EQ(recognize_gelu(g), 0u);
}

// f32: the CPU's gelu against its own erf, tanh, pow and products: rtol 1e-6 (a few roundings
// of 6e-8 each) and atol 1e-6. The gelu computes x / sqrt(2) as x * 0.70710677 (PyTorch's
// kernels' spelling), the spellings that do so give the same bits; x / 1.4142135 for it, x * x * x
// for powf and the products in another order round differently, and 1 + erf(u) (1 + tanh(u)) for x
// << 0 cancels to a few ulps of 1: an error of up to ~|x| * 6e-8 * a few that the relative bound
// cannot take near 0 (one of 256 values at x in [-5, 5] is 1e-6 off relative), hence the atol. A
// wrong constant is far outside either (0.5 vs 0.6 is 20%).
constexpr double kF32Rtol = 1e-6, kF32Atol = 1e-6;

TEST(RecognizeGelu, ErfFormInEveryOrderF32) {
  for (ErfForm form : {ErfForm::torch, ErfForm::inverse_scale_half_first,
                       ErfForm::half_last_swapped, ErfForm::half_with_sum}) {
    SCOPED_TRACE(int(form));
    // x * 0.70710677 as the gelu computes x / sqrt(2); 0.5 x in any order is exact.
    const bool same_expression =
        form == ErfForm::inverse_scale_half_first || form == ErfForm::half_last_swapped;
    expect_formed(gelu_graph(DType::f32,
                             [form](GeluBuilder& gb, ValueId x) { return erf_gelu(gb, x, form); }),
                  false, same_expression ? 0 : kF32Rtol, same_expression ? 0 : kF32Atol);
  }
}

TEST(RecognizeGelu, TanhFormInEveryOrderF32) {
  for (TanhForm form : {TanhForm::gpt2, TanhForm::cube_by_products, TanhForm::cube_nested}) {
    SCOPED_TRACE(int(form));
    expect_formed(gelu_graph(DType::f32,
                             [form](GeluBuilder& gb, ValueId x) { return tanh_gelu(gb, x, form); }),
                  true, kF32Rtol, kF32Atol);
  }
}

// f16 and bf16 graphs: the constants rounded to those dtypes still match (sqrt(2) is 1.4140625
// in both); each spelled-out op rounds to the dtype, the gelu once: a few of its ulps relative,
// and where 1 + erf(u) cancels for x << 0 up to |x| / 2 times a few ulps of 1 absolute (the
// spelled-out ops give 0 where the gelu gives -4e-4 in f16).
TEST(RecognizeGelu, HalfPrecisionForms) {
  struct Tolerance {
    DType dtype;
    double rtol, atol;
  };
  for (const auto& [dtype, rtol, atol] :
       {Tolerance{DType::f16, 4e-3, 3e-3}, Tolerance{DType::bf16, 3e-2, 2.5e-2}}) {
    SCOPED_TRACE(dtype_name(dtype));
    expect_formed(gelu_graph(dtype, [](GeluBuilder& gb,
                                       ValueId x) { return erf_gelu(gb, x, ErfForm::torch); }),
                  false, rtol, atol);
    expect_formed(gelu_graph(dtype, [](GeluBuilder& gb,
                                       ValueId x) { return tanh_gelu(gb, x, TanhForm::gpt2); }),
                  true, rtol, atol);
  }
}

// Constants as constant nodes (an ONNX Constant op's): the nodes go with the pattern.
TEST(RecognizeGelu, ConstantNodesGoWithThePattern) {
  Graph g = gelu_graph(
      DType::f32, [](GeluBuilder& gb, ValueId x) { return erf_gelu(gb, x, ErfForm::torch); },
      /*as_constant_nodes=*/true);
  ASSERT_EQ(count_ops(g, OpKind::constant), 3);
  EXPECT_EQ(recognize_gelu(g), 1u);
  EXPECT_NE(only_gelu(g), nullptr) << g.dump();
}

// A GELU of a GELU: both, the outer reading the inner's value.
TEST(RecognizeGelu, ChainedGelus) {
  Graph g = gelu_graph(DType::f32, [](GeluBuilder& gb, ValueId x) {
    return tanh_gelu(gb, erf_gelu(gb, x, ErfForm::torch), TanhForm::gpt2);
  });
  EXPECT_EQ(recognize_gelu(g), 2u);
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::gelu), 2);
  EXPECT_EQ(g.nodes().size(), 3u);  // and the relu
}

TEST(RecognizeGelu, LeavesWhatIsNotAGelu) {
  auto unchanged = [](Graph g, const char* what) {
    SCOPED_TRACE(what);
    const std::string before = g.dump();
    EXPECT_EQ(recognize_gelu(g), 0u);
    EXPECT_EQ(g.dump(), before);
  };
  unchanged(gelu_graph(DType::f32,
                       [](GeluBuilder& gb, ValueId x) {
                         return erf_gelu(gb, x, ErfForm::torch, /*half=*/0.6);
                       }),
            "0.6 for 0.5");
  unchanged(gelu_graph(DType::f32,
                       [](GeluBuilder& gb, ValueId x) {
                         return tanh_gelu(gb, x, TanhForm::gpt2, /*exponent=*/2.0);
                       }),
            "x^2 for x^3");
  unchanged(gelu_graph(DType::f32,
                       [](GeluBuilder& gb, ValueId x) {
                         // sqrt(2/pi) to four digits: 6e-5 off.
                         Builder& b = gb.b;
                         const ValueId inner =
                             b.add(x, b.mul(gb.c(0.044715), b.mul(b.mul(x, x), x)));
                         const ValueId t = b.tanh(b.mul(gb.c(0.7979), inner));
                         return b.mul(b.mul(x, gb.c(0.5)), b.add(gb.c(1.0), t));
                       }),
            "0.7979 for sqrt(2/pi)");
  unchanged(gelu_graph(DType::f32,
                       [](GeluBuilder& gb, ValueId x) {
                         // The erf's value is read by a relu too (an output of the graph).
                         Builder& b = gb.b;
                         const ValueId e = b.erf(b.div(x, gb.c(kSqrt2F32)));
                         gb.g.mark_output(b.relu(e));
                         return b.mul(b.mul(x, b.add(e, gb.c(1.0))), gb.c(0.5));
                       }),
            "an intermediate read outside the pattern");
  unchanged(gelu_graph(DType::f32,
                       [](GeluBuilder& gb, ValueId x) {
                         // x * (1 + tanh(...)) is returned as well.
                         Builder& b = gb.b;
                         const ValueId cube = b.pow(x, gb.c(3.0));
                         const ValueId inner = b.add(x, b.mul(gb.c(0.044715), cube));
                         const ValueId t = b.tanh(b.mul(gb.c(kSqrt2OverPiF32), inner));
                         const ValueId unhalved = b.mul(x, b.add(gb.c(1.0), t));
                         gb.g.mark_output(unhalved);
                         return b.mul(unhalved, gb.c(0.5));
                       }),
            "an intermediate that is a graph output");
  unchanged(gelu_graph(DType::f32,
                       [](GeluBuilder& gb, ValueId x) {
                         // erf of one value, the product with another.
                         Builder& b = gb.b;
                         const ValueId z = gb.g.add_input("z", DType::f32, {4, 64});
                         const ValueId s = b.add(b.erf(b.div(z, gb.c(kSqrt2F32))), gb.c(1.0));
                         return b.mul(b.mul(x, s), gb.c(0.5));
                       }),
            "x in the product, another value in the erf");
}

// GPT-2's MLP in f32 (as exported: c_fc's matmul + bias, the tanh form, c_proj), through the
// bf16 inference pipeline: the gelu becomes c_fc's gemm epilogue, for 2-D rows and for [B, T, C]
// (form_linears then views the gemm's rows as [B, T, N], and the gelu moves above that view);
// the values as the pipeline without recognize_gelu gives them, to bf16's rounding.
TEST(RecognizeGelu, InferencePipelineTakesTheGeluIntoTheGemm) {
  for (const Shape& x_shape : {Shape{8, 32}, Shape{2, 4, 32}}) {
    SCOPED_TRACE(shape_str(x_shape));
    Graph g("mlp");
    GeluBuilder gb{g, Builder(g), DType::f32};
    Builder& b = gb.b;
    const ValueId x = g.add_input("x", DType::f32, x_shape);
    const ValueId w_fc = g.add_constant("w_fc", random_tensor(DType::f32, {32, 64}, 1, -0.3, 0.3));
    const ValueId b_fc = g.add_constant("b_fc", random_tensor(DType::f32, {64}, 2));
    const ValueId w_proj =
        g.add_constant("w_proj", random_tensor(DType::f32, {64, 32}, 3, -0.3, 0.3));
    const ValueId h = b.add(b.matmul(x, w_fc), b_fc);
    const ValueId y = b.matmul(tanh_gelu(gb, h, TanhForm::gpt2), w_proj);
    g.rename_value(y, "y");
    g.mark_output(y);

    PipelineLog log;
    PipelineOptions with{
        .kind = PipelineKind::inference, .precision = Precision::bf16, .verify = true, .log = &log};
    PipelineOptions without = with;
    without.log = nullptr;
    without.fusion.gelu = false;
    const Graph fused = prepare_graph(g, with), spelled = prepare_graph(g, without);
    EXPECT_EQ(log.passes[1].pass, "recognize_gelu");
    EXPECT_EQ(log.passes[1].rewrites, 1u);
    EXPECT_EQ(count_ops(fused, OpKind::gelu), 0) << fused.dump();
    EXPECT_EQ(count_ops(fused, OpKind::tanh), 0);
    EXPECT_EQ(count_ops(fused, OpKind::fused_pointwise), 0) << fused.dump();
    int gelu_epilogues = 0;
    for (const Node& n : fused.nodes())
      if (n.op == OpKind::gemm)
        gelu_epilogues += std::get<GemmAttrs>(n.attrs).activation.kind == Activation::gelu_tanh;
    EXPECT_EQ(gelu_epilogues, 1) << fused.dump();
    EXPECT_GT(count_ops(spelled, OpKind::fused_pointwise), 0);  // the spelled-out GELU's kernel
    const NamedTensors feeds{{"x", random_tensor(DType::f32, x_shape, 4, -2, 2)}};
    EXPECT_LE(relative_l2(run_graph(fused, feeds).at("y"), run_graph(spelled, feeds).at("y")),
              1e-2);
  }
}

}  // namespace
}  // namespace fusebox::testing
