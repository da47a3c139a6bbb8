// fuse_pointwise_chains (passes/fuse_pointwise.h): which groups it forms (maximal, >= 2 ops
// or one that broadcasts, <= 16 inputs), what it leaves alone (values read outside a group, graph
// outputs, non-float and non-pointwise ops, batch norms with a fused relu), that names stay, and
// that the fused graph computes the unfused graph's bits on the CPU.
#include "fusebox/passes/fuse_pointwise.h"
#include "bit_identical.h"
#include "fusebox/passes/fusion.h"
#include "random_pointwise.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::testing {
namespace {

std::vector<const Node*> nodes_of(const Graph& g, OpKind op) {
  std::vector<const Node*> found;
  for (const Node& n : g.nodes())
    if (n.op == op) found.push_back(&n);
  return found;
}

// Fuses a copy of g and checks it verifies and gives g's outputs bit for bit on the CPU.
Graph fused_copy(const Graph& g, const NamedTensors& feeds, size_t expected_groups) {
  Graph f = g;
  EXPECT_EQ(fuse_pointwise_chains(f), expected_groups);
  EXPECT_NO_THROW(f.verify());
  const NamedTensors want = run_graph(g, feeds), got = run_graph(f, feeds);
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(bit_identical(got.at(name), t));
  }
  return f;
}

NamedTensors feeds_for(const Graph& g, uint64_t seed) {
  NamedTensors feeds;
  for (ValueId v : g.inputs()) {
    const Value& value = g.value(v);
    feeds[value.name] = random_tensor(value.type.dtype, value.type.shape, seed++, -2, 2);
  }
  return feeds;
}

TEST(FusePointwise, ChainBecomesOneNodeNamedAfterItsOutput) {
  Graph g("chain");
  const ValueId x = g.add_input("x", DType::bf16, {2, 3, 4, 4});
  const ValueId a = g.add_input("a", DType::bf16, {3, 1, 1});
  const ValueId b = g.add_input("b", DType::bf16, {3, 1, 1});
  ValueId t = g.add_node(OpKind::mul, {}, {x, a}, "scale")[0];
  t = g.add_node(OpKind::add, {}, {t, b}, "shift")[0];
  t = g.add_node(OpKind::gelu, GeluAttrs{true}, {t}, "act")[0];
  t = g.add_node(OpKind::relu, {}, {t}, "out", {"y"})[0];
  g.mark_output(t);
  const Graph f = fused_copy(g, feeds_for(g, 1), 1);
  ASSERT_EQ(f.nodes().size(), 1u);
  const Node& n = f.nodes()[0];
  EXPECT_EQ(n.op, OpKind::fused_pointwise);
  EXPECT_EQ(n.name, "out");
  EXPECT_EQ(f.value(n.outputs[0]).name, "y");
  EXPECT_EQ(pointwise_program_text(std::get<PointwiseProgram>(n.attrs)),
            "t0=mul(in0,in1); t1=add(t0,in2); t2=gelu(t1,approximate=tanh); t3=relu(t2)");
  ASSERT_EQ(n.inputs.size(), 3u);
  EXPECT_EQ(f.value(n.inputs[0]).name, "x");
  EXPECT_EQ(f.value(n.inputs[2]).name, "b");
  Graph again = f;
  EXPECT_EQ(fuse_pointwise_chains(again), 0u);  // nothing left to fuse
}

TEST(FusePointwise, LoneOpThatBroadcastsIsAGroup) {
  // A squeeze-and-excitation scale: x [N, C, H, W] * s [N, C, 1, 1], between a sigmoid read
  // elsewhere and a graph output: the mul alone. A lone add of equal shapes stays unfused.
  Graph g("se");
  const ValueId x = g.add_input("x", DType::bf16, {2, 3, 4, 4});
  const ValueId z = g.add_input("z", DType::bf16, {2, 3, 1, 1});
  const ValueId u = g.add_input("u", DType::bf16, {2, 3, 4, 4});
  const ValueId s = g.add_node(OpKind::sigmoid, {}, {z}, "gate")[0];
  g.mark_output(s);
  const ValueId y = g.add_node(OpKind::mul, {}, {x, s}, "scale", {"y"})[0];
  g.mark_output(y);
  const ValueId w = g.add_node(OpKind::add, {}, {x, u}, "sum", {"w"})[0];
  g.mark_output(w);
  const Graph f = fused_copy(g, feeds_for(g, 5), 1);
  const std::vector<const Node*> fused = nodes_of(f, OpKind::fused_pointwise);
  ASSERT_EQ(fused.size(), 1u);
  EXPECT_EQ(fused[0]->name, "scale");
  EXPECT_EQ(pointwise_program_text(std::get<PointwiseProgram>(fused[0]->attrs)), "t0=mul(in0,in1)");
  EXPECT_EQ(nodes_of(f, OpKind::add).size(), 1u);
  EXPECT_EQ(nodes_of(f, OpKind::sigmoid).size(), 1u);
}

TEST(FusePointwise, ValuesReadOutsideStayUnfused) {
  Graph g("outside");
  const ValueId x = g.add_input("x", DType::f32, {4, 5});
  const ValueId a = g.add_input("a", DType::f32, {5});
  ValueId m = g.add_node(OpKind::mul, {}, {x, a}, "m")[0];
  ValueId s = g.add_node(OpKind::add, {}, {m, a}, "s")[0];  // read by relu and the reduction
  ValueId r = g.add_node(OpKind::relu, {}, {s}, "r")[0];
  ValueId e = g.add_node(OpKind::exp, {}, {r}, "e")[0];
  ValueId sum = g.add_node(OpKind::reduce_sum, ReduceAttrs{{1}, true}, {s}, "sum")[0];
  ValueId out = g.add_node(OpKind::div, {}, {e, sum}, "out")[0];
  g.mark_output(out);
  const Graph f = fused_copy(g, feeds_for(g, 7), 2);
  // {m, s} (s's value goes on to two readers) and {r, e, out}, the reduction between.
  const std::vector<const Node*> fused = nodes_of(f, OpKind::fused_pointwise);
  ASSERT_EQ(fused.size(), 2u);
  EXPECT_EQ(fused[0]->name, "s");
  EXPECT_EQ(pointwise_program_text(std::get<PointwiseProgram>(fused[0]->attrs)),
            "t0=mul(in0,in1); t1=add(t0,in1)");
  EXPECT_EQ(fused[1]->name, "out");
  EXPECT_EQ(pointwise_program_text(std::get<PointwiseProgram>(fused[1]->attrs)),
            "t0=relu(in0); t1=exp(t0); t2=div(t1,in1)");
  EXPECT_EQ(nodes_of(f, OpKind::reduce_sum).size(), 1u);
}

TEST(FusePointwise, GraphOutputsAreKept) {
  Graph g("outputs");
  const ValueId x = g.add_input("x", DType::f16, {8});
  ValueId a = g.add_node(OpKind::neg, {}, {x}, "a")[0];
  ValueId b = g.add_node(OpKind::abs, {}, {a}, "b")[0];  // a graph output, read on
  ValueId c = g.add_node(OpKind::sqrt, {}, {b}, "c")[0];
  ValueId d = g.add_node(OpKind::tanh, {}, {c}, "d")[0];
  g.mark_output(b);
  g.mark_output(d);
  const Graph f = fused_copy(g, feeds_for(g, 3), 2);
  const std::vector<const Node*> fused = nodes_of(f, OpKind::fused_pointwise);
  ASSERT_EQ(fused.size(), 2u);
  EXPECT_EQ(f.value(fused[0]->outputs[0]).name, "b");
  EXPECT_EQ(f.value(fused[1]->outputs[0]).name, "d");
}

TEST(FusePointwise, AtMostSixteenInputs) {
  Graph g("wide");
  ValueId t = g.add_input("in0", DType::f32, {6});
  for (int i = 1; i <= 20; ++i) {
    const ValueId in = g.add_input(cat("in", i), DType::f32, {6});
    t = g.add_node(OpKind::add, {}, {t, in}, cat("add", i))[0];
  }
  g.mark_output(t);
  const Graph f = fused_copy(g, feeds_for(g, 11), 2);
  for (const Node* n : nodes_of(f, OpKind::fused_pointwise)) EXPECT_LE(n->inputs.size(), 16u);
  EXPECT_EQ(f.nodes().size(), 2u);
}

TEST(FusePointwise, OnlyFloatPointwiseOpsJoin) {
  Graph g("mixed");
  const ValueId x = g.add_input("x", DType::f32, {4, 6});
  const ValueId n = g.add_input("n", DType::i64, {6});
  const ValueId k = g.add_input("k", DType::i32, {6});
  ValueId a = g.add_node(OpKind::exp, {}, {x}, "a")[0];
  ValueId p = g.add_node(OpKind::pow, {}, {a, k}, "p")[0];  // an integer exponent: unfused
  ValueId s = g.add_node(OpKind::softmax, SoftmaxAttrs{}, {p}, "s")[0];
  ValueId b = g.add_node(OpKind::sigmoid, {}, {s}, "b")[0];
  ValueId c = g.add_node(OpKind::cast, CastAttrs{DType::i64}, {b}, "c")[0];  // to an integer
  ValueId d = g.add_node(OpKind::add, {}, {c, n}, "d")[0];
  ValueId e = g.add_node(OpKind::abs, {}, {d}, "e")[0];  // integer abs
  g.mark_output(e);
  Graph f = g;
  EXPECT_EQ(fuse_pointwise_chains(f), 0u);
  EXPECT_EQ(f.nodes().size(), g.nodes().size());
}

// A residual block's backward: the gradient's two contributions summed, then relu's mask
// (unary_backward at the block's output y): one kernel; a derivative the programs do not hold
// (exp's) stays its own node.
TEST(FusePointwise, ActivationGradientsJoinTheirNeighbours) {
  Graph g("residual_backward");
  const ValueId a = g.add_input("a", DType::bf16, {2, 3, 4, 4});
  const ValueId b = g.add_input("b", DType::bf16, {2, 3, 4, 4});
  const ValueId y = g.add_input("y", DType::bf16, {2, 3, 4, 4});
  ValueId s = g.add_node(OpKind::add, {}, {a, b}, "sum")[0];
  ValueId d = g.add_node(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::relu}, {s, y},
                         "relu_dx")[0];
  g.mark_output(d);
  ValueId e = g.add_node(OpKind::mul, {}, {d, a}, "m")[0];
  e = g.add_node(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::exp}, {e, y},
                 "exp_dx")[0];
  e = g.add_node(OpKind::add, {}, {e, b}, "z")[0];
  g.mark_output(e);
  // m -> exp_dx -> z would be one group if exp's derivative joined: m and z stay lone.
  const Graph f = fused_copy(g, feeds_for(g, 3), 1);
  const std::vector<const Node*> fused = nodes_of(f, OpKind::fused_pointwise);
  ASSERT_EQ(fused.size(), 1u);
  EXPECT_EQ(pointwise_program_text(std::get<PointwiseProgram>(fused[0]->attrs)),
            "t0=add(in0,in1); t1=unary_backward(t0,in2,of=relu)");
  EXPECT_EQ(nodes_of(f, OpKind::unary_backward).size(), 1u);  // exp's
  EXPECT_EQ(f.nodes().size(), 4u);
}

TEST(FusePointwise, ShapesBroadcastWithinTheGroup) {
  // t = a * b with a, b per channel, then x + t: the product is computed at x's shape.
  Graph g("per_channel");
  const ValueId x = g.add_input("x", DType::bf16, {2, 3, 5});
  const ValueId a = g.add_input("a", DType::bf16, {3, 1});
  const ValueId b = g.add_input("b", DType::bf16, {3, 1});
  ValueId t = g.add_node(OpKind::mul, {}, {a, b}, "t")[0];
  t = g.add_node(OpKind::add, {}, {x, t}, "u")[0];
  t = g.add_node(OpKind::exp, {}, {t}, "y")[0];
  g.mark_output(t);
  const Graph f = fused_copy(g, feeds_for(g, 5), 1);
  EXPECT_EQ(f.value(f.outputs()[0]).type.shape, (Shape{2, 3, 5}));
}

TEST(FusePointwise, DiamondsAndRepeatedReads) {
  Graph g("diamond");
  const ValueId x = g.add_input("x", DType::f32, {7});
  ValueId e = g.add_node(OpKind::exp, {}, {x}, "e")[0];
  ValueId s = g.add_node(OpKind::mul, {}, {e, e}, "s")[0];
  ValueId r = g.add_node(OpKind::sqrt, {}, {e}, "r")[0];
  ValueId y = g.add_node(OpKind::sub, {}, {s, r}, "y")[0];
  y = g.add_node(OpKind::mul, {}, {y, x}, "z")[0];
  g.mark_output(y);
  const Graph f = fused_copy(g, feeds_for(g, 9), 1);
  EXPECT_EQ(f.nodes().size(), 1u);
  EXPECT_EQ(f.nodes()[0].inputs.size(), 1u);  // x, read twice, is one input
}

TEST(FusePointwise, LeavesBatchNormFusionsAlone) {
  // bn -> relu (fused into the batch norm first) -> mul -> add: the relu is gone, the rest
  // fuses.
  Graph g("bn");
  const ValueId x = g.add_input("x", DType::f32, {2, 3, 4, 4});
  std::vector<ValueId> params;
  for (const char* name : {"scale", "bias", "mean", "var"})
    params.push_back(g.add_input(name, DType::f32, {3}));
  ValueId y = g.add_node(OpKind::batch_norm, BatchNormAttrs{},
                         {x, params[0], params[1], params[2], params[3]}, "bn")[0];
  y = g.add_node(OpKind::relu, {}, {y}, "relu")[0];
  const ValueId c = g.add_input("c", DType::f32, {});
  y = g.add_node(OpKind::mul, {}, {y, c}, "mul")[0];
  y = g.add_node(OpKind::add, {}, {y, x}, "add")[0];
  g.mark_output(y);
  Graph f = g;
  EXPECT_EQ(fuse_batch_norm_relu(f), 1u);
  EXPECT_EQ(fuse_pointwise_chains(f), 1u);
  ASSERT_EQ(nodes_of(f, OpKind::batch_norm).size(), 1u);
  EXPECT_TRUE(std::get<BatchNormAttrs>(nodes_of(f, OpKind::batch_norm)[0]->attrs).relu);
  EXPECT_EQ(f.nodes().size(), 2u);
}

TEST(FusePointwise, RandomChainsFuseWhole) {
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    SCOPED_TRACE(cat("seed ", seed));
    const RandomChain c = random_chain(seed);
    const Graph g = unfused_graph(c);
    const size_t ops = c.program.instrs.size();
    const Graph f = fused_copy(g, c.feeds(), ops >= 2 ? 1 : 0);
    if (ops >= 2) {
      EXPECT_EQ(f.nodes().size(), 1u);
    }
  }
}

// A producer does not join where its large input (>= 64 MiB) would live more than 2 nodes
// past its last reader outside the group: a gradient sum's adds, one per branch with a
// branch's backward between them, stay adds (one running sum live, not every branch's
// gradient until the last add). The same chain on small values, or with the adds adjacent,
// is one kernel.
TEST(FusePointwise, LargeInputsAreNotKeptAliveForAFarGroup) {
  const auto sum_of_branches = [](const Shape& shape, bool spaced) {
    Graph g("branches");
    const ValueId d = g.add_input("d", DType::bf16, shape);
    ValueId acc = kNoValue;
    for (int i = 0; i < 4; ++i) {
      // A branch: its gradient is born right before its add (the negation stands for the
      // branch's backward, not elementwise-fusible: a reduction then an expand).
      ValueId branch = g.add_node(OpKind::neg, {}, {d}, cat("branch", i))[0];
      if (spaced) {
        for (int k = 0; k < 3; ++k) {
          const ValueId r = g.add_node(OpKind::reduce_sum, ReduceAttrs{{1}, true}, {branch},
                                       cat("spacer", i, k))[0];
          branch = g.add_node(OpKind::expand, ExpandAttrs{shape}, {r}, cat("back", i, k))[0];
        }
      }
      acc = acc == kNoValue ? branch : g.add_node(OpKind::add, {}, {acc, branch}, cat("sum", i))[0];
    }
    g.rename_value(acc, "y");
    g.mark_output(acc);
    return g;
  };
  const Shape large = {64, 64, 128, 64};  // 64 MiB of bf16
  Graph far = sum_of_branches(large, true);
  fuse_pointwise_chains(far);
  EXPECT_EQ(nodes_of(far, OpKind::add).size(), 3u);
  // Small values: the adds become one kernel (and the negations beside them).
  const Graph small = sum_of_branches({2, 4, 3, 3}, true);
  const Graph f = fused_copy(small, feeds_for(small, 3), 1);
  EXPECT_TRUE(nodes_of(f, OpKind::add).empty());
  // Large but adjacent: one kernel too.
  Graph near = sum_of_branches(large, false);
  EXPECT_EQ(fuse_pointwise_chains(near), 1u);
  EXPECT_TRUE(nodes_of(near, OpKind::add).empty());
}

// A large value that a member reads already lives to the group's place: the producers that
// also read it join. HardSwish x * clip(x / 6 + 1/2, 0, 1) on a 98 MiB bf16 x (MobileNetV3's
// stem at batch 256): one kernel, where the gate's scale of x had been kept out (its own
// kernel, x read twice: +0.3 ms of MobileNetV3-L's inference step on an H200).
TEST(FusePointwise, AProducerJoinsWhereAMemberReadsItsLargeInputAlready) {
  Graph g("hardswish");
  const Shape shape{256, 16, 112, 112};
  const ValueId x0 = g.add_input("x", DType::bf16, shape);
  // x from a producer that is not a member (a graph input would live throughout anyway).
  const ValueId xs = g.add_node(OpKind::softmax, SoftmaxAttrs{1}, {x0}, "producer")[0];
  const ValueId sixth = g.add_constant("sixth", Tensor::full(DType::bf16, {}, 1.0 / 6));
  const ValueId half = g.add_constant("half", Tensor::full(DType::bf16, {}, 0.5));
  ValueId gate = g.add_node(OpKind::mul, {}, {xs, sixth}, "scale")[0];
  gate = g.add_node(OpKind::add, {}, {gate, half}, "shift")[0];
  gate = g.add_node(OpKind::clip, ClipAttrs{0.0, 1.0}, {gate}, "gate")[0];
  const ValueId y = g.add_node(OpKind::mul, {}, {xs, gate}, "hardswish")[0];
  g.mark_output(y);
  EXPECT_EQ(fuse_pointwise_chains(g), 1u);
  const std::vector<const Node*> fused = nodes_of(g, OpKind::fused_pointwise);
  ASSERT_EQ(fused.size(), 1u);
  EXPECT_EQ(std::get<PointwiseProgram>(fused[0]->attrs).instrs.size(), 4u);
  EXPECT_TRUE(nodes_of(g, OpKind::mul).empty());
}

}  // namespace
}  // namespace fusebox::testing
