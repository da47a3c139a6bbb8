// The model zoo: architecture (names, shapes, strides, parameter counts), seeded
// weights, and small_cnn running on the CPU backend.
#include "fusebox/zoo.h"

#include "fusebox/frontends/onnx.h"

#include <cmath>
#include <cstring>

#include "testing.h"

namespace fusebox {
namespace {

bool is_running_stat(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".running_mean") || ends_with(".running_var");
}

// Trainable parameters as torchvision counts them: every float constant except the batch
// norms' running statistics (buffers, not parameters; a decoder's bool mask is a buffer too).
int64_t parameter_count(const Graph& g) {
  int64_t n = 0;
  for (const auto& [v, t] : g.constants())
    if (is_floating(t.dtype()) && !is_running_stat(g.value(v).name)) n += t.numel();
  return n;
}

const Node* find_node(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes())
    if (n.name == name) return &n;
  return nullptr;
}

const Tensor& constant(const Graph& g, const std::string& name) {
  auto v = g.find_value(name);
  EXPECT_TRUE(v.has_value()) << name;
  const Tensor* t = v ? g.constant(*v) : nullptr;
  EXPECT_NE(t, nullptr) << name;
  static const Tensor none;
  return t ? *t : none;
}

std::map<std::string, int> op_counts(const Graph& g) {
  std::map<std::string, int> counts;
  for (const Node& n : g.nodes()) ++counts[op_name(n.op)];
  return counts;
}

TEST(Zoo, ListsItsModels) {
  std::vector<std::string> names = zoo_models();
  EXPECT_EQ(names, (std::vector<std::string>{"resnet18", "resnet34", "resnet50", "resnet101",
                                             "small_cnn", "vit_b_16", "vit_test", "convnext_tiny",
                                             "convnext_test", "mobilenet_v3_small", "unet",
                                             "unet_test", "gpt2", "gpt2_test"}));
}

TEST(Zoo, ResNetParameterCountsMatchTorchvision) {
  const std::pair<const char*, int64_t> expected[] = {{"resnet18", 11689512},
                                                      {"resnet34", 21797672},
                                                      {"resnet50", 25557032},
                                                      {"resnet101", 44549160}};
  for (const auto& [name, count] : expected) {
    Graph g = build_zoo_model(name);
    EXPECT_EQ(parameter_count(g), count) << name;
    ASSERT_EQ(g.inputs().size(), 1u);
    ASSERT_EQ(g.outputs().size(), 1u);
    const Value& in = g.value(g.inputs()[0]);
    const Value& out = g.value(g.outputs()[0]);
    EXPECT_EQ(in.name, "input");
    EXPECT_EQ(in.type, (TensorType{DType::f32, {1, 3, 224, 224}}));
    EXPECT_EQ(out.name, "logits");
    EXPECT_EQ(out.type, (TensorType{DType::f32, {1, 1000}})) << name;
  }
}

TEST(Zoo, ResNetOpCounts) {
  auto r18 = op_counts(build_zoo_model("resnet18", {.image_size = 32}));
  EXPECT_EQ(r18["conv"], 20);
  EXPECT_EQ(r18["batch_norm"], 20);
  EXPECT_EQ(r18["relu"], 17);
  EXPECT_EQ(r18["add"], 8);
  EXPECT_EQ(r18["max_pool"], 1);
  EXPECT_EQ(r18["global_avg_pool"], 1);
  EXPECT_EQ(r18["flatten"], 1);
  EXPECT_EQ(r18["gemm"], 1);
  auto r50 = op_counts(build_zoo_model("resnet50", {.image_size = 32}));
  EXPECT_EQ(r50["conv"], 53);
  EXPECT_EQ(r50["batch_norm"], 53);
  EXPECT_EQ(r50["relu"], 49);
  EXPECT_EQ(r50["add"], 16);
}

TEST(Zoo, TorchvisionNamesAndStrides) {
  Graph g = build_zoo_model("resnet50", {.image_size = 64});
  for (const char* name : {"conv1", "bn1", "relu", "maxpool", "layer1.0.conv1", "layer1.0.bn1",
                           "layer1.0.downsample.0", "layer1.0.downsample.1", "layer3.5.conv3",
                           "layer4.2.bn3", "avgpool", "fc"})
    EXPECT_NE(find_node(g, name), nullptr) << name;
  EXPECT_EQ(find_node(g, "layer1.1.downsample.0"), nullptr);
  EXPECT_EQ(constant(g, "conv1.weight").shape(), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(constant(g, "layer1.0.downsample.0.weight").shape(), (Shape{256, 64, 1, 1}));
  EXPECT_EQ(constant(g, "layer3.5.bn3.running_var").shape(), (Shape{1024}));
  EXPECT_EQ(constant(g, "fc.weight").shape(), (Shape{1000, 2048}));
  EXPECT_EQ(constant(g, "fc.bias").shape(), (Shape{1000}));

  // v1.5: a bottleneck downsamples in its 3x3 conv, not its first 1x1.
  auto strides = [&](const std::string& node) {
    return std::get<ConvAttrs>(find_node(g, node)->attrs).strides;
  };
  EXPECT_EQ(strides("conv1"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(strides("layer2.0.conv1"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(strides("layer2.0.conv2"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(strides("layer2.0.downsample.0"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(strides("layer1.0.downsample.0"), (std::vector<int64_t>{1, 1}));

  // The classifier is a gemm against fc.weight transposed, as nn.Linear.
  const Node* fc = find_node(g, "fc");
  EXPECT_EQ(fc->op, OpKind::gemm);
  EXPECT_TRUE(std::get<GemmAttrs>(fc->attrs).trans_b);
}

TEST(Zoo, ResNet18BasicBlocksDownsampleOnlyWhenShapesChange) {
  Graph g = build_zoo_model("resnet18", {.image_size = 64});
  EXPECT_EQ(find_node(g, "layer1.0.downsample.0"), nullptr);
  EXPECT_NE(find_node(g, "layer2.0.downsample.0"), nullptr);
  EXPECT_EQ(find_node(g, "layer2.1.downsample.0"), nullptr);
  EXPECT_EQ(constant(g, "layer2.0.conv1.weight").shape(), (Shape{128, 64, 3, 3}));
  EXPECT_EQ(std::get<ConvAttrs>(find_node(g, "layer2.0.conv1")->attrs).strides,
            (std::vector<int64_t>{2, 2}));
}

TEST(Zoo, OptionsShapeTheGraph) {
  Graph g = build_zoo_model("resnet18", {.batch = 2, .image_size = 64, .num_classes = 10});
  EXPECT_EQ(g.value(g.inputs()[0]).type.shape, (Shape{2, 3, 64, 64}));
  EXPECT_EQ(g.value(g.outputs()[0]).type.shape, (Shape{2, 10}));
  // Five stride-2 steps: 64 -> 2 at the last stage.
  auto last = g.find_value("layer4.1.relu_1");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(g.value(*last).type.shape, (Shape{2, 512, 2, 2}));
  EXPECT_EQ(constant(g, "fc.weight").shape(), (Shape{10, 512}));

  Graph half = build_zoo_model("small_cnn", {.image_size = 8, .dtype = DType::f16});
  EXPECT_EQ(half.value(half.inputs()[0]).type.dtype, DType::f16);
  for (const auto& [v, t] : half.constants()) EXPECT_EQ(t.dtype(), DType::f16);
}

TEST(Zoo, TrainingFormUsesBatchStatistics) {
  Graph g = build_zoo_model("small_cnn", {.image_size = 8, .training = true});
  int bns = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::batch_norm) continue;
    ++bns;
    EXPECT_TRUE(std::get<BatchNormAttrs>(n.attrs).training);
    EXPECT_EQ(n.outputs.size(), 5u);
  }
  EXPECT_EQ(bns, 2);
}

TEST(Zoo, WeightsAreDeterministicPerSeed) {
  Graph a = build_zoo_model("resnet18", {.image_size = 32, .seed = 7});
  Graph b = build_zoo_model("resnet18", {.image_size = 32, .seed = 7});
  Graph c = build_zoo_model("resnet18", {.image_size = 32, .seed = 8});
  ASSERT_EQ(a.constants().size(), b.constants().size());
  for (const auto& [v, t] : a.constants()) {
    const Tensor& u = b.constants().at(v);
    ASSERT_EQ(t.nbytes(), u.nbytes());
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << a.value(v).name;
  }
  const Tensor& w7 = constant(a, "layer3.0.conv2.weight");
  const Tensor& w8 = constant(c, "layer3.0.conv2.weight");
  EXPECT_NE(std::memcmp(w7.raw(), w8.raw(), w7.nbytes()), 0);
  // Each tensor has its own stream: the conv weights do not change with the head.
  Graph d = build_zoo_model("resnet18", {.image_size = 64, .num_classes = 10, .seed = 7});
  const Tensor& wd = constant(d, "layer3.0.conv2.weight");
  EXPECT_EQ(std::memcmp(w7.raw(), wd.raw(), w7.nbytes()), 0);
}

TEST(Zoo, WeightsArePortable) {
  // Pinned values: the generator is plain integer arithmetic, so these are the same
  // on every platform. A change here changes every zoo model.
  Graph g = build_zoo_model("small_cnn", {.image_size = 8, .seed = 0});
  const Tensor& w = constant(g, "conv1.weight");
  const float* p = w.data<float>();
  const float pinned[] = {-0x1.8cfa1p-3f, 0x1.2c2d64p-2f, 0x1.301e94p-4f};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p[i], pinned[i]) << i;
  EXPECT_EQ(constant(g, "bn2.running_var").data<float>()[0], 0x1.5882fap-1f);
}

TEST(Zoo, InitialisationStatistics) {
  Graph g = build_zoo_model("resnet50", {.image_size = 32, .seed = 1});
  // Kaiming normal, fan_out mode: std = sqrt(2 / (out_channels * k * k)).
  const Tensor& w = constant(g, "layer3.0.conv2.weight");  // [256, 256, 3, 3]
  double sum = 0, sq = 0;
  for (float v : w.values<float>()) {
    sum += v;
    sq += double(v) * v;
  }
  const double n = double(w.numel()), mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
  const double want = std::sqrt(2.0 / (256 * 9));
  EXPECT_NEAR(mean, 0.0, 0.01 * want);
  EXPECT_NEAR(stddev, want, 0.01 * want);

  auto check_range = [&](const std::string& name, double lo, double hi) {
    const Tensor& t = constant(g, name);
    double min = 1e30, max = -1e30;
    for (float v : t.values<float>()) {
      min = std::min(min, double(v));
      max = std::max(max, double(v));
    }
    EXPECT_GE(min, lo) << name;
    EXPECT_LE(max, hi) << name;
    // Spread over most of the range: not a constant, not a narrow band.
    EXPECT_GT(max - min, 0.8 * (hi - lo)) << name;
  };
  check_range("layer2.1.bn2.weight", 0.5, 1.5);
  check_range("layer2.1.bn2.bias", -0.1, 0.1);
  const double bound = 1.0 / std::sqrt(2048.0);
  check_range("fc.weight", -bound, bound);
  check_range("fc.bias", -bound, bound);
}

TEST(Zoo, RunningStatisticsNormaliseRandomInputs) {
  // The running statistics are estimated for inputs U(-1, 1): every inference batch
  // norm should then output roughly unit variance and centred channels, at any depth
  // (with torchvision's mean 0 / var 1, each block would triple the variance).
  Graph g = build_zoo_model("resnet34", {.batch = 2, .image_size = 64, .seed = 4});
  std::vector<std::string> bn_outputs;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::batch_norm) continue;
    g.mark_output(n.outputs[0]);
    bn_outputs.push_back(g.value(n.outputs[0]).name);
  }
  ASSERT_EQ(bn_outputs.size(), 36u);
  NamedTensors out =
      run_graph(g, {{"input", testing::random_tensor(DType::f32, {2, 3, 64, 64}, 9)}});
  for (const std::string& name : bn_outputs) {
    const Tensor& t = out.at(name);
    const int64_t channels = t.dim(1), per_channel = t.numel() / channels / 2;
    double mean_sq = 0, var = 0;  // averaged over channels
    for (int64_t c = 0; c < channels; ++c) {
      double sum = 0, sq = 0;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = 0; i < per_channel; ++i) {
          double v = t.get((b * channels + c) * per_channel + i);
          sum += v;
          sq += v * v;
        }
      const double n = double(2 * per_channel), m = sum / n, v = sq / n - m * m;
      // A sample mean of n values is off by var/n in square: layer4 has 8 per channel.
      mean_sq += (m * m - v / n) / double(channels);
      var += v / double(channels);
    }
    // The estimate ignores zero padding (a 2x2 map at layer4) and approximates relu and
    // max pooling: channel means stay within ~0.7 of 0 here. Without it they reach 2-20.
    EXPECT_LT(std::sqrt(std::max(mean_sq, 0.0)), 0.8) << name;
    EXPECT_GT(std::sqrt(var), 0.5) << name;
    EXPECT_LT(std::sqrt(var), 1.6) << name;
  }
  // Not the identity: the running statistics differ from mean 0, var 1.
  const Tensor& var = constant(g, "layer3.1.bn1.running_var");
  int near_one = 0;
  for (float v : var.values<float>()) near_one += std::fabs(v - 1.0f) < 0.01f;
  EXPECT_LT(near_one, 10);
}

TEST(Zoo, BadOptionsAreErrors) {
  try {
    build_zoo_model("resnet1000");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resnet1000"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("small_cnn"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build_zoo_model("resnet18", {.batch = 0}), Error);
  EXPECT_THROW(build_zoo_model("resnet18", {.num_classes = 0}), Error);
  EXPECT_THROW(build_zoo_model("small_cnn", {.image_size = 3}), Error);
  EXPECT_THROW(build_zoo_model("small_cnn", {.dtype = DType::i64}), Error);
  EXPECT_NO_THROW(build_zoo_model("small_cnn", {.image_size = 4}));
  EXPECT_NO_THROW(build_zoo_model("resnet18", {.image_size = 1}));
}

// Runs a single-input zoo graph on the CPU backend.
Tensor run_logits(const Graph& g, const Tensor& x) {
  NamedTensors out = run_graph(g, {{"input", x}});
  return out.at("logits");
}

// vit_b_16 has torchvision's 86,567,656 parameters and names; vit_test runs on the CPU, its
// samples independent (LayerNorm and attention stay within a sample), and survives an ONNX
// round trip.
TEST(Zoo, VisionTransformers) {
  const Graph b16 = build_zoo_model("vit_b_16");
  EXPECT_EQ(parameter_count(b16), 86567656);
  for (const char* name :
       {"conv_proj.weight", "class_token", "encoder.pos_embedding",
        "encoder.layers.encoder_layer_11.self_attention.in_proj_weight",
        "encoder.layers.encoder_layer_3.self_attention.out_proj.bias",
        "encoder.layers.encoder_layer_0.mlp.3.bias", "encoder.ln.weight", "heads.head.weight"})
    EXPECT_TRUE(b16.find_value(name).has_value()) << name;
  EXPECT_EQ(constant(b16, "encoder.pos_embedding").shape(), (Shape{1, 197, 768}));

  const ZooOptions opts{.batch = 2, .image_size = 16, .num_classes = 10, .seed = 5};
  const Graph g = build_zoo_model("vit_test", opts);
  const Tensor x = testing::random_tensor(DType::f32, {2, 3, 16, 16}, 12);
  const Tensor logits = run_logits(g, x);
  ASSERT_EQ(logits.shape(), (Shape{2, 10}));
  for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.get(i))) << i;
  const Graph single =
      build_zoo_model("vit_test", {.image_size = 16, .num_classes = 10, .seed = 5});
  Tensor x1 = Tensor::empty(DType::f32, {1, 3, 16, 16});
  std::memcpy(x1.raw(), x.data<float>() + x1.numel(), x1.nbytes());
  Tensor row = Tensor::empty(DType::f32, {1, 10});
  std::memcpy(row.raw(), logits.data<float>() + 10, row.nbytes());
  EXPECT_TRUE(testing::all_close(run_logits(single, x1), row, 1e-5, 1e-6));
  const Graph imported = import_onnx_bytes(export_onnx_bytes(g), "vit_test.onnx");
  EXPECT_TRUE(testing::all_close(run_logits(imported, x), logits, 1e-5, 1e-6));
  EXPECT_THROW(build_zoo_model("vit_test", {.image_size = 20}), Error);  // not a multiple of 8
}

// convnext_tiny has torchvision's 28,589,128 parameters; convnext_test runs on the CPU and
// survives an ONNX round trip (its depthwise 7x7 convs, channel LayerNorms, layer scales).
TEST(Zoo, ConvNext) {
  const Graph tiny = build_zoo_model("convnext_tiny");
  EXPECT_EQ(parameter_count(tiny), 28589128);
  EXPECT_EQ(constant(tiny, "features.5.8.block.0.weight").shape(), (Shape{384, 1, 7, 7}));
  EXPECT_EQ(constant(tiny, "features.7.2.layer_scale").shape(), (Shape{768, 1, 1}));
  const ZooOptions opts{.batch = 2, .image_size = 16, .num_classes = 10, .seed = 7};
  const Graph g = build_zoo_model("convnext_test", opts);
  const Tensor x = testing::random_tensor(DType::f32, {2, 3, 16, 16}, 13);
  const Tensor logits = run_logits(g, x);
  ASSERT_EQ(logits.shape(), (Shape{2, 10}));
  for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.get(i))) << i;
  const Graph imported = import_onnx_bytes(export_onnx_bytes(g), "convnext_test.onnx");
  EXPECT_TRUE(testing::all_close(run_logits(imported, x), logits, 1e-5, 1e-6));
  EXPECT_THROW(build_zoo_model("convnext_test", {.image_size = 12}), Error);  // not a multiple of 8
}

// gpt2 has Hugging Face's 124,439,808 parameters (the head tied to wte) and names; gpt2_test
// runs on the CPU: causal (a later token changes no earlier logit), logits [B, vocab, T], and
// it survives an ONNX round trip.
TEST(Zoo, Gpt2Decoder) {
  const Graph full = build_zoo_model("gpt2", {.sequence_length = 8});
  EXPECT_EQ(parameter_count(full), 124439808);
  for (const char* name :
       {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.11.attn.c_attn.weight",
        "transformer.h.0.mlp.c_proj.bias", "transformer.ln_f.weight"})
    EXPECT_TRUE(full.find_value(name).has_value()) << name;
  EXPECT_EQ(constant(full, "transformer.h.0.attn.c_attn.weight").shape(), (Shape{768, 2304}));
  EXPECT_EQ(constant(full, "transformer.wpe.weight").shape(), (Shape{1024, 768}));

  const Graph g = build_zoo_model("gpt2_test", {.batch = 2, .seed = 3, .sequence_length = 16});
  const Value& in = g.value(g.inputs().at(0));
  ASSERT_EQ(in.type.dtype, DType::i64);
  Tensor ids = testing::random_tensor(DType::i64, {2, 16}, 9, 0, 128);
  const Tensor logits = run_logits(g, ids);
  ASSERT_EQ(logits.shape(), (Shape{2, 128, 16}));
  for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.get(i))) << i;
  Tensor changed = ids.clone();
  changed.set(10, double((int64_t(ids.get(10)) + 1) % 128));  // sequence 0, position 10
  const Tensor after = run_logits(g, changed);
  for (int64_t v = 0; v < 128; ++v)
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t i = v * 16 + t;  // sequence 0
      if (t < 10) EXPECT_EQ(after.get(i), logits.get(i)) << "vocab " << v << " position " << t;
    }
  const Graph imported = import_onnx_bytes(export_onnx_bytes(g), "gpt2_test.onnx");
  EXPECT_TRUE(testing::all_close(run_logits(imported, ids), logits, 1e-5, 1e-6));
  EXPECT_THROW(build_zoo_model("gpt2_test", {.sequence_length = 33}), Error);  // 32 positions
}

// mobilenet_v3_small has torchvision's 2,542,856 parameters and names; it runs on the CPU,
// trains (the step graph's batch norms in training form) and survives an ONNX round trip.
TEST(Zoo, MobileNetV3Small) {
  const Graph full = build_zoo_model("mobilenet_v3_small");
  EXPECT_EQ(parameter_count(full), 2542856);
  EXPECT_EQ(constant(full, "features.4.block.2.fc1.weight").shape(), (Shape{24, 96, 1, 1}));
  EXPECT_EQ(constant(full, "features.1.block.0.0.weight").shape(), (Shape{16, 1, 3, 3}));
  EXPECT_EQ(constant(full, "classifier.3.weight").shape(), (Shape{1000, 1024}));
  const ZooOptions opts{.batch = 2, .image_size = 32, .num_classes = 10, .seed = 4};
  const Graph g = build_zoo_model("mobilenet_v3_small", opts);
  const Tensor x = testing::random_tensor(DType::f32, {2, 3, 32, 32}, 14);
  const Tensor logits = run_logits(g, x);
  ASSERT_EQ(logits.shape(), (Shape{2, 10}));
  double sum_sq = 0;
  for (int64_t i = 0; i < logits.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(logits.get(i))) << i;
    sum_sq += logits.get(i) * logits.get(i);
  }
  EXPECT_GT(sum_sq, 0);
  const Graph imported = import_onnx_bytes(export_onnx_bytes(g), "mobilenet_v3_small.onnx");
  EXPECT_TRUE(testing::all_close(run_logits(imported, x), logits, 1e-5, 1e-6));
}

// unet: the repository's layout (transposed-convolution upsampling); unet_test runs on the
// CPU with bilinear (align_corners) upsampling, gives per-pixel logits and survives an ONNX
// round trip (Resize, ConvTranspose, Concat).
TEST(Zoo, UNet) {
  const Graph full = build_zoo_model("unet", {.image_size = 32, .num_classes = 2});
  EXPECT_EQ(constant(full, "up1.up.weight").shape(), (Shape{1024, 512, 2, 2}));
  EXPECT_EQ(constant(full, "down4.maxpool_conv.1.double_conv.3.weight").shape(),
            (Shape{1024, 1024, 3, 3}));
  EXPECT_EQ(constant(full, "outc.conv.weight").shape(), (Shape{2, 64, 1, 1}));
  const ZooOptions opts{.batch = 2, .image_size = 16, .num_classes = 3, .seed = 6};
  const Graph g = build_zoo_model("unet_test", opts);
  EXPECT_EQ(testing::count_ops(g, OpKind::resize), 2);
  const Tensor x = testing::random_tensor(DType::f32, {2, 3, 16, 16}, 15);
  const Tensor logits = run_logits(g, x);
  ASSERT_EQ(logits.shape(), (Shape{2, 3, 16, 16}));
  for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.get(i))) << i;
  const Graph imported = import_onnx_bytes(export_onnx_bytes(g), "unet_test.onnx");
  EXPECT_TRUE(testing::all_close(run_logits(imported, x), logits, 1e-5, 1e-6));
  EXPECT_THROW(build_zoo_model("unet_test", {.image_size = 10}), Error);  // not a multiple of 4
}

TEST(Zoo, SmallCnnRunsOnCpu) {
  const ZooOptions opts{.batch = 2, .image_size = 16, .num_classes = 10, .seed = 3};
  Graph g = build_zoo_model("small_cnn", opts);
  Tensor x = testing::random_tensor(DType::f32, {2, 3, 16, 16}, 11);
  Tensor logits = run_logits(g, x);
  ASSERT_EQ(logits.shape(), (Shape{2, 10}));
  double min = 1e30, max = -1e30;
  for (int64_t i = 0; i < logits.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(logits.get(i))) << i;
    min = std::min(min, logits.get(i));
    max = std::max(max, logits.get(i));
  }
  EXPECT_GT(max - min, 1e-3) << "degenerate logits";

  // Inference batch norm treats samples independently: each row equals the logits
  // of that sample alone.
  Graph single = build_zoo_model("small_cnn", {.image_size = 16, .num_classes = 10, .seed = 3});
  for (int64_t s = 0; s < 2; ++s) {
    Tensor xs = Tensor::empty(DType::f32, {1, 3, 16, 16});
    std::memcpy(xs.raw(), x.data<float>() + s * xs.numel(), xs.nbytes());
    Tensor row = run_logits(single, xs);
    Tensor expected = Tensor::empty(DType::f32, {1, 10});
    std::memcpy(expected.raw(), logits.data<float>() + s * 10, expected.nbytes());
    EXPECT_TRUE(testing::all_close(row, expected, 1e-5, 1e-6)) << "sample " << s;
  }

  // The training form normalises with batch statistics: other logits, still finite.
  ZooOptions train = opts;
  train.training = true;
  Tensor train_logits = run_logits(build_zoo_model("small_cnn", train), x);
  ASSERT_EQ(train_logits.shape(), (Shape{2, 10}));
  for (int64_t i = 0; i < train_logits.numel(); ++i)
    ASSERT_TRUE(std::isfinite(train_logits.get(i)));
  EXPECT_FALSE(testing::all_close(train_logits, logits, 1e-3, 1e-3));
}

}  // namespace
}  // namespace fusebox
