// fused_pointwise on the fast CPU kernels (backends/cpu_fast/pointwise.cpp) against the
// reference's interpreter: the same bits for every instruction kind, every way an input is
// placed (in place, a scalar, per channel, a row, a column, bf16 and f16 converted), outputs
// that end in a partial block or span several threads, random programs in f32, bf16 and f16;
// a program with an f64 value stays on the reference and the summary says why. Needs no
// oneDNN: the interpreter is in every build.
#include <cmath>

#include "bit_identical.h"
#include "fusebox/runtime/executable.h"
#include "random_pointwise.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::testing {
namespace {

// Runs `g` on the fast kernels (twice: a kernel is made once and run many times) and on the
// reference; expects `fast_nodes` nodes taken and every output's bits the same.
void expect_reference_bits(const Graph& g, const NamedTensors& feeds, size_t fast_nodes = 1) {
  const NamedTensors want = run_graph(g, feeds);
  auto exe = Executable::compile(
      g, {.device = Device::cpu, .cpu_kernels = CpuKernels::fast, .poison = true});
  EXPECT_EQ(exe->stats().fast_nodes, fast_nodes) << exe->stats().fast_summary;
  for (int run = 0; run < 2; ++run) {
    const NamedTensors got = exe->run(feeds);
    for (const auto& [name, t] : want)
      EXPECT_TRUE(bit_identical(got.at(name), t)) << name << " run " << run;
  }
}

// One fused_pointwise node over inputs "in0".. (graph inputs of the feeds' dtypes and shapes).
Graph program_graph(const PointwiseProgram& p, const std::vector<Tensor>& inputs) {
  Graph g("program");
  std::vector<ValueId> in;
  for (size_t k = 0; k < inputs.size(); ++k)
    in.push_back(g.add_input(cat("in", k), inputs[k].dtype(), inputs[k].shape()));
  g.mark_output(g.add_node(OpKind::fused_pointwise, p, in, "fused", {"y"})[0]);
  return g;
}

NamedTensors feeds_of(const std::vector<Tensor>& inputs) {
  NamedTensors f;
  for (size_t k = 0; k < inputs.size(); ++k) f[cat("in", k)] = inputs[k];
  return f;
}

// Random values in [lo, hi) with the special ones first: signed zeros, infinities, a NaN, a
// subnormal, a value clip bounds and rounding meet exactly.
Tensor with_special_values(const Shape& shape, uint64_t seed, double lo, double hi) {
  std::vector<double> v = random_tensor(DType::f64, shape, seed, lo, hi).to_doubles();
  const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-40, 2.5, -0.5};
  for (size_t i = 0; i < std::size(special) && i < v.size(); ++i) v[i] = special[i];
  return Tensor::from_doubles(DType::f32, shape, v);
}

// 770 elements: three blocks and a partial one.
const Shape kOdd = {2, 5, 7, 11};

TEST(CpuFastPointwise, EveryUnaryInstruction) {
  std::vector<PointwiseInstr> instrs;
#define FUSEBOX_UNARY_INSTR(name) instrs.push_back({OpKind::name, {0}});
  FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_UNARY_INSTR)
#undef FUSEBOX_UNARY_INSTR
  instrs.push_back({.op = OpKind::leaky_relu, .operands = {0}, .alpha = 0.2});
  instrs.push_back({.op = OpKind::gelu, .operands = {0}, .tanh_approximation = true});
  instrs.push_back({.op = OpKind::clip, .operands = {0}, .min = -0.5, .max = 0.75});
  instrs.push_back({.op = OpKind::clip, .operands = {0}, .min = 0.0});
  const Tensor x = with_special_values(kOdd, 1, -4, 4);
  for (const PointwiseInstr& ins : instrs) {
    SCOPED_TRACE(pointwise_program_text({1, {ins}}));
    expect_reference_bits(program_graph({1, {ins}}, {x}), feeds_of({x}));
  }
}

// Each binary op, both ways round, with its other operand of every placement: the output's
// shape (in place), a scalar, per channel of NCHW, a row, a column, fewer dims.
TEST(CpuFastPointwise, EveryBinaryInstructionOverEveryBroadcast) {
  const Tensor x = with_special_values(kOdd, 2, -3, 3);
  const std::vector<Shape> others = {kOdd, {},           {1, 1, 1, 1}, {1, 5, 1, 1},
                                     {11}, {2, 5, 7, 1}, {5, 1, 11}};
  uint64_t seed = 10;
  for (const Shape& other : others) {
    const Tensor y = random_tensor(DType::f32, other, seed++, 0.25, 2);
    for (OpKind op : {OpKind::add, OpKind::sub, OpKind::mul, OpKind::div, OpKind::max, OpKind::min,
                      OpKind::pow}) {
      SCOPED_TRACE(cat(op_name(op), ", other operand ", shape_str(other)));
      for (const PointwiseProgram& p :
           {PointwiseProgram{2, {{op, {0, 1}}}}, PointwiseProgram{2, {{op, {1, 0}}}}})
        expect_reference_bits(program_graph(p, {x, y}), feeds_of({x, y}));
    }
  }
}

// Casts between the float dtypes the interpreter takes, and values of bf16 and f16 rounded
// after every instruction: f32 in, bf16 and f16 inside, each dtype out.
TEST(CpuFastPointwise, CastsAndHalfWidthValues) {
  const Tensor x = with_special_values(kOdd, 3, -70000, 70000);  // past f16's range too
  const Tensor h = random_tensor(DType::f16, {1, 5, 1, 1}, 4, -2, 2);
  const Tensor b = random_tensor(DType::bf16, kOdd, 5, -2, 2);
  for (DType out : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(cat("to ", dtype_name(out)));
    const PointwiseProgram p{3,
                             {{.op = OpKind::cast, .operands = {0}, .to = DType::bf16},
                              {OpKind::mul, {3, 2}},
                              {.op = OpKind::cast, .operands = {4}, .to = DType::f16},
                              {OpKind::add, {5, 1}},
                              {OpKind::sigmoid, {6}},
                              {.op = OpKind::cast, .operands = {7}, .to = out}}};
    expect_reference_bits(program_graph(p, {x, h, b}), feeds_of({x, h, b}));
  }
}

// MobileNetV3's programs as fusion makes them: hard swish (x * clip(x + 3, 0, 6) / 6) and the
// squeeze-excitation scale (x * hard sigmoid of a per-channel value), with the constants as
// graph constants.
TEST(CpuFastPointwise, MobileNetHardSwishAndExcitation) {
  const Shape shape = {1, 24, 28, 28};
  Graph g("mobilenet");
  const ValueId x = g.add_input("x", DType::f32, shape);
  const ValueId s = g.add_input("s", DType::f32, {1, 24, 1, 1});
  const ValueId three = g.add_constant("three", Tensor::scalar(DType::f32, 3));
  const ValueId six = g.add_constant("six", Tensor::scalar(DType::f32, 6));
  const PointwiseInstr add{OpKind::add, {0, 1}}, div{OpKind::div, {4, 2}};
  const PointwiseInstr relu6{.op = OpKind::clip, .operands = {3}, .min = 0, .max = 6};
  const PointwiseProgram hardswish{3, {add, relu6, div, {OpKind::mul, {0, 5}}}};
  const ValueId y = g.add_node(OpKind::fused_pointwise, hardswish, {x, three, six}, "hardswish")[0];
  const PointwiseProgram excite{4,
                                {{OpKind::add, {1, 2}},
                                 {.op = OpKind::clip, .operands = {4}, .min = 0, .max = 6},
                                 {OpKind::div, {5, 3}},
                                 {OpKind::mul, {0, 6}}}};
  g.mark_output(g.add_node(OpKind::fused_pointwise, excite, {y, s, three, six}, "excite")[0]);
  expect_reference_bits(g,
                        {{"x", random_tensor(DType::f32, shape, 6, -5, 5)},
                         {"s", random_tensor(DType::f32, {1, 24, 1, 1}, 7, -5, 5)}},
                        2);
}

TEST(CpuFastPointwise, RandomProgramsInEveryDtypeTheyTake) {
  for (const std::vector<DType>& dtypes : std::vector<std::vector<DType>>{
           {DType::f32}, {DType::bf16}, {DType::f16}, {DType::f32, DType::bf16, DType::f16}}) {
    ChainOptions o;
    o.dtypes = dtypes;
    for (uint64_t seed = 1; seed <= 60; ++seed) {
      SCOPED_TRACE(cat(dtype_name(dtypes.back()), " of ", dtypes.size(), ", seed ", seed));
      const RandomChain c = random_chain(seed, o);
      SCOPED_TRACE(pointwise_program_text(c.program));
      expect_reference_bits(fused_graph(c), c.feeds());
    }
  }
}

// Outputs past one thread's share, not a multiple of the block; a rank-0 output.
TEST(CpuFastPointwise, LargeAndScalarOutputs) {
  for (const Shape& shape : {Shape{3, 7, 2053}, Shape{}}) {
    ChainOptions o;
    o.dtypes = {DType::f32};
    o.random_shape = false;
    o.shape = shape;
    for (uint64_t seed = 100; seed < 106; ++seed) {
      SCOPED_TRACE(cat(shape_str(shape), " seed ", seed));
      const RandomChain c = random_chain(seed, o);
      expect_reference_bits(fused_graph(c), c.feeds());
    }
  }
}

// f64 values compute in double on the reference: not taken, and the summary says why.
TEST(CpuFastPointwise, ProgramsWithF64ValuesStayOnTheReference) {
  const Tensor x = random_tensor(DType::f32, kOdd, 8);
  const PointwiseProgram p{1,
                           {{.op = OpKind::cast, .operands = {0}, .to = DType::f64},
                            {OpKind::exp, {1}},
                            {.op = OpKind::cast, .operands = {2}, .to = DType::f32}}};
  const Graph g = program_graph(p, {x});
  expect_reference_bits(g, feeds_of({x}), 0);
  auto exe = Executable::compile(g, {.device = Device::cpu, .cpu_kernels = CpuKernels::fast});
  EXPECT_NE(exe->stats().fast_summary.find("f64 value"), std::string::npos)
      << exe->stats().fast_summary;
}

}  // namespace
}  // namespace fusebox::testing
