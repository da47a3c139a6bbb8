// The graph rewrite behind the step and eval graphs, and the data pieces.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "fusebox/io/tensor_file.h"
#include "io/zip.h"
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
               "'x' must be float or uint8 images [N, C, H, W] or integer token ids [N, T]");
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

// A .npy of numpy's '|u1' (uint8) or '<i8' array `values` of `shape`, as numpy writes it.
std::string npy_bytes(const char* descr, const Shape& shape, const std::vector<int64_t>& values) {
  std::string dims;
  for (int64_t d : shape) dims += cat(d, ", ");
  std::string header =
      cat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(1), out += char(0);
  out += char(header.size() & 0xff), out += char(header.size() >> 8);
  out += header;
  for (int64_t v : values) {
    if (std::string(descr) == "|u1") {
      out += char(uint8_t(v));
    } else {
      for (int b = 0; b < 8; ++b) out += char(uint8_t(uint64_t(v) >> (8 * b)));
    }
  }
  return out;
}

// uint8 images from numpy (read as i32), channels-last with --layout nhwc, normalised as an
// image folder's; values outside 0..255, NaN images and channels-last arrays read as nchw are
// errors that say so.
TEST(TrainData, ByteImagesChannelsLastAndNonFiniteImages) {
  const std::string dir = ::testing::TempDir() + cat("fusebox_data_u8_", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/d.npz";
  // 2 images of 1 x 2 pixels, RGB, channels-last: [2, 1, 2, 3].
  const std::vector<int64_t> pixels = {0, 128, 255, 10, 20, 30, 255, 255, 255, 1, 2, 3};
  auto write_set = [&](const std::vector<int64_t>& values) {
    const std::string x = npy_bytes("|u1", {2, 1, 2, 3}, values), y = npy_bytes("<i8", {2}, {1, 0});
    std::ofstream(file, std::ios::binary) << io::write_zip({{"x.npy", x}, {"y.npy", y}}, {});
  };
  write_set(pixels);
  const Dataset d = load_dataset(file, ImageLayout::nhwc);
  ASSERT_EQ(d.x.shape(), (Shape{2, 3, 1, 2}));
  const std::span<const float> x = d.x.values<float>();
  const double mean[3] = {0.485, 0.456, 0.406}, sd[3] = {0.229, 0.224, 0.225};
  for (int s = 0; s < 2; ++s)
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < 2; ++p)
        EXPECT_NEAR(x[size_t((s * 3 + c) * 2 + p)],
                    (double(pixels[size_t((s * 2 + p) * 3 + c)]) / 255 - mean[c]) / sd[c], 1e-5)
            << s << " " << c << " " << p;
  EXPECT_EQ(d.y.values<int64_t>()[0], 1);
  // Read as nchw, the same bytes are samples [1, 2, 3]: for a model of [3, 1, 2] the check
  // suggests the layout; for one of another size it only says what differs.
  const Dataset as_nchw = load_dataset(file);
  const std::string hint = error_message([&] { check_dataset(as_nchw, {3, 1, 2}, {}, 2, "data"); });
  EXPECT_NE(hint.find("give --layout nhwc"), std::string::npos) << hint;
  const std::string other = error_message([&] {
    check_dataset(as_nchw, {3, 4, 4}, {}, 2, "data");
  });
  EXPECT_NE(other.find("but the model takes [3, 4, 4]"), std::string::npos) << other;
  EXPECT_EQ(other.find("--layout"), std::string::npos) << other;
  // Integer images of a wider type (int32 here) must hold bytes too.
  Tensor wide = Tensor::from_vector<int32_t>({1, 1, 1, 3}, {7, 300, 9});
  write_npz(file, {{"x", wide}, {"y", Tensor::from_vector<int64_t>({1}, {0})}});
  const std::string big = error_message([&] { load_dataset(file, ImageLayout::nhwc); });
  EXPECT_NE(big.find("holds 300 in sample 0"), std::string::npos) << big;
  Tensor f = random_tensor(DType::f32, {3, 3, 4, 4}, 5);
  f.data<float>()[3 * 16 + 5] = NAN;  // sample 1
  write_npz(file, {{"x", f}, {"y", Tensor::from_vector<int64_t>({3}, {0, 1, 2})}});
  const std::string nan = error_message([&] { load_dataset(file); });
  EXPECT_NE(nan.find("a NaN in sample 1"), std::string::npos) << nan;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fusebox::testing
