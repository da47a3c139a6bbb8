// fold_norm_statistics (passes/fusion.h): a training batch norm reading a plain bf16 1x1
// convolution's y takes y's statistics from it (ConvAttrs::channel_stats, batch_norm's
// batch_stats: ir/ops.h); the folded graph gives the unfolded one's bits on the CPU backend;
// what must not fold stays; the IR's checks of the two forms. Then a block's training step as
// autodiff writes it, folded, with its gradients bit for bit. The CUDA forms (the statistics
// GEMM, the fallback pass, the norm given its statistics): tests/unit/cuda/kernels/
// test_cutlass_bn.cpp.
#include <string>
#include <vector>

#include "bit_identical.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr int64_t kC = 64, kK = 128;
const Shape kX = {2, kC, 5, 3};
// The tests' convolutions are small (30 pixels): they fold at any size, but the case that
// checks the default size threshold.
constexpr int64_t kAnySize = 1;

// x -> conv(w) -> batch_norm (training), every output marked; feeds random.
struct ConvNorm {
  Graph g{"conv_norm"};
  ValueId x, w, bias = kNoValue, scale, shift, mean, var;
  NamedTensors feeds;
  ConvAttrs conv;
  BatchNormAttrs norm{.training = true};
  DType t;

  explicit ConvNorm(DType dtype, Shape w_shape = {kK, kC, 1, 1}) : t(dtype) {
    const DType p = t == DType::f64 ? DType::f64 : DType::f32;
    uint64_t seed = 0;
    auto input = [&](const std::string& name, DType d, const Shape& s, double lo, double hi) {
      feeds[name] = random_tensor(d, s, ++seed, lo, hi);
      return g.add_input(name, d, s);
    };
    x = input("x", t, kX, -1, 1);
    w = input("w", t, w_shape, -1, 1);
    const int64_t k = w_shape[0];
    scale = input("scale", p, {k}, 0.5, 1.5);
    shift = input("shift", p, {k}, -1, 1);
    mean = input("mean", p, {k}, -0.5, 0.5);
    var = input("var", p, {k}, 0.5, 2);
  }
  // The conv's y.
  ValueId y() {
    std::vector<ValueId> in = {x, w};
    if (bias != kNoValue) in.push_back(bias);
    return g.add_node(OpKind::conv, conv, in, "conv")[0];
  }
  void norm_of(ValueId v, const std::string& name = "bn") {
    for (ValueId o : g.add_node(OpKind::batch_norm, norm, {v, scale, shift, mean, var}, name))
      g.mark_output(o);
  }
};

const Node& only(const Graph& g, OpKind op) {
  for (const Node& n : g.nodes())
    if (n.op == op) return n;
  throw Error("test", cat("no ", op_name(op)));
}

void expect_same_outputs(const Graph& want_graph, const Graph& got_graph,
                         const NamedTensors& feeds) {
  const NamedTensors want = run_graph(want_graph, feeds), got = run_graph(got_graph, feeds);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, tensor] : want) EXPECT_TRUE(bit_identical(got.at(name), tensor)) << name;
}

TEST(FoldNormStatistics, OneByOneConvGivesItsNormTheStatisticsBitForBit) {
  for (bool relu : {false, true}) {
    SCOPED_TRACE(relu ? "relu" : "plain");
    ConvNorm cn(DType::bf16);
    cn.norm.relu = relu;
    const ValueId y = cn.y();
    cn.g.mark_output(y);
    cn.norm_of(y);
    Graph g = cn.g;
    FusionLog log;
    EXPECT_EQ(fold_norm_statistics(g, &log, kAnySize), 1u);
    g.verify();
    const Node& conv = only(g, OpKind::conv);
    EXPECT_TRUE(std::get<ConvAttrs>(conv.attrs).channel_stats);
    ASSERT_EQ(conv.outputs.size(), 2u);
    EXPECT_EQ(g.value(conv.outputs[1]).type, (TensorType{DType::f64, {kK, 3}}));
    const Node& bn = only(g, OpKind::batch_norm);
    ASSERT_EQ(bn.inputs.size(), 7u);
    EXPECT_EQ(bn.inputs[5], kNoValue);
    EXPECT_EQ(bn.inputs[6], conv.outputs[1]);
    ASSERT_EQ(log.groups().size(), 1u);
    expect_same_outputs(cn.g, g, cn.feeds);
    EXPECT_EQ(fold_norm_statistics(g, nullptr, kAnySize), 0u)
        << "a norm given statistics takes none again";
  }
}

// Every norm reading the conv's y takes the same statistics; the conv writes them once.
TEST(FoldNormStatistics, TwoNormsOfOneConvShareItsStatistics) {
  ConvNorm cn(DType::bf16);
  const ValueId y = cn.y();
  cn.norm_of(y, "bn1");
  cn.norm.relu = true;
  cn.norm_of(y, "bn2");
  Graph g = cn.g;
  EXPECT_EQ(fold_norm_statistics(g, nullptr, kAnySize), 2u);
  g.verify();
  const Node& conv = only(g, OpKind::conv);
  int given = 0;
  for (const Node& n : g.nodes())
    given += n.op == OpKind::batch_norm && n.inputs.size() == 7 && n.inputs[6] == conv.outputs[1];
  EXPECT_EQ(given, 2);
  expect_same_outputs(cn.g, g, cn.feeds);
}

TEST(FoldNormStatistics, WhatMustNotFoldStays) {
  struct Case {
    const char* name;
    std::function<void(ConvNorm&)> change;
    DType t = DType::bf16;
    Shape w = {kK, kC, 1, 1};
  };
  const std::vector<Case> cases = {
      {"f32 (the statistics GEMM is bf16)", [](ConvNorm&) {}, DType::f32},
      {"3x3 filter",
       [](ConvNorm& c) {
         c.conv.pads_begin = c.conv.pads_end = {1, 1};
       },
       DType::bf16,
       {kK, kC, 3, 3}},
      {"stride 2",
       [](ConvNorm& c) {
         c.conv.strides = {2, 2};
       }},
      {"padding",
       [](ConvNorm& c) {
         c.conv.pads_begin = c.conv.pads_end = {1, 0};
       }},
      {"dilation",
       [](ConvNorm& c) {
         c.conv.dilations = {2, 1};
       }},
      {"bias",
       [](ConvNorm& c) {
         c.feeds["b"] = random_tensor(DType::bf16, {kK}, 90, -1, 1);
         c.bias = c.g.add_input("b", DType::bf16, {kK});
       }},
      {"an activation epilogue", [](ConvNorm& c) { c.conv.activation.kind = Activation::relu; }},
      {"groups", [](ConvNorm& c) { c.conv.groups = 2; }, DType::bf16, {kK, kC / 2, 1, 1}},
      {"96 output channels (not a multiple of 64)", [](ConvNorm&) {}, DType::bf16, {96, kC, 1, 1}},
      {"inference norm", [](ConvNorm& c) { c.norm.training = false; }},
      {"synchronized norm", [](ConvNorm& c) { c.norm.sync = true; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ConvNorm cn(c.t, c.w);
    c.change(cn);
    cn.norm_of(cn.y());
    Graph g = cn.g;
    EXPECT_EQ(fold_norm_statistics(g, nullptr, kAnySize), 0u);
    EXPECT_FALSE(std::get<ConvAttrs>(only(g, OpKind::conv).attrs).channel_stats);
  }
  {
    SCOPED_TRACE("fewer pixels than kNormStatisticsMinPixels (the default)");
    ConvNorm cn(DType::bf16);
    cn.norm_of(cn.y());
    Graph g = cn.g;
    EXPECT_EQ(fold_norm_statistics(g), 0u);
    EXPECT_EQ(fold_norm_statistics(g, nullptr, numel(kX) / kC + 1), 0u);
    EXPECT_EQ(fold_norm_statistics(g, nullptr, numel(kX) / kC), 1u);
  }
  // A norm reading the conv through another op.
  ConvNorm cn(DType::bf16);
  Builder b(cn.g);
  cn.norm_of(b.relu(cn.y()));
  Graph g = cn.g;
  EXPECT_EQ(fold_norm_statistics(g, nullptr, kAnySize), 0u);
}

TEST(FoldNormStatistics, IrChecksTheTwoForms) {
  auto infer_error = [](const std::function<void(Graph&)>& build) {
    Graph g("bad");
    try {
      build(g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const DType t = DType::bf16;
  auto inputs = [&](Graph& g) {
    return std::vector<ValueId>{g.add_input("x", t, kX), g.add_input("w", t, {kK, kC, 1, 1})};
  };
  // conv with channel_stats: output 1 f64 [K, 3]; the backward ops refuse it.
  {
    Graph g("ok");
    ConvAttrs a;
    a.channel_stats = true;
    const std::vector<ValueId> out = g.add_node(OpKind::conv, a, inputs(g), "conv");
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(g.value(out[1]).type, (TensorType{DType::f64, {kK, 3}}));
  }
  EXPECT_NE(infer_error([&](Graph& g) {
              ConvAttrs a;
              a.channel_stats = true;
              g.add_node(OpKind::conv_backward_data, ConvBackwardDataAttrs{a, {5, 3}},
                         {g.add_input("dy", t, {2, kK, 5, 3}), g.add_input("w", t, {kK, kC, 1, 1})},
                         "dgrad");
            }).find("channel_stats is a forward conv's output only"),
            std::string::npos);
  // batch_stats: f64 [C, 3], training without sync.
  auto norm_with = [&](Graph& g, DType stats_dtype, Shape stats_shape, BatchNormAttrs a) {
    const ValueId x = g.add_input("x", t, {2, kK, 5, 3});
    std::vector<ValueId> in = {x};
    for (const char* name : {"scale", "bias", "mean", "var"})
      in.push_back(g.add_input(name, DType::f32, {kK}));
    in.push_back(kNoValue);
    in.push_back(g.add_input("stats", stats_dtype, stats_shape));
    g.add_node(OpKind::batch_norm, a, in, "bn");
  };
  EXPECT_EQ(infer_error([&](Graph& g) {
              norm_with(g, DType::f64, {kK, 3}, {.training = true});
            }),
            "");
  EXPECT_NE(infer_error([&](Graph& g) {
              norm_with(g, DType::f32, {kK, 3}, {.training = true});
            }).find("must be f64"),
            std::string::npos);
  EXPECT_NE(infer_error([&](Graph& g) {
              norm_with(g, DType::f64, {kK, 2}, {.training = true});
            }).find("[C, 3]"),
            std::string::npos);
  EXPECT_NE(infer_error([&](Graph& g) {
              norm_with(g, DType::f64, {kK, 3}, {.training = false});
            }).find("needs the training form without sync"),
            std::string::npos);
}

// A bottleneck's 1x1 convolutions and their norms as a training step: the forward folded after
// autodiff, every gradient and statistic bit for bit.
TEST(FoldNormStatistics, TrainingStepKeepsItsGradientsBitForBit) {
  const DType t = DType::bf16, p = DType::f32;
  Graph g("bottleneck");
  Builder b(g);
  const ValueId x = g.add_input("x", t, kX);
  const ValueId w1 = g.add_input("w1", t, {kK, kC, 1, 1});
  const ValueId w2 = g.add_input("w2", t, {kC, kK, 1, 1});
  std::vector<ValueId> params = {x, w1, w2};
  auto norm = [&](ValueId v, int64_t c, const std::string& name, bool relu) {
    const ValueId scale = g.add_input(name + "_scale", p, {c});
    const ValueId shift = g.add_input(name + "_shift", p, {c});
    params.push_back(scale);
    params.push_back(shift);
    std::vector<double> zeros(size_t(c), 0.0), ones(size_t(c), 1.0);
    const ValueId mean = g.add_constant(name + "_mean", Tensor::from_doubles(p, {c}, zeros));
    const ValueId var = g.add_constant(name + "_var", Tensor::from_doubles(p, {c}, ones));
    const std::vector<ValueId> out =
        g.add_node(OpKind::batch_norm, BatchNormAttrs{.training = true, .relu = relu},
                   {v, scale, shift, mean, var}, name);
    for (size_t o = 1; o < out.size(); ++o) g.mark_output(out[o]);
    return out[0];
  };
  const ValueId h = norm(b.conv(x, w1), kK, "bn1", true);
  const ValueId y = norm(b.conv(h, w2), kC, "bn2", false);
  const ValueId loss = b.reduce_sum(b.cast(b.mul(y, y), DType::f32), {0, 1, 2, 3}, false);
  const GradResult r = grad(g, loss, params, {.mark_outputs = true});
  NamedTensors feeds;
  uint64_t seed = 70;
  for (ValueId v : g.inputs())
    feeds[g.value(v).name] = random_tensor(g.value(v).type.dtype, g.value(v).type.shape, ++seed,
                                           g.value(v).name.ends_with("_scale") ? 0.5 : -1.0, 1.5);
  Graph folded = g;
  EXPECT_EQ(fold_norm_statistics(folded, nullptr, kAnySize), 2u);
  folded.verify();
  expect_same_outputs(g, folded, feeds);
  for (ValueId wrt : params) EXPECT_NE(r.of(wrt), kNoValue);
}

}  // namespace
}  // namespace fusebox::testing
