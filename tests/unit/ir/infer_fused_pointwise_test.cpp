// fused_pointwise's inference (ir/ops.h, ir/pointwise_program.h): the output's broadcast
// shape and dtype, the program's checks (each error names the node and the instruction),
// the text form dumps print, and the refusal to differentiate it.
#include <cmath>

#include "fusebox/ir/pointwise_program.h"
#include "fusebox/passes/autodiff.h"
#include "infer_testing.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

using Instr = PointwiseInstr;

TensorType bf16(Shape s) {
  return typed(DType::bf16, std::move(s));
}

// t0=mul(in0,in1); t1=add(t0,in2); t2=relu(t1)
PointwiseProgram mul_add_relu() {
  return {3, {{OpKind::mul, {0, 1}}, {OpKind::add, {3, 2}}, {OpKind::relu, {4}}}};
}

TEST(InferFusedPointwise, OutputIsTheBroadcastOfTheInputs) {
  Inferred r = infer(OpKind::fused_pointwise, mul_add_relu(),
                     {bf16({2, 3, 4, 5}), bf16({3, 1, 1}), bf16({})});
  EXPECT_EQ(r.out(), bf16({2, 3, 4, 5}));
  // Broadcasting among the inputs, none of them the output's shape.
  r = infer(OpKind::fused_pointwise, mul_add_relu(), {f32({4, 1}), f32({1, 5}), f32({5})});
  EXPECT_EQ(r.out(), f32({4, 5}));
}

TEST(InferFusedPointwise, DtypeIsTheLastInstructions) {
  // A cast in the middle: t0=cast(in0,to=f32); t1=mul(t0,in1); t2=cast(t1,to=f16)
  const PointwiseProgram p{2,
                           {{.op = OpKind::cast, .operands = {0}, .to = DType::f32},
                            {OpKind::mul, {2, 1}},
                            {.op = OpKind::cast, .operands = {3}, .to = DType::f16}}};
  EXPECT_EQ(infer(OpKind::fused_pointwise, p, {bf16({3}), f32({3})}).out(), typed(DType::f16, {3}));
  // pow's exponent may have another float dtype; the result has the base's.
  const PointwiseProgram pow{2, {{OpKind::pow, {0, 1}}}};
  EXPECT_EQ(infer(OpKind::fused_pointwise, pow, {bf16({3}), typed(DType::f64, {3})}).out(),
            bf16({3}));
  const std::vector<DType> values =
      check_pointwise_program(p, std::vector<DType>{DType::bf16, DType::f32}, "x");
  EXPECT_EQ(values,
            (std::vector<DType>{DType::bf16, DType::f32, DType::f32, DType::f32, DType::f16}));
}

TEST(InferFusedPointwiseErrors, ProgramChecksNameTheInstruction) {
  const OpKind op = OpKind::fused_pointwise;
  const std::vector<In> two = {f32({3}), f32({3})};
  EXPECT_TRUE(fails_with(op, PointwiseProgram{2, {{OpKind::softmax, {0}}, {OpKind::add, {2, 1}}}},
                         two, {"instruction t0 (softmax): not a unary or binary pointwise op"}));
  EXPECT_TRUE(fails_with(op, PointwiseProgram{2, {{OpKind::add, {0}}}}, two,
                         {"instruction t0 (add): takes 2 operands, got 1"}));
  EXPECT_TRUE(fails_with(op, PointwiseProgram{2, {{OpKind::add, {0, 2}}}}, two,
                         {"t0 (add): operand 2 is neither an input (0..1) nor an earlier"}));
  EXPECT_TRUE(fails_with(op, PointwiseProgram{2, {{OpKind::add, {0, -1}}}}, two,
                         {"operand -1 is neither"}));
  EXPECT_TRUE(fails_with(op, PointwiseProgram{2, {{OpKind::add, {0, 1}}}}, {f32({3}), bf16({3})},
                         {"t0 (add): operands in0 (f32) and in1 (bf16) have different dtypes"}));
  EXPECT_TRUE(
      fails_with(op, PointwiseProgram{1, {{.op = OpKind::cast, .operands = {0}, .to = DType::i64}}},
                 {f32({3})}, {"t0 (cast): casts to i64, not a float dtype"}));
  EXPECT_TRUE(fails_with(
      op, PointwiseProgram{1, {{.op = OpKind::leaky_relu, .operands = {0}, .alpha = INFINITY}}},
      {f32({3})}, {"t0 (leaky_relu): alpha inf must be finite"}));
  EXPECT_TRUE(fails_with(
      op, PointwiseProgram{1, {{.op = OpKind::clip, .operands = {0}, .min = 1, .max = -1}}},
      {f32({3})}, {"t0 (clip): clip bounds [1, -1] must be ordered"}));
  // unary_backward: (dy, x), of an activation whose derivative the generator writes.
  EXPECT_TRUE(fails_with(
      op,
      PointwiseProgram{2, {{.op = OpKind::unary_backward, .operands = {0, 1}, .of = OpKind::exp}}},
      two, {"t0 (unary_backward): the derivative of exp is not a program instruction"}));
  EXPECT_TRUE(fails_with(op, PointwiseProgram{1, {{.op = OpKind::unary_backward, .operands = {0}}}},
                         {f32({3})}, {"t0 (unary_backward): takes 2 operands, got 1"}));
  EXPECT_TRUE(fails_with(op,
                         PointwiseProgram{2,
                                          {{.op = OpKind::unary_backward,
                                            .operands = {0, 1},
                                            .of = OpKind::leaky_relu,
                                            .alpha = NAN}}},
                         two, {"t0 (unary_backward): alpha nan must be finite"}));
  EXPECT_TRUE(fails_with(
      op,
      PointwiseProgram{2, {{.op = OpKind::unary_backward, .operands = {0, 1}, .of = OpKind::relu}}},
      {f32({3}), bf16({3})}, {"operands in0 (f32) and in1 (bf16)"}));
}

TEST(InferFusedPointwiseErrors, InputsAndShapes) {
  const OpKind op = OpKind::fused_pointwise;
  EXPECT_TRUE(fails_with(op, mul_add_relu(), {f32({3}), f32({3})},
                         {"the program reads 3 inputs but the node has 2"}));
  EXPECT_TRUE(
      fails_with(op, PointwiseProgram{1, {}}, {f32({3})}, {"the program has no instructions"}));
  EXPECT_TRUE(fails_with(op, PointwiseProgram{2, {{OpKind::relu, {0}}}}, {f32({3}), f32({3})},
                         {"the program never reads in1 (an input)"}));
  EXPECT_TRUE(fails_with(op, PointwiseProgram{1, {{OpKind::relu, {0}}, {OpKind::exp, {0}}}},
                         {f32({3})}, {"the program never reads t0"}));
  EXPECT_TRUE(fails_with(op, mul_add_relu(), {f32({3}), typed(DType::i64, {3}), f32({3})},
                         {"input 1 (in1) is i64", "floating-point"}));
  EXPECT_TRUE(fails_with(op, mul_add_relu(), {f32({2, 3}), f32({4}), f32({})},
                         {"in1 [4] does not broadcast"}));
}

TEST(InferFusedPointwise, TextForm) {
  EXPECT_EQ(pointwise_program_text(mul_add_relu()), "t0=mul(in0,in1); t1=add(t0,in2); t2=relu(t1)");
  const PointwiseProgram p{1,
                           {{.op = OpKind::leaky_relu, .operands = {0}, .alpha = 0.25},
                            {.op = OpKind::gelu, .operands = {1}, .tanh_approximation = true},
                            {.op = OpKind::clip, .operands = {2}, .min = -1, .max = 2},
                            {.op = OpKind::cast, .operands = {3}, .to = DType::bf16}}};
  EXPECT_EQ(pointwise_program_text(p),
            "t0=leaky_relu(in0,alpha=0.25); t1=gelu(t0,approximate=tanh); "
            "t2=clip(t1,min=-1,max=2); t3=cast(t2,to=bf16)");
  const PointwiseProgram d{
      2,
      {{.op = OpKind::unary_backward, .operands = {0, 1}},
       {.op = OpKind::unary_backward,
        .operands = {2, 1},
        .of = OpKind::gelu,
        .tanh_approximation = true},
       {.op = OpKind::unary_backward, .operands = {3, 0}, .of = OpKind::leaky_relu, .alpha = 0.5}}};
  EXPECT_EQ(pointwise_program_text(d),
            "t0=unary_backward(in0,in1,of=relu); "
            "t1=unary_backward(t0,in1,of=gelu,approximate=tanh); "
            "t2=unary_backward(t1,in0,of=leaky_relu,alpha=0.5)");
  Graph g("dump");
  const ValueId a = g.add_input("a", DType::f32, {3});
  const ValueId b = g.add_input("b", DType::f32, {3});
  const ValueId c = g.add_input("c", DType::f32, {});
  g.mark_output(g.add_node(OpKind::fused_pointwise, mul_add_relu(), {a, b, c}, "chain")[0]);
  EXPECT_NE(g.dump().find("= fused_pointwise(%a, %b, %c) {program: t0=mul(in0,in1); "
                          "t1=add(t0,in2); t2=relu(t1)}"),
            std::string::npos)
      << g.dump();
}

TEST(InferFusedPointwise, InstructionsStandForTheirNodes) {
  Node n;
  n.op = OpKind::clip;
  n.attrs = ClipAttrs{-2, 3};
  const PointwiseInstr ins = pointwise_instr(n, {4});
  EXPECT_EQ(ins.operands, (std::vector<int32_t>{4}));
  EXPECT_EQ(ins.min, -2);
  EXPECT_EQ(ins.max, 3);
  const Attrs back = pointwise_instr_attrs(ins);
  EXPECT_EQ(std::get<ClipAttrs>(back).min, -2);
  EXPECT_EQ(std::get<ClipAttrs>(back).max, 3);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(pointwise_instr_attrs({OpKind::add, {0, 1}})));
  // unary_backward: the forward op and its attributes, and back.
  Node u;
  u.op = OpKind::unary_backward;
  u.attrs = UnaryBackwardAttrs{.op = OpKind::gelu, .tanh_approximation = true};
  const PointwiseInstr d = pointwise_instr(u, {0, 1});
  EXPECT_EQ(d.of, OpKind::gelu);
  EXPECT_TRUE(d.tanh_approximation);
  const Attrs d_back = pointwise_instr_attrs(d);
  const auto& attrs = std::get<UnaryBackwardAttrs>(d_back);
  EXPECT_EQ(attrs.op, OpKind::gelu);
  EXPECT_TRUE(attrs.tanh_approximation);
  // Which derivatives a program holds: the activations; exp's stays its own node.
  EXPECT_TRUE(is_pointwise_instr_node(u));
  u.attrs = UnaryBackwardAttrs{.op = OpKind::exp};
  EXPECT_FALSE(is_pointwise_instr_node(u));
  for (OpKind op : {OpKind::relu, OpKind::leaky_relu, OpKind::gelu, OpKind::silu, OpKind::sigmoid,
                    OpKind::tanh})
    EXPECT_TRUE(is_program_derivative(op)) << op_name(op);
  EXPECT_FALSE(is_program_derivative(OpKind::clip));
}

TEST(InferFusedPointwise, IsNotDifferentiated) {
  Graph g("no_grad");
  const ValueId a = g.add_input("a", DType::f32, {3});
  const ValueId b = g.add_input("b", DType::f32, {3});
  const ValueId c = g.add_input("c", DType::f32, {});
  const ValueId y = g.add_node(OpKind::fused_pointwise, mul_add_relu(), {a, b, c}, "chain")[0];
  try {
    grad(g, y, {a});
    ADD_FAILURE() << "fused_pointwise was differentiated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no gradient rule"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusebox::ir_test
