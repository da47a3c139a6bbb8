// The fusion pass (passes/fusion.h): which batch_norm -> relu pairs fuse_batch_norm_relu
// fuses (ResNet-18's, counted independently here; not a batch norm whose output has other
// readers or is a graph output), that names stay, that the fused graph computes the
// unfused graph's bits on the CPU (forward, both batch-norm forms; gradients through
// autodiff), and that the ONNX export writes the relu back as its own node.
#include <set>
#include <string>

#include "bit_identical.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/zoo.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// The relu output names of the pairs the pass should fuse, found without it: a batch_norm
// whose output 0 has one reader, a relu, and is not a graph output.
std::set<std::string> fusable_relu_outputs(const Graph& g) {
  std::set<std::string> names;
  const std::set<ValueId> outputs(g.outputs().begin(), g.outputs().end());
  for (const Node& bn : g.nodes()) {
    if (bn.op != OpKind::batch_norm || outputs.count(bn.outputs[0])) continue;
    std::vector<const Node*> readers;
    for (const Node& n : g.nodes())
      for (ValueId v : n.inputs)
        if (v == bn.outputs[0]) readers.push_back(&n);
    if (readers.size() == 1 && readers[0]->op == OpKind::relu)
      names.insert(g.value(readers[0]->outputs[0]).name);
  }
  return names;
}

std::set<std::string> fused_outputs(const Graph& g) {
  std::set<std::string> names;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::batch_norm && std::get<BatchNormAttrs>(n.attrs).relu)
      names.insert(g.value(n.outputs[0]).name);
  return names;
}

// The gradients of sum(logits) with respect to `wrt` (by name): autodiff appends the backward
// pass to g, which then runs on the CPU with `input`.
NamedTensors sum_of_logits_gradients(Graph& g, const std::vector<std::string>& wrt_names,
                                     const Tensor& input) {
  std::vector<ValueId> wrt;
  for (const std::string& name : wrt_names) wrt.push_back(*g.find_value(name));
  const ValueId loss = g.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false},
                                  {*g.find_value("logits")}, "loss")[0];
  grad(g, loss, wrt, {.mark_outputs = true});
  return run_graph(g, {{"input", input}});
}

Graph resnet18(bool training) {
  return build_zoo_model(
      "resnet18",
      {.batch = 2, .image_size = 32, .num_classes = 10, .seed = 7, .training = training});
}

// ResNet-18: the stem's bn1 -> relu and each basic block's bn1 -> relu (8 blocks) fuse;
// bn2 and the downsample batch norms feed the residual add and keep their relu.
TEST(FuseBatchNormRelu, FusesResnet18PairsAndKeepsNames) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "inference");
    const Graph model = resnet18(training);
    const std::set<std::string> want = fusable_relu_outputs(model);
    EXPECT_EQ(want.size(), 9u);
    Graph fused = model;
    EXPECT_EQ(fuse_batch_norm_relu(fused), want.size());
    EXPECT_NO_THROW(fused.verify());
    EXPECT_EQ(fused_outputs(fused), want);
    EXPECT_EQ(count_ops(fused, OpKind::relu), count_ops(model, OpKind::relu) - int(want.size()));
    EXPECT_EQ(count_ops(fused, OpKind::batch_norm), count_ops(model, OpKind::batch_norm));
    EXPECT_EQ(fused.nodes().size(), model.nodes().size() - want.size());
    // Inputs, constants, outputs and every other node keep their names.
    ASSERT_EQ(fused.inputs().size(), model.inputs().size());
    EXPECT_EQ(fused.value(fused.inputs()[0]).name, model.value(model.inputs()[0]).name);
    EXPECT_EQ(fused.constants().size(), model.constants().size());
    ASSERT_EQ(fused.outputs().size(), 1u);
    EXPECT_EQ(fused.value(fused.outputs()[0]).name, "logits");
    std::set<std::string> node_names;
    for (const Node& n : fused.nodes()) node_names.insert(n.name);
    for (const Node& n : model.nodes()) {
      const bool gone = n.op == OpKind::relu && want.count(model.value(n.outputs[0]).name);
      EXPECT_EQ(node_names.count(n.name), gone ? 0u : 1u) << n.name;
    }
    EXPECT_NE(fused.dump().find("relu=1"), std::string::npos);
    // Nothing is left to fuse.
    Graph again = fused;
    EXPECT_EQ(fuse_batch_norm_relu(again), 0u);
    EXPECT_EQ(again.nodes().size(), fused.nodes().size());

    // The same bits on the CPU.
    const NamedTensors feeds = {{"input", random_tensor(DType::f32, {2, 3, 32, 32}, 11)}};
    EXPECT_TRUE(
        bit_identical(run_graph(fused, feeds).at("logits"), run_graph(model, feeds).at("logits")));
  }
}

// A small graph with one pair of each kind: only the plain pair fuses.
TEST(FuseBatchNormRelu, LeavesBatchNormsWhoseOutputIsReadElsewhereOrIsAnOutput) {
  Graph g("net");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 3, 4, 4});
  auto param = [&](const std::string& name, uint64_t seed, double lo, double hi) {
    return g.add_constant(name, random_tensor(DType::f32, {3}, seed, lo, hi));
  };
  auto bn = [&](const std::string& name, ValueId in, uint64_t seed) {
    return b.name(name).batch_norm_training(
        in, param(name + ".w", seed, 0.5, 1.5), param(name + ".b", seed + 1, -1, 1),
        param(name + ".m", seed + 2, -1, 1), param(name + ".v", seed + 3, 0.5, 2))[0];
  };
  // Read by a relu and an add: not fused.
  const ValueId a = bn("bn_shared", x, 10);
  const ValueId a_relu = b.name("relu_shared").relu(a);
  const ValueId a_sum = b.name("add").add(a, a_relu);
  // A graph output: not fused.
  const ValueId o = bn("bn_output", a_sum, 20);
  const ValueId o_relu = b.name("relu_output").relu(o);
  // Read by two relus: not fused.
  const ValueId t = bn("bn_twice", o_relu, 30);
  const ValueId t1 = b.name("relu_t1").relu(t), t2 = b.name("relu_t2").relu(t);
  // The plain pair: fused.
  const ValueId p = bn("bn_plain", b.name("sum2").add(t1, t2), 40);
  const ValueId p_relu = b.name("relu_plain").relu(p);
  g.rename_value(p_relu, "features");
  g.mark_output(o);
  g.mark_output(p_relu);

  Graph fused = g;
  EXPECT_EQ(fuse_batch_norm_relu(fused), 1u);
  EXPECT_EQ(fused_outputs(fused), std::set<std::string>{"features"});
  EXPECT_EQ(count_ops(fused, OpKind::relu), 4);
  for (const Node& n : fused.nodes()) EXPECT_NE(n.name, "relu_plain");
  ASSERT_EQ(fused.outputs().size(), 2u);
  EXPECT_EQ(fused.value(fused.outputs()[0]).name, g.value(o).name);
  EXPECT_EQ(fused.value(fused.outputs()[1]).name, "features");

  const NamedTensors feeds = {{"x", random_tensor(DType::f32, {2, 3, 4, 4}, 50, -2, 2)}};
  const NamedTensors want = run_graph(g, feeds), got = run_graph(fused, feeds);
  for (const auto& [name, t] : want) EXPECT_TRUE(bit_identical(got.at(name), t)) << name;
}

// Gradients: autodiff of the fused graph (batch_norm_backward given y and the bias) gives the
// unfused graph's bits on the CPU, in both forms (the inference form through plain ops).
TEST(FuseBatchNormRelu, GradientsMatchTheUnfusedGraph) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "inference");
    Graph model = build_zoo_model(
        "small_cnn",
        {.batch = 2, .image_size = 8, .num_classes = 10, .seed = 3, .training = training});
    Graph fused = model;
    ASSERT_EQ(fuse_batch_norm_relu(fused), 2u);
    auto gradients = [](Graph& g) {
      return sum_of_logits_gradients(g, {"input", "conv1.weight", "bn1.weight", "bn2.bias"},
                                     random_tensor(DType::f32, {2, 3, 8, 8}, 21));
    };
    const NamedTensors want = gradients(model), got = gradients(fused);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) EXPECT_TRUE(bit_identical(got.at(name), t)) << name;
    if (training) {
      int masked = 0;  // batch_norm_backward nodes given y and the forward's bias
      for (const Node& n : fused.nodes())
        masked += n.op == OpKind::batch_norm_backward && n.inputs.size() == 7;
      EXPECT_EQ(masked, 2);
    }
    EXPECT_EQ(count_ops(fused, OpKind::relu), 0);
  }
}

// ONNX has no fused form: BatchNormalization then a Relu writing y's name, so the fused
// graph exports to what the unfused one does (up to names) and imports to the same results.
TEST(FuseBatchNormRelu, OnnxExportWritesTheReluBack) {
  Graph model = build_zoo_model("small_cnn", {.batch = 2, .image_size = 8, .num_classes = 10});
  Graph fused = model;
  ASSERT_EQ(fuse_batch_norm_relu(fused), 2u);
  const Graph imported = import_onnx_bytes(export_onnx_bytes(fused), "fused small_cnn");
  EXPECT_EQ(count_ops(imported, OpKind::relu), 2);
  EXPECT_EQ(count_ops(imported, OpKind::batch_norm), 2);
  for (const Node& n : imported.nodes()) {
    if (n.op == OpKind::batch_norm) {
      EXPECT_FALSE(std::get<BatchNormAttrs>(n.attrs).relu);
    }
  }
  ASSERT_TRUE(fused.find_value("relu1").has_value());
  EXPECT_TRUE(imported.find_value("relu1").has_value()) << "the relu writes y's name";
  // (ONNX stores epsilon as f32: compare with the unfused graph's own round trip.)
  const Graph unfused = import_onnx_bytes(export_onnx_bytes(model), "small_cnn");
  const NamedTensors feeds = {{"input", random_tensor(DType::f32, {2, 3, 8, 8}, 31)}};
  EXPECT_TRUE(bit_identical(run_graph(imported, feeds).at("logits"),
                            run_graph(unfused, feeds).at("logits")));
}

// fuse_batch_norm_residual on ResNet-18: each basic block's end, relu(bn2(...) + identity),
// becomes one batch norm (8 blocks; in the 3 downsampling blocks one of the two batch
// norms takes the add, the other stays plain and is the residual). Then the bn1 -> relu
// pairs still fuse. Logits and the gradients through autodiff are the unfused graph's bits;
// the ONNX export writes BatchNormalization, Add and Relu back.
TEST(FuseBatchNormResidual, FusesResnet18BlockEndsBitForBit) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "inference");
    const Graph model = resnet18(training);
    Graph fused = model;
    EXPECT_EQ(fuse_batch_norm_residual(fused), 8u);
    EXPECT_NO_THROW(fused.verify());
    EXPECT_EQ(fuse_batch_norm_relu(fused), 9u);
    EXPECT_EQ(count_ops(fused, OpKind::add), count_ops(model, OpKind::add) - 8);
    EXPECT_EQ(count_ops(fused, OpKind::relu), count_ops(model, OpKind::relu) - 17);
    EXPECT_EQ(count_ops(fused, OpKind::batch_norm), count_ops(model, OpKind::batch_norm));
    int with_residual = 0;
    for (const Node& n : fused.nodes())
      with_residual += n.op == OpKind::batch_norm && n.inputs.size() == 6;
    EXPECT_EQ(with_residual, 8);
    Graph again = fused;
    EXPECT_EQ(fuse_batch_norm_residual(again), 0u);

    auto gradients = [](Graph g) {  // a copy: the graphs are used again below
      return sum_of_logits_gradients(g,
                                     {"input", "conv1.weight", "layer1.0.bn2.weight",
                                      "layer2.0.downsample.1.bias", "layer4.1.conv2.weight"},
                                     random_tensor(DType::f32, {2, 3, 32, 32}, 41));
    };
    const NamedTensors want = gradients(model), got = gradients(fused);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) EXPECT_TRUE(bit_identical(got.at(name), t)) << name;

    if (training) continue;  // (ONNX export: the inference form)
    const Graph imported = import_onnx_bytes(export_onnx_bytes(fused), "fused resnet18");
    EXPECT_EQ(count_ops(imported, OpKind::add), count_ops(model, OpKind::add));
    const Graph unfused = import_onnx_bytes(export_onnx_bytes(model), "resnet18");
    const NamedTensors feeds = {{"input", random_tensor(DType::f32, {2, 3, 32, 32}, 42)}};
    EXPECT_TRUE(bit_identical(run_graph(imported, feeds).at("logits"),
                              run_graph(unfused, feeds).at("logits")));
  }
}

}  // namespace
}  // namespace fusebox::testing
