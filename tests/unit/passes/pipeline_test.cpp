// The compile pipelines (passes/pipeline.h): their orders by name, the log of a run, the
// verifier naming the pass that broke a graph, FUSEBOX_VERIFY_PASSES, and
// Executable::compile running the inference pipeline (fewer nodes, the same numbers).
#include <string>
#include <vector>

#include "fusebox/passes/pipeline.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/zoo.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

std::vector<std::string> names(const Pipeline& p) {
  std::vector<std::string> out;
  for (const Pass& pass : p.passes) out.push_back(pass.name);
  return out;
}

using Names = std::vector<std::string>;

TEST(Pipeline, InferenceOrder) {
  EXPECT_EQ(
      names(inference_pipeline(Precision::bf16)),
      (Names{"remove_identity_ops", "recognize_gelu", "fold_batch_norms", "form_linears",
             "mixed_precision", "fuse_conv_epilogues", "fuse_gemm_epilogues", "fuse_attention",
             "fuse_batch_norm_residual", "fuse_batch_norm_relu", "hoist_narrowing_casts",
             "fold_norm_casts", "fold_product_casts", "fuse_pointwise_chains"}));
  EXPECT_EQ(inference_pipeline(Precision::f32).name, "inference");
}

// The switches leave their passes out; mixed precision always runs (FUSEBOX_FUSION=0).
TEST(Pipeline, InferenceSwitchesLeaveTheirPassesOut) {
  EXPECT_EQ(names(inference_pipeline(Precision::f32, InferenceFusionOptions::none())),
            (Names{"mixed_precision"}));
  EXPECT_EQ(names(inference_pipeline(Precision::f32, {.conv_epilogue = false})),
            (Names{"remove_identity_ops", "recognize_gelu", "fold_batch_norms", "mixed_precision",
                   "fuse_attention", "fuse_batch_norm_residual", "fuse_batch_norm_relu",
                   "hoist_narrowing_casts", "fold_norm_casts", "fold_product_casts",
                   "fuse_pointwise_chains"}));
  EXPECT_EQ(names(inference_pipeline(Precision::f32, {.batch_norm = false, .attention = false})),
            (Names{"remove_identity_ops", "recognize_gelu", "fold_batch_norms", "form_linears",
                   "mixed_precision", "fuse_conv_epilogues", "fuse_gemm_epilogues",
                   "hoist_narrowing_casts", "fold_norm_casts", "fold_product_casts",
                   "fuse_pointwise_chains"}));
  EXPECT_EQ(
      names(inference_pipeline(Precision::f32, {.norm_casts = false, .hoist_casts = false})).size(),
      12u);
  EXPECT_EQ(names(inference_pipeline(Precision::f32, {.gelu = false}))[1], "fold_batch_norms");
}

TEST(Pipeline, TrainingForwardAndEvaluationOrders) {
  EXPECT_EQ(names(training_forward_pipeline(Precision::bf16)),
            (Names{"remove_identity_ops", "recognize_gelu", "form_linears", "fold_gemm_transposes",
                   "pad_product_columns", "mixed_precision", "fuse_batch_norm_residual",
                   "fuse_batch_norm_relu", "fuse_attention (training)", "fold_cross_entropy"}));
  EXPECT_EQ(names(evaluation_pipeline(Precision::bf16)),
            (Names{"remove_identity_ops", "recognize_gelu", "mixed_precision",
                   "fuse_batch_norm_residual", "fuse_batch_norm_relu", "fuse_attention"}));
}

// The log: every pass in order, with its count and the node counts around it; the fusion
// groups as the FusionLog records them.
TEST(Pipeline, LogRecordsEachPassAndTheGroups) {
  const Graph model =
      build_zoo_model("resnet18", {.batch = 1, .image_size = 32, .num_classes = 10, .seed = 7});
  PipelineLog log;
  const Graph g = prepare_graph(model, {.kind = PipelineKind::inference, .log = &log});
  ASSERT_EQ(log.passes.size(), 14u);
  EXPECT_EQ(log.passes[0].pass, "remove_identity_ops");
  EXPECT_EQ(log.passes[0].rewrites, 0u);  // the zoo's ResNet has none
  EXPECT_EQ(log.passes[1].pass, "recognize_gelu");
  EXPECT_EQ(log.passes[1].rewrites, 0u);  // nor a GELU
  EXPECT_EQ(log.passes[2].pass, "fold_batch_norms");
  EXPECT_EQ(log.passes[2].rewrites, 20u);  // every conv's batch norm
  EXPECT_EQ(log.passes[2].nodes_before, model.nodes().size());
  EXPECT_EQ(log.passes[2].nodes_after, model.nodes().size() - 20);
  for (size_t i = 1; i < log.passes.size(); ++i)
    EXPECT_EQ(log.passes[i].nodes_before, log.passes[i - 1].nodes_after) << log.passes[i].pass;
  EXPECT_EQ(log.passes.back().nodes_after, g.nodes().size());
  EXPECT_EQ(log.passes[5].pass, "fuse_conv_epilogues");
  EXPECT_EQ(log.passes[5].rewrites, 17u);  // the convs followed by a relu or a residual add
  EXPECT_EQ(log.fusion.groups().size(), 20u);
}

TEST(Pipeline, NoneIsTheGraphAsGiven) {
  const Graph model =
      build_zoo_model("small_cnn", {.batch = 1, .image_size = 16, .num_classes = 4, .seed = 1});
  PipelineLog log;
  const Graph g = prepare_graph(model, {.log = &log});
  EXPECT_EQ(g.dump(), model.dump());
  EXPECT_TRUE(log.passes.empty());
}

// x -> relu -> y, the output named "y".
Graph relu_graph() {
  Graph g("relu_graph");
  const ValueId x = g.add_input("x", DType::f32, {2, 3});
  g.mark_output(g.add_node(OpKind::relu, {}, {x}, "relu", {"y"})[0]);
  return g;
}

// A pass that breaks the graph's contract with its caller: the output becomes f16.
Pass output_to_f16() {
  return {"output_to_f16", [](Graph& g, FusionLog*) {
            Graph out(g.name());
            const ValueId x = out.add_input("x", DType::f32, {2, 3});
            const ValueId r = out.add_node(OpKind::relu, {}, {x}, "relu")[0];
            out.mark_output(
                out.add_node(OpKind::cast, CastAttrs{.to = DType::f16}, {r}, "cast", {"y"})[0]);
            g = std::move(out);
            return size_t(1);
          }};
}

// A pass that loses the graph's input (x becomes a constant).
Pass input_to_constant() {
  return {"input_to_constant", [](Graph& g, FusionLog*) {
            Graph out(g.name());
            const ValueId x = out.add_constant("x", Tensor::zeros(DType::f32, {2, 3}));
            out.mark_output(out.add_node(OpKind::relu, {}, {x}, "relu", {"y"})[0]);
            g = std::move(out);
            return size_t(1);
          }};
}

Pass harmless(const std::string& name) {
  return {name, [](Graph&, FusionLog*) { return size_t(0); }};
}

std::string error_of(const Pipeline& p, bool verify) {
  Graph g = relu_graph();
  try {
    run_pipeline(p, g, nullptr, verify);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineVerifier, NamesThePassThatChangedTheOutputs) {
  const std::string e =
      error_of({"test", {harmless("first"), output_to_f16(), harmless("last")}}, true);
  EXPECT_NE(e.find("pass output_to_f16 changed the graph's outputs"), std::string::npos) << e;
  EXPECT_NE(e.find("y f32[2, 3]"), std::string::npos) << e;
  EXPECT_NE(e.find("y f16[2, 3]"), std::string::npos) << e;
  EXPECT_NE(e.find("pipeline test"), std::string::npos) << e;
  EXPECT_EQ(e.find("first"), std::string::npos) << e;
}

TEST(PipelineVerifier, NamesThePassThatLostAnInput) {
  const std::string e = error_of({"test", {harmless("first"), input_to_constant()}}, true);
  EXPECT_NE(e.find("pass input_to_constant changed the graph's inputs"), std::string::npos) << e;
}

// Without verification after each pass the pipeline's result is still checked once, but the
// error cannot say which pass broke it.
TEST(PipelineVerifier, WithoutItTheResultIsStillChecked) {
  const std::string e =
      error_of({"test", {harmless("first"), output_to_f16(), harmless("last")}}, false);
  EXPECT_NE(e.find("changed the graph's outputs"), std::string::npos) << e;
  EXPECT_EQ(e.find("output_to_f16"), std::string::npos) << e;
  EXPECT_NE(e.find("FUSEBOX_VERIFY_PASSES=1"), std::string::npos) << e;
}

TEST(PipelineVerifier, VerifyPassesSetting) {
#ifdef NDEBUG
  {
    ScopedEnv unset("FUSEBOX_VERIFY_PASSES", std::nullopt);
    EXPECT_FALSE(verify_passes_by_default());
  }
#endif
  {
    ScopedEnv on("FUSEBOX_VERIFY_PASSES", "1");
    EXPECT_TRUE(verify_passes_by_default());
    // prepare_graph verifies after each pass: the inference pipeline passes its own check.
    const Graph model =
        build_zoo_model("small_cnn", {.batch = 1, .image_size = 16, .num_classes = 4, .seed = 1});
    EXPECT_NO_THROW(prepare_graph(model, {.kind = PipelineKind::inference}));
  }
  {
    ScopedEnv bad("FUSEBOX_VERIFY_PASSES", "yes");
    try {
      verify_passes_by_default();
      FAIL() << "FUSEBOX_VERIFY_PASSES=yes accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FUSEBOX_VERIFY_PASSES='yes'"), std::string::npos)
          << e.what();
    }
  }
}

// conv + bias -> relu through Executable::compile on the CPU: with the inference pipeline
// it runs as one node (the conv with its relu epilogue), computing the same numbers.
TEST(ExecutableCompile, InferencePipelineFusesAndComputesTheSame) {
  Graph g("conv_relu");
  const ValueId x = g.add_input("x", DType::f32, {2, 3, 8, 8});
  const ValueId w = g.add_constant("w", random_tensor(DType::f32, {4, 3, 3, 3}, 1));
  const ValueId b = g.add_constant("b", random_tensor(DType::f32, {4}, 2));
  const ValueId y = g.add_node(OpKind::conv, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}},
                               {x, w, b}, "conv")[0];
  g.mark_output(g.add_node(OpKind::relu, {}, {y}, "relu", {"out"})[0]);
  const NamedTensors feeds = {{"x", random_tensor(DType::f32, {2, 3, 8, 8}, 3)}};

  auto plain = Executable::compile(g, {.device = Device::cpu});
  EXPECT_EQ(plain->graph().nodes().size(), 2u);
  PipelineLog log;
  auto fused = Executable::compile(
      g, {.device = Device::cpu, .pipeline = {.kind = PipelineKind::inference, .log = &log}});
  ASSERT_EQ(fused->graph().nodes().size(), 1u);
  EXPECT_EQ(fused->stats().nodes, 1u);
  const Node& conv = fused->graph().nodes()[0];
  EXPECT_EQ(conv.op, OpKind::conv);
  EXPECT_EQ(std::get<ConvAttrs>(conv.attrs).activation.kind, Activation::relu);
  ASSERT_EQ(log.fusion.groups().size(), 1u);
  EXPECT_EQ(log.fusion.groups()[0].ops, (Names{"conv 'conv'", "relu 'relu'"}));
  EXPECT_TRUE(all_close(fused->run(feeds).at("out"), plain->run(feeds).at("out"), 1e-6, 1e-6));

  // The switches off (FUSEBOX_FUSION=0): the model's own two nodes.
  auto unfused = Executable::compile(
      g, {.device = Device::cpu,
          .pipeline = {.kind = PipelineKind::inference, .fusion = InferenceFusionOptions::none()}});
  EXPECT_EQ(unfused->graph().nodes().size(), 2u);
}

}  // namespace
}  // namespace fusebox::testing
