// The graph rewrite behind the step and eval graphs, and the data pieces.
#include <filesystem>

#include "fusebox/io/tensor_file.h"
#include "train/graph_rewrite.h"
#include "train_test_util.h"

namespace fusebox::testing {
namespace {

using train::BatchNormForm;
using train::rewrite_graph;

TEST(GraphRewrite, ConstantsBecomeInputsAndEverythingElseKeepsItsName) {
  Graph model = small_cnn(2, 8);
  auto rw = rewrite_graph(model, {.constants_to_inputs = {"conv1.weight", "fc.bias"}});
  const Graph& g = rw.graph;
  g.verify();
  ASSERT_EQ(g.inputs().size(), 3u);
  EXPECT_EQ(g.value(g.inputs()[0]).name, "input");
  EXPECT_EQ(g.value(g.inputs()[1]).name, "conv1.weight");  // value-id order
  EXPECT_EQ(g.value(g.inputs()[2]).name, "fc.bias");
  EXPECT_EQ(g.constants().size(), model.constants().size() - 2);
  ASSERT_EQ(g.nodes().size(), model.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) EXPECT_EQ(g.nodes()[i].name, model.nodes()[i].name);
  for (const Value& v : model.values()) {
    ValueId m = rw.value_map[size_t(v.id)];
    ASSERT_NE(m, kNoValue) << v.name;
    EXPECT_EQ(g.value(m).name, v.name);
    EXPECT_EQ(g.value(m).type, v.type);
  }
  // Same function: feed the constants that became inputs.
  NamedTensors feeds = {{"input", random_tensor(DType::f32, {2, 3, 8, 8}, 1)},
                        {"conv1.weight", *model.constant(*model.find_value("conv1.weight"))},
                        {"fc.bias", *model.constant(*model.find_value("fc.bias"))}};
  NamedTensors model_feeds = {{"input", feeds.at("input")}};
  EXPECT_TRUE(
      same_bits(run_graph(g, feeds).at("logits"), run_graph(model, model_feeds).at("logits")));
}

TEST(GraphRewrite, BatchNormFormsSwitchBothWays) {
  Graph inference = build_zoo_model("small_cnn", {.batch = 2, .image_size = 8, .num_classes = 10});
  auto to_training = rewrite_graph(inference, {.batch_norm = BatchNormForm::training});
  int bns = 0;
  for (const Node& n : to_training.graph.nodes()) {
    if (n.op != OpKind::batch_norm) continue;
    ++bns;
    EXPECT_TRUE(std::get<BatchNormAttrs>(n.attrs).training);
    ASSERT_EQ(n.outputs.size(), 5u);
    EXPECT_EQ(to_training.graph.value(n.outputs[1]).name, n.name + ":running_mean");
  }
  EXPECT_EQ(bns, 2);

  auto back = rewrite_graph(to_training.graph, {.batch_norm = BatchNormForm::inference});
  NamedTensors feeds = {{"input", random_tensor(DType::f32, {2, 3, 8, 8}, 2)}};
  EXPECT_TRUE(same_bits(run_graph(back.graph, feeds).at("logits"),
                        run_graph(inference, feeds).at("logits")));
  const Node& bn = *std::find_if(to_training.graph.nodes().begin(), to_training.graph.nodes().end(),
                                 [](const Node& n) { return n.op == OpKind::batch_norm; });
  EXPECT_EQ(back.value_map[size_t(bn.outputs[1])], kNoValue);

  // Synchronized training sets sync on each (training) batch norm; inference clears it.
  auto synced = rewrite_graph(inference, {.batch_norm = BatchNormForm::synchronized_training});
  auto unsynced = rewrite_graph(synced.graph, {.batch_norm = BatchNormForm::inference});
  for (const auto* g : {&synced.graph, &unsynced.graph, &to_training.graph}) {
    for (const Node& n : g->nodes()) {
      if (n.op != OpKind::batch_norm) continue;
      const auto& a = std::get<BatchNormAttrs>(n.attrs);
      EXPECT_EQ(a.sync, g == &synced.graph) << n.name;
      EXPECT_EQ(a.training, g != &unsynced.graph) << n.name;
    }
  }
}

TEST(GraphRewrite, ReadingARemovedTrainingOutputIsAnError) {
  Graph g = small_cnn(2, 8);
  const Node& bn = *std::find_if(g.nodes().begin(), g.nodes().end(),
                                 [](const Node& n) { return n.op == OpKind::batch_norm; });
  g.mark_output(bn.outputs[1]);
  try {
    rewrite_graph(g, {.batch_norm = BatchNormForm::inference});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bn1:1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rewrite_graph(g, {.constants_to_inputs = {"input"}}), Error);  // not a constant
  EXPECT_THROW(rewrite_graph(g, {.constants_to_inputs = {"nothing"}}), Error);
}

TEST(TrainData, SyntheticSetIsDeterministicBalancedAndSeeded) {
  Dataset a = synthetic_dataset(20, 3, 8, 10, 1), b = synthetic_dataset(20, 3, 8, 10, 1);
  EXPECT_TRUE(same_bits(a.x, b.x));
  EXPECT_TRUE(same_bits(a.y, b.y));
  EXPECT_EQ(a.x.shape(), (Shape{20, 3, 8, 8}));
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(a.y.get(i), double(i % 10));
  EXPECT_FALSE(same_bits(a.x, synthetic_dataset(20, 3, 8, 10, 2).x));
  for (double v : a.x.to_doubles()) ASSERT_LE(std::abs(v), 1.3);
  // Two images of one class are closer to each other than to another class's.
  auto dist = [&](int64_t i, int64_t j) {
    double d = 0;
    for (int64_t k = 0; k < 192; ++k) d += std::pow(a.x.get(i * 192 + k) - a.x.get(j * 192 + k), 2);
    return d;
  };
  EXPECT_LT(dist(0, 10), dist(0, 1));
  EXPECT_THROW(synthetic_dataset(0, 3, 8, 10, 1), Error);
}

TEST(TrainData, BatchesWrapAroundAndShuffleDeterministically) {
  Dataset data = synthetic_dataset(5, 1, 4, 5, 0);  // label i == sample i
  BatchSampler in_order(data, 3, false, 0);
  auto labels = [](const Tensor& y) { return y.to_doubles(); };
  EXPECT_EQ(labels(in_order.batch(0).second), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(labels(in_order.batch(1).second), (std::vector<double>{3, 4, 0}));  // wraps
  EXPECT_EQ(labels(in_order.batch(2).second), (std::vector<double>{1, 2, 3}));
  // The wrapped image is sample 0's.
  const Tensor images = in_order.batch(1).first;
  for (int64_t k = 0; k < 16; ++k) ASSERT_EQ(images.get(2 * 16 + k), data.x.get(k));

  BatchSampler shuffled(data, 5, true, 7), again(data, 5, true, 7);
  std::vector<double> epoch0 = labels(shuffled.batch(0).second);
  std::vector<double> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<double>{0, 1, 2, 3, 4}));  // a permutation
  EXPECT_EQ(labels(again.batch(3).second), labels(shuffled.batch(3).second));
  EXPECT_EQ(labels(again.batch(0).second), epoch0);  // random access, any order
  bool differs = false;
  for (int e = 1; e < 6; ++e) differs = differs || labels(shuffled.batch(e).second) != epoch0;
  EXPECT_TRUE(differs) << "every epoch has the same order";
}

TEST(TrainData, LoadAndCheckNameTheProblem) {
  const std::string dir = ::testing::TempDir() + cat("fusebox_data_", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/d.npz";
  auto expect_error = [&](const std::map<std::string, Tensor>& arrays, const std::string& needle) {
    write_npz(file, arrays);
    try {
      load_dataset(file);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    }
  };
  Tensor x = random_tensor(DType::f32, {4, 3, 8, 8}, 1);
  Tensor y = Tensor::from_vector<int32_t>({4}, {0, 1, 2, 3});
  expect_error({{"x", x}}, "'y'");
  expect_error({{"y", y}}, "'x'");
  expect_error({{"x", x.reshaped({4, 192})}, {"y", y}},
               "'x' must be float [N, C, H, W] or integer token ids [N, T]");
  expect_error({{"x", x}, {"y", x}}, "'y' must be integer [N]");
  expect_error({{"x", x}, {"y", Tensor::zeros(DType::i64, {3})}}, "4 samples but 'y' 3");

  write_npz(file, {{"x", x.cast(DType::f64)}, {"y", y}});
  Dataset d = load_dataset(file);
  EXPECT_EQ(d.x.dtype(), DType::f32);
  EXPECT_EQ(d.y.dtype(), DType::i64);
  check_dataset(d, {3, 8, 8}, {}, 4, "data");
  EXPECT_THROW(check_dataset(d, {3, 16, 16}, {}, 4, "data"), Error);
  EXPECT_THROW(check_dataset(d, {3, 8, 8}, {8, 8}, 4, "data"), Error);  // per-pixel labels
  try {
    check_dataset(d, {3, 8, 8}, {}, 3, "data");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 3 at index 3"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fusebox::testing
