// fold_gradient_sums (passes/fusion.h): a gradient sum read only by a batch_norm_backward as
// its dy becomes the node's dy and dy_addend (ir/ops.h); what must not fold stays; the folded
// graph gives the unfolded one's bits on the CPU backend. Then a residual block's step as
// autodiff writes it: the residual batch norm's backward masks by y and writes the gradient at
// the sum (dy_output) with no relu_dx of its own, the block output's two contributions fold,
// and the gradients stay bit for bit. The CUDA kernels of the two-term form:
// tests/unit/cuda/kernels/test_ops_batch_norm_channels_last.cpp.
#include <string>
#include <vector>

#include "bit_identical.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/pipeline.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

const Shape kX = {4, 6, 5, 3};
constexpr int64_t kC = 6;

// The backward's operands as graph inputs: dy in two terms (a, b), x, scale, the saved
// statistics and y (the forward's relu'd output).
struct BackwardGraph {
  Graph g{"bn_backward"};
  ValueId a, b, x, scale, mean, inv_std, y;
  NamedTensors feeds;

  explicit BackwardGraph(DType t) {
    const DType p = t == DType::f64 ? DType::f64 : DType::f32;
    auto input = [&](const std::string& name, DType d, const Shape& s, uint64_t seed, double lo,
                     double hi) {
      feeds[name] = random_tensor(d, s, seed, lo, hi);
      return g.add_input(name, d, s);
    };
    a = input("a", t, kX, 1, -1, 1);
    b = input("b", t, kX, 2, -1, 1);
    x = input("x", t, kX, 3, -2, 2);
    scale = input("scale", p, {kC}, 4, 0.5, 1.5);
    mean = input("mean", p, {kC}, 5, -0.5, 0.5);
    inv_std = input("inv_std", p, {kC}, 6, 0.5, 2);
    y = input("y", t, kX, 7, -1, 1);  // about half <= 0: the mask cuts
  }

  // batch_norm_backward of `dy` (relu: masked by y), its outputs marked.
  void backward(ValueId dy, bool relu, bool dy_output) {
    BatchNormAttrs attrs{.training = true, .relu = relu, .dy_output = dy_output};
    std::vector<ValueId> in = {dy, x, scale, mean, inv_std};
    if (relu) in.push_back(y);
    for (ValueId v : g.add_node(OpKind::batch_norm_backward, attrs, in, "bn_backward"))
      g.mark_output(v);
  }
};

const Node& only(const Graph& g, OpKind op) {
  for (const Node& n : g.nodes())
    if (n.op == op) return n;
  throw Error("test", cat("no ", op_name(op)));
}

TEST(FoldGradientSums, SumReadOnlyByTheBackwardFoldsBitForBit) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (bool relu : {false, true}) {
      for (bool dy_output : {false, true}) {
        SCOPED_TRACE(cat(dtype_name(t), relu ? " relu" : "", dy_output ? " dy_output" : ""));
        BackwardGraph bg(t);
        Builder builder(bg.g);
        bg.backward(builder.add(bg.a, bg.b), relu, dy_output);
        Graph g = bg.g;
        FusionLog log;
        EXPECT_EQ(fold_gradient_sums(g, &log), 1u);
        g.verify();
        EXPECT_EQ(count_ops(g, OpKind::add), 0);
        const Node& n = only(g, OpKind::batch_norm_backward);
        ASSERT_EQ(n.inputs.size(), 8u);
        EXPECT_EQ(g.value(n.inputs[0]).name, "a");
        EXPECT_EQ(g.value(n.inputs[7]).name, "b");
        EXPECT_EQ(n.inputs[5] != kNoValue, relu);
        EXPECT_EQ(n.inputs[6], kNoValue);
        ASSERT_EQ(log.groups().size(), 1u);
        EXPECT_EQ(log.groups()[0].ops.size(), 2u);
        const NamedTensors want = run_graph(bg.g, bg.feeds), got = run_graph(g, bg.feeds);
        ASSERT_EQ(got.size(), want.size());
        for (const auto& [name, tensor] : want)
          EXPECT_TRUE(bit_identical(got.at(name), tensor)) << name;
        EXPECT_EQ(fold_gradient_sums(g), 0u) << "a folded node takes no second sum";
      }
    }
  }
}

// Without a relu the node uses the sum as it is: readers of the sum after it read the sum the
// node writes (dy_output), bit for bit.
TEST(FoldGradientSums, ReadersAfterAReluLessNodeReadTheSumItWrites) {
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    BackwardGraph bg(t);
    Builder b(bg.g);
    const ValueId s = b.add(bg.a, bg.b);
    bg.backward(s, false, false);
    const ValueId later = b.mul(s, bg.y);
    bg.g.mark_output(later);
    Graph g = bg.g;
    EXPECT_EQ(fold_gradient_sums(g), 1u);
    g.verify();
    EXPECT_EQ(count_ops(g, OpKind::add), 0);
    const Node& n = only(g, OpKind::batch_norm_backward);
    ASSERT_EQ(n.outputs.size(), 4u);
    EXPECT_TRUE(std::get<BatchNormAttrs>(n.attrs).dy_output);
    EXPECT_EQ(g.node(g.value(g.outputs().back()).producer).inputs[0], n.outputs[3]);
    const NamedTensors want = run_graph(bg.g, bg.feeds), got = run_graph(g, bg.feeds);
    for (const auto& [name, tensor] : want)
      EXPECT_TRUE(bit_identical(got.at(name), tensor)) << name;
  }
}

TEST(FoldGradientSums, WhatMustNotFoldStays) {
  const DType t = DType::f32;
  // The sum read by another node too, with a relu (the node's dy_used is masked, not the sum).
  {
    BackwardGraph bg(t);
    Builder b(bg.g);
    const ValueId s = b.add(bg.a, bg.b);
    bg.backward(s, true, false);
    bg.g.mark_output(b.relu(s));
    EXPECT_EQ(fold_gradient_sums(bg.g), 0u);
  }
  // The sum read before the node too (the node cannot write it for that reader).
  {
    BackwardGraph bg(t);
    Builder b(bg.g);
    const ValueId s = b.add(bg.a, bg.b);
    bg.g.mark_output(b.relu(s));
    bg.backward(s, false, false);
    EXPECT_EQ(fold_gradient_sums(bg.g), 0u);
  }
  // The sum a graph output.
  {
    BackwardGraph bg(t);
    Builder b(bg.g);
    const ValueId s = b.add(bg.a, bg.b);
    bg.backward(s, false, false);
    bg.g.mark_output(s);
    EXPECT_EQ(fold_gradient_sums(bg.g), 0u);
  }
  // A term broadcast to dy's shape (a [C, 1, 1] bias-like gradient).
  {
    BackwardGraph bg(t);
    Builder b(bg.g);
    const ValueId c = bg.g.add_input("c", t, {kC, 1, 1});
    bg.feeds["c"] = random_tensor(t, {kC, 1, 1}, 9);
    bg.backward(b.add(bg.a, c), false, false);
    EXPECT_EQ(fold_gradient_sums(bg.g), 0u);
  }
  // A term an elementwise op makes (the pointwise chains take the sum into its kernel).
  {
    BackwardGraph bg(t);
    Builder b(bg.g);
    bg.backward(b.add(b.mul(bg.a, bg.y), bg.b), false, false);
    EXPECT_EQ(fold_gradient_sums(bg.g), 0u);
  }
  // Not a sum (a product), and a sum feeding x rather than dy.
  {
    BackwardGraph bg(t);
    Builder b(bg.g);
    bg.backward(b.mul(bg.a, bg.b), false, false);
    EXPECT_EQ(fold_gradient_sums(bg.g), 0u);
  }
  {
    BackwardGraph bg(t);
    Builder b(bg.g);
    bg.x = b.add(bg.x, bg.b);
    bg.backward(bg.a, false, false);
    EXPECT_EQ(fold_gradient_sums(bg.g), 0u);
  }
}

// The IR: dy_addend must have dy's type; dy_output gives a fourth output of dy's type; the
// forward refuses dy_output.
TEST(FoldGradientSums, TwoTermFormIrChecks) {
  BackwardGraph bg(DType::f32);
  const ValueId wrong = bg.g.add_input("wrong", DType::f64, kX);
  const BatchNormAttrs attrs{.training = true, .dy_output = true};
  const std::vector<ValueId> out =
      bg.g.add_node(OpKind::batch_norm_backward, attrs,
                    {bg.a, bg.x, bg.scale, bg.mean, bg.inv_std, kNoValue, kNoValue, bg.b}, "ok");
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(bg.g.value(out[3]).type, bg.g.value(bg.a).type);
  try {
    bg.g.add_node(OpKind::batch_norm_backward, attrs,
                  {bg.a, bg.x, bg.scale, bg.mean, bg.inv_std, kNoValue, kNoValue, wrong}, "bad");
    ADD_FAILURE() << "an f64 dy_addend of an f32 dy was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dy_addend"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad"), std::string::npos) << e.what();
  }
  Builder b(bg.g);
  try {
    b.batch_norm_training(bg.x, bg.scale, bg.scale, bg.mean, bg.inv_std,
                          BatchNormAttrs{.training = true, .dy_output = true});
    ADD_FAILURE() << "a forward batch_norm took dy_output";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dy_output"), std::string::npos) << e.what();
  }
}

// A residual block's end as the training forward pipeline fuses it, relu(bn(h) + x), its
// output read by two convolutions, differentiated: the residual norm's backward masks by y and
// writes the gradient at the sum (no unary_backward), and the output's two contributions fold into
// it.
TEST(FoldGradientSums, ResidualBlockStepFoldsAndKeepsItsGradients) {
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const DType p = t == DType::bf16 ? DType::f32 : t;
    Graph g("block");
    Builder b(g);
    const ValueId x = g.add_input("x", t, kX);
    const ValueId h = g.add_input("h", t, kX);
    const ValueId w1 = g.add_input("w1", t, {kC, kC, 1, 1});
    const ValueId w2 = g.add_input("w2", t, {kC, kC, 3, 3});
    const ValueId scale = g.add_input("scale", p, {kC});
    const ValueId bias = g.add_input("bias", p, {kC});
    const ValueId mean = g.add_constant("mean", Tensor::from_doubles(p, {kC}, {0, 0, 0, 0, 0, 0}));
    const ValueId var = g.add_constant("var", Tensor::from_doubles(p, {kC}, {1, 1, 1, 1, 1, 1}));
    // relu(bn(h) + x) as fuse_batch_norm_residual makes it (training: its statistics too).
    const std::vector<ValueId> fused =
        g.add_node(OpKind::batch_norm, BatchNormAttrs{.training = true, .relu = true},
                   {h, scale, bias, mean, var, x}, "end");
    const ValueId out = fused[0];
    // Read by two convolutions (a next block's first one and, for the skip, another): two
    // conv_backward_data contributions.
    ConvAttrs padded;
    padded.pads_begin = padded.pads_end = {1, 1};
    const ValueId loss =
        b.reduce_sum(b.cast(b.add(b.conv(out, w1), b.conv(out, w2, kNoValue, padded)), DType::f32),
                     {0, 1, 2, 3}, false);
    const GradResult r = grad(g, loss, {x, h, scale, bias}, {.mark_outputs = true});
    EXPECT_EQ(count_ops(g, OpKind::unary_backward), 0) << "no relu_dx of its own";
    int with_output = 0;
    for (const Node& n : g.nodes())
      if (n.op == OpKind::batch_norm_backward)
        with_output += std::get<BatchNormAttrs>(n.attrs).dy_output;
    EXPECT_EQ(with_output, 1);

    NamedTensors feeds;
    uint64_t seed = 40;
    for (ValueId v : g.inputs())
      feeds[g.value(v).name] = random_tensor(g.value(v).type.dtype, g.value(v).type.shape, ++seed,
                                             g.value(v).name == "scale" ? 0.5 : -1.0, 1.5);
    const NamedTensors want = run_graph(g, feeds);
    Graph folded = g;
    EXPECT_EQ(fold_gradient_sums(folded), 1u);
    folded.verify();
    int two_terms = 0;
    for (const Node& m : folded.nodes())
      two_terms += m.op == OpKind::batch_norm_backward && m.inputs.size() == 8;
    EXPECT_EQ(two_terms, 1);
    const NamedTensors got = run_graph(folded, feeds);
    for (ValueId wrt : {x, h, scale, bias}) {
      const std::string& name = g.value(r.of(wrt)).name;
      EXPECT_TRUE(bit_identical(got.at(name), want.at(name))) << name;
    }
  }
}

}  // namespace
}  // namespace fusebox::testing
