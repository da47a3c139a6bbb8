// The inference fusions of convolutions (passes/fusion.h): batch-norm folding (exact to
// rounding in f32 and f64, bf16's error measured), conv epilogues (every activation, the
// residual add; what must not fuse), the pipeline and its report (groups, the summary
// line's counts, the Graphviz file), the fused conv's IR checks, its missing gradient rule
// and its ONNX export. All on the CPU backend (the CUDA lowering: tests/unit/cuda/cudnn).
#include <cmath>
#include <set>
#include <string>

#include "fusebox/backends/cuda.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/ir/builder.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/zoo.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

Graph resnet18(DType dtype = DType::f32) {
  Graph g =
      build_zoo_model("resnet18", {.batch = 2, .image_size = 32, .num_classes = 10, .seed = 7});
  if (dtype == DType::f32) return g;
  return apply_mixed_precision(g, dtype == DType::bf16 ? Precision::bf16 : Precision::f16);
}

Tensor logits(const Graph& g, const Tensor& input) {
  return run_graph(g, {{"input", input}}).at("logits");
}

// conv -> batch_norm (inference form, random statistics) in `dtype`: folding is exact to
// the dtype's rounding.
Graph conv_bn(DType dtype, bool conv_bias) {
  Graph g("conv_bn");
  Builder b(g);
  const ValueId x = g.add_input("x", dtype, {2, 4, 6, 6});
  const ValueId w = g.add_constant("w", random_tensor(dtype, {5, 4, 3, 3}, 1));
  std::vector<ValueId> inputs = {x, w};
  if (conv_bias) inputs.push_back(g.add_constant("b", random_tensor(dtype, {5}, 2)));
  const ValueId y = g.add_node(OpKind::conv, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}},
                               inputs, "conv")[0];
  auto param = [&](const std::string& name, uint64_t seed, double lo, double hi) {
    return g.add_constant(name, random_tensor(dtype, {5}, seed, lo, hi));
  };
  const ValueId out =
      b.name("bn").batch_norm(y, param("gamma", 3, 0.5, 1.5), param("beta", 4, -1, 1),
                              param("mean", 5, -1, 1), param("var", 6, 0.2, 2));
  g.rename_value(out, "out");
  g.mark_output(out);
  return g;
}

TEST(FoldBatchNorms, ExactToRoundingInF64AndF32) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (bool conv_bias : {false, true}) {
      SCOPED_TRACE(cat(dtype_name(dtype), conv_bias ? " with conv bias" : ""));
      const Graph model = conv_bn(dtype, conv_bias);
      Graph folded = model;
      FusionLog log;
      ASSERT_EQ(fold_batch_norms(folded, &log), 1u);
      EXPECT_EQ(count_ops(folded, OpKind::batch_norm), 0);
      EXPECT_EQ(folded.value(folded.outputs()[0]).name, "out");
      EXPECT_FALSE(folded.find_value("w").has_value()) << "the unfolded weight is dropped";
      ASSERT_EQ(log.groups().size(), 1u);
      EXPECT_EQ(log.groups()[0].ops.size(), 2u);
      const Tensor x = random_tensor(dtype, {2, 4, 6, 6}, 9);
      const Tensor want = run_graph(model, {{"x", x}}).at("out");
      const Tensor got = run_graph(folded, {{"x", x}}).at("out");
      EXPECT_LE(relative_l2(got, want), dtype == DType::f64 ? 1e-14 : 1e-6);
    }
  }
}

// ResNet-18: all 20 batch norms follow a conv and fold; f32 logits within rounding; in bf16
// (folded in f32, then cast once) the error against the f32 model is measured and no worse
// than the unfolded bf16 model's.
TEST(FoldBatchNorms, Resnet18FoldsEveryBatchNorm) {
  const Graph model = resnet18();
  Graph folded = model;
  EXPECT_EQ(fold_batch_norms(folded), 20u);
  EXPECT_EQ(count_ops(folded, OpKind::batch_norm), 0);
  EXPECT_NO_THROW(folded.verify());
  const Tensor x = random_tensor(DType::f32, {2, 3, 32, 32}, 11);
  const Tensor want = logits(model, x);
  EXPECT_LE(relative_l2(logits(folded, x), want), 1e-5);

  // Both in bf16 through mixed precision, which keeps the model's f32 input (it casts inside).
  const Graph bf16_unfolded = prepare_graph(model, {.kind = PipelineKind::inference,
                                                    .precision = Precision::bf16,
                                                    .fusion = InferenceFusionOptions::none()});
  const Graph bf16_folded = prepare_graph(
      model, {.kind = PipelineKind::inference,
              .precision = Precision::bf16,
              .fusion = {.conv_epilogue = false, .batch_norm = false, .pointwise = false}});
  EXPECT_EQ(count_ops(bf16_folded, OpKind::batch_norm), 0);
  const double unfolded_error = relative_l2(logits(bf16_unfolded, x), want);
  const double folded_error = relative_l2(logits(bf16_folded, x), want);
  std::printf("resnet18 bf16 logits vs f32: unfolded %.3e, folded %.3e\n", unfolded_error,
              folded_error);
  EXPECT_LE(folded_error, 5e-2);
  EXPECT_LE(folded_error, 2 * unfolded_error + 1e-3);
}

// Not folded: a training-form batch norm, a conv output read twice, non-constant statistics.
TEST(FoldBatchNorms, LeavesWhatCannotFold) {
  Graph g("net");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {1, 2, 4, 4});
  const ValueId gamma = g.add_input("gamma", DType::f32, {2});  // not a constant
  auto c = [&](const std::string& name, uint64_t seed) {
    return g.add_constant(name, random_tensor(DType::f32, {2}, seed, 0.5, 1.5));
  };
  auto conv = [&](const std::string& name, ValueId in, uint64_t seed) {
    return g.add_node(
        OpKind::conv, ConvAttrs{},
        {in, g.add_constant(name + ".w", random_tensor(DType::f32, {2, 2, 1, 1}, seed))}, name)[0];
  };
  const ValueId y1 = conv("c1", x, 1);
  const ValueId n1 =
      b.name("bn_input_gamma").batch_norm(y1, gamma, c("b1", 2), c("m1", 3), c("v1", 4));
  const ValueId y2 = conv("c2", n1, 5);
  const ValueId n2 =
      b.name("bn_shared").batch_norm(y2, c("g2", 6), c("b2", 7), c("m2", 8), c("v2", 9));
  const ValueId s = b.name("add").add(n2, y2);  // y2 read twice
  g.mark_output(s);
  Graph folded = g;
  EXPECT_EQ(fold_batch_norms(folded), 0u);
  EXPECT_EQ(count_ops(folded, OpKind::batch_norm), 2);
}

// Every activation, with and without a residual: the fused conv computes the chain to f32
// rounding, and exports to ONNX as Conv and the ops (imported back: the same values).
TEST(FuseConvEpilogues, EveryActivationAndResidualMatchTheUnfusedChain) {
  const std::vector<std::pair<OpKind, Attrs>> acts = {{OpKind::relu, {}},
                                                      {OpKind::gelu, GeluAttrs{}},
                                                      {OpKind::gelu, GeluAttrs{true}},
                                                      {OpKind::silu, {}},
                                                      {OpKind::sigmoid, {}},
                                                      {OpKind::tanh, {}},
                                                      {OpKind::clip, ClipAttrs{-0.25, 0.5}}};
  for (size_t i = 0; i < acts.size(); ++i) {
    for (int residual = 0; residual < 2; ++residual) {
      SCOPED_TRACE(cat(op_name(acts[i].first), residual ? " + residual + act" : ""));
      Graph g("epilogue");
      const ValueId x = g.add_input("x", DType::f32, {2, 3, 5, 5});
      const ValueId z = g.add_input("z", DType::f32, {2, 4, 5, 5});
      const ValueId y =
          g.add_node(OpKind::conv, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}},
                     {x, g.add_constant("w", random_tensor(DType::f32, {4, 3, 3, 3}, 3)),
                      g.add_constant("b", random_tensor(DType::f32, {4}, 4))},
                     "conv")[0];
      ValueId v = g.add_node(acts[i].first, acts[i].second, {y}, "act")[0];
      if (residual) {
        v = g.add_node(OpKind::add, {}, {z, v}, "add")[0];  // the residual on either side
        const auto& post = acts[(i + 3) % acts.size()];
        v = g.add_node(post.first, post.second, {v}, "post")[0];
      } else {
        g.add_node(OpKind::identity, {}, {z}, "keep_z");
      }
      g.rename_value(v, "out");
      g.mark_output(v);
      Graph fused = g;
      FusionLog log;
      ASSERT_EQ(fuse_conv_epilogues(fused, &log), 1u);
      EXPECT_EQ(count_ops(fused, OpKind::conv), 1);
      EXPECT_EQ(int(fused.nodes().size()), residual ? 1 : 2);
      ASSERT_EQ(log.groups().size(), 1u);
      EXPECT_EQ(log.groups()[0].ops.size(), residual ? 4u : 2u);
      const NamedTensors feeds = {{"x", random_tensor(DType::f32, {2, 3, 5, 5}, 5, -2, 2)},
                                  {"z", random_tensor(DType::f32, {2, 4, 5, 5}, 6)}};
      const Tensor want = run_graph(g, feeds).at("out");
      EXPECT_LE(relative_l2(run_graph(fused, feeds).at("out"), want), 1e-6);
      const Graph imported = import_onnx_bytes(export_onnx_bytes(fused), "fused");
      EXPECT_LE(relative_l2(run_graph(imported, feeds).at("out"), want), 1e-6);
    }
  }
}

// Not fused: a conv output read twice or a graph output; an add that broadcasts; an add of
// y with itself.
TEST(FuseConvEpilogues, LeavesWhatCannotFuse) {
  Graph g("net");
  const ValueId x = g.add_input("x", DType::f32, {1, 2, 4, 4});
  const ValueId per_channel = g.add_input("c", DType::f32, {1, 2, 1, 1});
  auto conv = [&](const std::string& name, ValueId in, uint64_t seed) {
    return g.add_node(
        OpKind::conv, ConvAttrs{},
        {in, g.add_constant(name + ".w", random_tensor(DType::f32, {2, 2, 1, 1}, seed))}, name)[0];
  };
  const ValueId y1 = conv("c1", x, 1);
  const ValueId r1 = g.add_node(OpKind::relu, {}, {y1}, "r1")[0];
  const ValueId a1 = g.add_node(OpKind::add, {}, {y1, r1}, "a1")[0];  // y1 read twice
  const ValueId y2 = conv("c2", a1, 2);
  const ValueId a2 = g.add_node(OpKind::add, {}, {y2, per_channel}, "a2")[0];  // broadcasts
  const ValueId y3 = conv("c3", a2, 3);
  const ValueId a3 = g.add_node(OpKind::add, {}, {y3, y3}, "a3")[0];  // y + y
  const ValueId y4 = conv("c4", a3, 4);
  g.mark_output(y4);  // a graph output
  g.add_node(OpKind::relu, {}, {y4}, "r4");
  Graph fused = g;
  EXPECT_EQ(fuse_conv_epilogues(fused), 0u);
}

// The pipeline on ResNet-18: every conv is a group (20: conv + folded bn, 17 with a relu, 8
// with the block end's residual add); the summary line counts fused and unfused ops, which
// add up to the model's ops; the logits match the model's; the Graphviz file names groups.
TEST(PrepareInferenceGraph, Resnet18GroupsReportAndValues) {
  const Graph model = resnet18();
  PipelineLog pipeline_log;
  const Graph g = prepare_graph(model, {.kind = PipelineKind::inference, .log = &pipeline_log});
  const FusionLog& log = pipeline_log.fusion;
  EXPECT_EQ(count_ops(g, OpKind::batch_norm), 0);
  EXPECT_EQ(count_ops(g, OpKind::relu), 0);
  EXPECT_EQ(count_ops(g, OpKind::add), 0);
  int with_residual = 0, with_activation = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::conv) continue;
    const auto& a = std::get<ConvAttrs>(n.attrs);
    with_residual += n.inputs.size() > 3 && n.inputs[3] != kNoValue;
    with_activation += bool(a.activation) || bool(a.residual_activation);
  }
  EXPECT_EQ(with_residual, 8);
  EXPECT_EQ(with_activation, 17);
  EXPECT_EQ(log.groups().size(), 20u);
  size_t fused_ops = 0;
  for (const FusionGroup& group : log.groups()) fused_ops += group.ops.size();
  EXPECT_EQ(fused_ops, 20u + 20u + 17u + 8u);
  const std::string report = describe_fusion(g, log, cuda::describe_lowering);
  const size_t unfused = g.nodes().size() - 20;
  EXPECT_NE(
      report.find(cat("fusion: 20 groups, ", fused_ops, " fused ops, ", unfused, " unfused ops")),
      std::string::npos)
      << report;
  EXPECT_EQ(fused_ops + unfused, model.nodes().size());
  EXPECT_NE(report.find("cuDNN graph conv_fprop+bias+residual+relu"), std::string::npos) << report;
  EXPECT_NE(report.find("(folded)"), std::string::npos);
  const std::string dot = fusion_dot(g, log, cuda::describe_lowering);
  EXPECT_EQ(dot.rfind("digraph", 0), 0u);
  EXPECT_NE(dot.find("fillcolor"), std::string::npos);

  const Tensor x = random_tensor(DType::f32, {2, 3, 32, 32}, 12);
  EXPECT_LE(relative_l2(logits(g, x), logits(model, x)), 1e-5);

  // FUSEBOX_FUSION=0: nothing fused.
  PipelineLog none;
  const Graph unfused_graph = prepare_graph(
      model,
      {.kind = PipelineKind::inference, .fusion = InferenceFusionOptions::none(), .log = &none});
  EXPECT_EQ(unfused_graph.nodes().size(), model.nodes().size());
  EXPECT_TRUE(none.fusion.groups().empty());
}

TEST(FusedConv, ShapeInferenceChecksTheEpilogue) {
  Graph g("bad");
  const ValueId x = g.add_input("x", DType::f32, {1, 2, 4, 4});
  const ValueId w = g.add_input("w", DType::f32, {3, 2, 1, 1});
  const ValueId z_bad = g.add_input("z", DType::f32, {1, 2, 4, 4});
  ConvAttrs post_only;
  post_only.residual_activation.kind = Activation::relu;
  EXPECT_THROW(g.add_node(OpKind::conv, post_only, {x, w}, "no_residual"), Error);
  EXPECT_THROW(g.add_node(OpKind::conv, ConvAttrs{}, {x, w, kNoValue, z_bad}, "residual_shape"),
               Error);
  ConvAttrs clip;
  clip.activation = {Activation::clip, 1.0, -1.0};
  EXPECT_THROW(g.add_node(OpKind::conv, clip, {x, w}, "clip_order"), Error);
  ConvBackwardDataAttrs dgrad;
  dgrad.conv.activation.kind = Activation::relu;
  dgrad.input_spatial = {4, 4};
  const ValueId dy = g.add_input("dy", DType::f32, {1, 3, 4, 4});
  EXPECT_THROW(g.add_node(OpKind::conv_backward_data, dgrad, {dy, w}, "dgrad_epilogue"), Error);
}

TEST(FusedConv, AutodiffRefusesWithAClearError) {
  Graph fused = prepare_graph(resnet18(), {.kind = PipelineKind::inference});
  const ValueId loss = fused.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false},
                                      {*fused.find_value("logits")}, "loss")[0];
  try {
    grad(fused, loss, {*fused.find_value("input")}, {});
    FAIL() << "autodiff through a fused conv";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused epilogue"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusebox::testing
