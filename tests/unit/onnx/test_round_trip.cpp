// Export -> import round trips: graphs built with the Builder, covering every op the
// exporter maps, are exported, re-imported and run on the CPU next to the original
// with the same inputs; every output must agree.
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "fusebox/io/tensor_file.h"
#include "onnx_test_util.h"

namespace fusebox::testing {
namespace {

// The graph's ops in order; constant nodes are left out (the importer folds them).
std::vector<OpKind> op_sequence(const Graph& g) {
  std::vector<OpKind> ops;
  for (const Node& n : g.nodes())
    if (n.op != OpKind::constant) ops.push_back(n.op);
  return ops;
}

// With FUSEBOX_ONNX_EXPORT_DIR set, each exported model is also written there in the
// ONNX node-test layout (<dir>/<test>/model.onnx, test_data_set_0/{input,output}_N.pb),
// so that another ONNX runtime can check the exporter independently of our importer.
void write_node_test(const Graph& g, const std::string& bytes, const NamedTensors& feeds,
                     const NamedTensors& outputs) {
  const char* root = std::getenv("FUSEBOX_ONNX_EXPORT_DIR");
  if (!root) return;
  const std::string dir =
      cat(root, "/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir + "/test_data_set_0");
  write_file_atomic(dir + "/model.onnx", bytes);
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const std::string& name = g.value(g.inputs()[i]).name;
    write_tensor_pb(cat(dir, "/test_data_set_0/input_", i, ".pb"), feeds.at(name), name);
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const std::string& name = g.value(g.outputs()[i]).name;
    write_tensor_pb(cat(dir, "/test_data_set_0/output_", i, ".pb"), outputs.at(name), name);
  }
}

// Exports `g`, re-imports it, and compares both graphs' outputs on `feeds`. With
// `same_ops`, the re-imported graph must also hold the same op sequence (no
// decomposition on the way).
void expect_round_trip(const Graph& g, const NamedTensors& feeds, bool same_ops = true,
                       double rtol = 1e-6, double atol = 1e-6) {
  const std::string bytes = export_onnx_bytes(g);
  write_node_test(g, bytes, feeds, run_graph(g, feeds));
  Graph back = import_onnx_bytes(bytes, "round_trip.onnx");
  if (same_ops) {
    EXPECT_EQ(op_sequence(back), op_sequence(g)) << back.dump();
  }
  ASSERT_EQ(back.outputs().size(), g.outputs().size());
  NamedTensors expected = run_graph(g, feeds);
  NamedTensors actual = run_graph(back, feeds);
  for (const auto& [name, t] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << "no output '" << name << "' after the round trip";
    EXPECT_TRUE(all_close(it->second, t, rtol, atol)) << "output '" << name << "'";
  }
}

// A graph input with random contents, added to `feeds`.
ValueId random_input(Graph& g, NamedTensors& feeds, const std::string& name, const Shape& shape,
                     uint64_t seed, DType dt = DType::f32, double lo = -1, double hi = 1) {
  feeds[name] = random_tensor(dt, shape, seed, lo, hi);
  return g.add_input(name, dt, shape);
}

ConvAttrs conv_attrs(std::vector<int64_t> strides, std::vector<int64_t> dilations,
                     std::vector<int64_t> pads_begin, std::vector<int64_t> pads_end,
                     int64_t groups = 1) {
  ConvAttrs a;
  a.strides = std::move(strides);
  a.dilations = std::move(dilations);
  a.pads_begin = std::move(pads_begin);
  a.pads_end = std::move(pads_end);
  a.groups = groups;
  return a;
}

PoolAttrs pool_attrs(std::vector<int64_t> kernel, std::vector<int64_t> strides,
                     std::vector<int64_t> dilations, std::vector<int64_t> pads_begin,
                     std::vector<int64_t> pads_end) {
  PoolAttrs a;
  a.kernel = std::move(kernel);
  a.strides = std::move(strides);
  a.dilations = std::move(dilations);
  a.pads_begin = std::move(pads_begin);
  a.pads_end = std::move(pads_end);
  return a;
}

ValueId random_const(Graph& g, const std::string& name, const Shape& shape, uint64_t seed,
                     DType dt = DType::f32, double lo = -1, double hi = 1) {
  return g.add_constant(name, random_tensor(dt, shape, seed, lo, hi));
}

TEST(OnnxRoundTrip, ModelMetadataAndTypes) {
  Graph g("meta");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f16, {2, 3});
  ValueId w = g.add_constant("w", Tensor::full(DType::f16, {3}, 2.0));
  g.mark_output(b.name("scale").mul(x, w));
  onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(export_onnx_bytes(g)));
  EXPECT_EQ(m.ir_version(), 8);
  EXPECT_EQ(m.producer_name(), "fusebox");
  ASSERT_EQ(m.opset_import_size(), 1);
  EXPECT_EQ(m.opset_import(0).domain(), "");
  EXPECT_EQ(m.opset_import(0).version(), 17);
  ASSERT_EQ(m.graph().input_size(), 1);
  EXPECT_EQ(m.graph().input(0).name(), "x");
  const auto& tt = m.graph().input(0).type().tensor_type();
  EXPECT_EQ(tt.elem_type(), onnx::TensorProto::FLOAT16);
  ASSERT_EQ(tt.shape().dim_size(), 2);
  EXPECT_EQ(tt.shape().dim(1).dim_value(), 3);
  ASSERT_EQ(m.graph().initializer_size(), 1);
  EXPECT_EQ(m.graph().initializer(0).name(), "w");
  ASSERT_EQ(m.graph().node_size(), 1);
  EXPECT_EQ(m.graph().node(0).op_type(), "Mul");
  EXPECT_EQ(m.graph().node(0).name(), "scale");
  ASSERT_EQ(m.graph().output_size(), 1);
  EXPECT_EQ(m.graph().output(0).name(), "scale");
  EXPECT_EQ(m.graph().output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
}

TEST(OnnxRoundTrip, ConvFamily) {
  Graph g("conv");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {2, 4, 9, 8}, 1);
  ValueId w = random_const(g, "w", {6, 4, 3, 3}, 2);
  ValueId bias = random_const(g, "bias", {6}, 3);
  ValueId y = b.conv(x, w, bias, conv_attrs({2, 1}, {1, 2}, {1, 0}, {2, 1}));
  ValueId wg = random_const(g, "wg", {6, 2, 1, 3}, 4);
  ValueId yg = b.conv(y, wg, kNoValue, conv_attrs({}, {}, {0, 1}, {0, 1}, 3));
  // A transposed convolution back up, with one extra row (output_padding 1) per dim.
  ValueId wt = random_const(g, "wt", {6, 2, 3, 3}, 5);
  ValueId bt = random_const(g, "bt", {4}, 6);
  const Shape& ys = g.value(yg).type.shape;
  ConvBackwardDataAttrs t;
  t.conv.strides = {2, 2};
  t.conv.pads_begin = {1, 1};
  t.conv.pads_end = {1, 0};
  t.conv.groups = 2;
  t.input_spatial = {(ys[2] - 1) * 2 - 2 + 3 + 1, (ys[3] - 1) * 2 - 1 + 3 + 1};
  ValueId up = b.conv_backward_data(yg, wt, t, bt);
  g.mark_output(yg);
  g.mark_output(up);
  expect_round_trip(g, feeds, true, 1e-5, 1e-5);
}

TEST(OnnxRoundTrip, Conv1dAnd3d) {
  Graph g("conv_nd");
  Builder b(g);
  NamedTensors feeds;
  ValueId x1 = random_input(g, feeds, "x1", {1, 2, 11}, 7);
  g.mark_output(
      b.conv(x1, random_const(g, "w1", {3, 2, 4}, 8), kNoValue, conv_attrs({3}, {}, {2}, {1})));
  ValueId x3 = random_input(g, feeds, "x3", {1, 2, 4, 5, 3}, 9);
  g.mark_output(b.conv(x3, random_const(g, "w3", {2, 2, 2, 2, 2}, 10)));
  expect_round_trip(g, feeds, true, 1e-5, 1e-5);
}

TEST(OnnxRoundTrip, Normalisation) {
  Graph g("norm");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {2, 3, 4, 5}, 11);
  ValueId scale = random_const(g, "scale", {3}, 12);
  ValueId shift = random_const(g, "shift", {3}, 13);
  ValueId mean = random_const(g, "mean", {3}, 14);
  ValueId var = random_const(g, "var", {3}, 15, DType::f32, 0.5, 2);
  g.mark_output(b.name("bn").batch_norm(x, scale, shift, mean, var, {.epsilon = 1e-3}));
  // Training form with its saved statistics unused: ONNX's training_mode=1.
  std::vector<ValueId> tr =
      b.name("bn_train").batch_norm_training(x, scale, shift, mean, var, {.momentum = 0.8});
  for (int i = 0; i < 3; ++i) g.mark_output(tr[size_t(i)]);
  ValueId ln_scale = random_const(g, "ln_scale", {4, 5}, 16);
  ValueId ln_bias = random_const(g, "ln_bias", {4, 5}, 17);
  g.mark_output(b.name("ln").layer_norm(x, ln_scale, ln_bias, {.axis = 2, .epsilon = 1e-4}));
  g.mark_output(b.name("ln_plain").layer_norm(x, kNoValue, kNoValue, {.axis = -1}));
  expect_round_trip(g, feeds, true, 1e-5, 1e-5);
}

TEST(OnnxRoundTrip, LayerNormStatisticsOutputs) {
  Graph g("ln_stats");
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {3, 8}, 18);
  std::vector<ValueId> outs = g.add_node(OpKind::layer_norm, NormAttrs{.axis = 1}, {x}, "ln");
  for (ValueId v : outs) g.mark_output(v);
  expect_round_trip(g, feeds, true, 1e-5, 1e-6);
}

TEST(OnnxRoundTrip, DecomposedOps) {
  Graph g("decomposed");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {2, 3, 8}, 19, DType::f32, -3, 3);
  ValueId pos = random_input(g, feeds, "pos", {2, 3, 8}, 20, DType::f32, 0.1, 4);
  g.mark_output(
      b.name("rms").rms_norm(x, random_const(g, "rms_scale", {8}, 21), {.epsilon = 1e-5}));
  g.mark_output(b.name("rms_plain").rms_norm(x, kNoValue, {.axis = 1}));
  g.mark_output(b.name("gelu").gelu(x));
  g.mark_output(b.name("gelu_tanh").gelu(x, true));
  g.mark_output(b.name("silu").silu(x));
  g.mark_output(b.name("rsqrt").rsqrt(pos));
  std::vector<ValueId> rms = g.add_node(OpKind::rms_norm, NormAttrs{.axis = 2}, {x}, "rms_both");
  g.mark_output(rms.at(1));
  expect_round_trip(g, feeds, false, 1e-5, 1e-6);
}

TEST(OnnxRoundTrip, DecomposedRmsNormHalf) {
  Graph g("rms_f16");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {4, 16}, 22, DType::f16);
  ValueId scale = random_const(g, "scale", {16}, 23, DType::f16);
  std::vector<ValueId> outs = g.add_node(OpKind::rms_norm, NormAttrs{.axis = 1}, {x, scale}, "rms");
  g.mark_output(outs[0]);
  g.mark_output(outs[1]);
  expect_round_trip(g, feeds, false, 1e-3, 1e-3);
}

TEST(OnnxRoundTrip, Pointwise) {
  Graph g("pointwise");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {3, 5}, 24, DType::f32, -2, 2);
  ValueId pos = random_input(g, feeds, "pos", {3, 5}, 25, DType::f32, 0.1, 3);
  ValueId row = random_input(g, feeds, "row", {5}, 26, DType::f32, 0.5, 1.5);
  for (ValueId v : {b.relu(x),
                    b.leaky_relu(x, 0.2),
                    b.sigmoid(x),
                    b.tanh(x),
                    b.exp(x),
                    b.log(pos),
                    b.sqrt(pos),
                    b.reciprocal(pos),
                    b.neg(x),
                    b.abs(x),
                    b.erf(x),
                    b.clip(x, -0.5, 0.75),
                    b.clip(x, -INFINITY, 0.25),
                    b.clip(x, -0.25, INFINITY),
                    b.identity(x),
                    b.add(x, row),
                    b.sub(row, x),
                    b.mul(x, row),
                    b.div(x, row),
                    b.max(x, row),
                    b.min(x, row),
                    b.pow(pos, row)})
    g.mark_output(v);
  ValueId i = random_input(g, feeds, "i", {4}, 27, DType::i64, -5, 5);
  ValueId e = g.add_constant("e", Tensor::from_vector<int32_t>({4}, {0, 1, 2, 3}));
  g.mark_output(b.pow(i, e));
  g.mark_output(b.clip(i, -2, 3));
  expect_round_trip(g, feeds);
}

// floor / ceil / round, and resize in each mode: scales the coordinates read (downsampling
// by 0.6 gives floor(0.6 * 8) = 4 elements, not a ratio of 1/2), sizes, a crop with its roi.
TEST(OnnxRoundTrip, RoundingAndResize) {
  Graph g("resize");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {1, 2, 5, 8}, 28, DType::f32, -3, 3);
  for (OpKind op : {OpKind::floor, OpKind::ceil, OpKind::round})
    g.mark_output(g.add_node(op, {}, {x}, op_name(op)).at(0));
  const std::vector<ResizeAttrs> resizes = {
      {.sizes = {1, 2, 9, 4},
       .scales = {1, 1, 1.8, 0.6},
       .mode = ResizeMode::linear,
       .coordinates = ResizeCoordinates::align_corners},
      {.sizes = {1, 2, 7, 11}, .mode = ResizeMode::cubic, .exclude_outside = true},
      {.sizes = {1, 2, 3, 16},
       .coordinates = ResizeCoordinates::asymmetric,
       .nearest = ResizeNearest::ceil},
      {.sizes = {1, 2, 4, 4},
       .mode = ResizeMode::linear,
       .coordinates = ResizeCoordinates::tf_crop_and_resize,
       .extrapolation_value = 7,
       .roi_start = {0, 0, 0.25, -0.5},
       .roi_end = {1, 1, 0.75, 1.25}},
  };
  int i = 0;
  for (const ResizeAttrs& a : resizes)
    g.mark_output(g.add_node(OpKind::resize, a, {x}, cat("resize", i++)).at(0));
  // ONNX stores scales as f32 (1.8 nudged to 1.8000001f, see the exporter): the align_corners
  // coordinates move by that rounding.
  expect_round_trip(g, feeds, true, 1e-5, 1e-5);
}

TEST(OnnxRoundTrip, MatmulAndGemm) {
  Graph g("matmul");
  Builder b(g);
  NamedTensors feeds;
  ValueId a = random_input(g, feeds, "a", {2, 3, 4, 5}, 28);
  ValueId m = random_const(g, "m", {3, 5, 6}, 29);
  g.mark_output(b.matmul(a, m));
  ValueId p = random_input(g, feeds, "p", {5, 4}, 30);
  ValueId q = random_const(g, "q", {3, 5}, 31);
  ValueId c = random_const(g, "c", {3}, 32);
  g.mark_output(b.gemm(p, q, c, {.trans_a = true, .trans_b = true, .alpha = 0.5, .beta = 2}));
  g.mark_output(b.gemm(q, p));
  expect_round_trip(g, feeds, true, 1e-5, 1e-6);
}

TEST(OnnxRoundTrip, ReductionsAndSoftmax) {
  Graph g("reduce");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {2, 3, 4}, 33);
  g.mark_output(b.reduce_sum(x, {1}, true));
  g.mark_output(b.reduce_sum(x, {}, false));
  g.mark_output(b.reduce_mean(x, {0, 2}, false));
  g.mark_output(b.reduce_max(x, {-1}, true));
  g.mark_output(b.softmax(x, 1));
  g.mark_output(b.log_softmax(x, -1));
  for (const TopKAttrs& a : {TopKAttrs{.k = 2, .axis = 1}, TopKAttrs{.k = 3, .largest = false}}) {
    const std::vector<ValueId> top = b.op(OpKind::top_k, a, {x});
    g.mark_output(top.at(0));
    g.mark_output(top.at(1));
  }
  expect_round_trip(g, feeds, true, 1e-6, 1e-6);
}

TEST(OnnxRoundTrip, Pooling) {
  Graph g("pool");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {2, 3, 9, 8}, 34);
  PoolAttrs max = pool_attrs({3, 2}, {2, 2}, {1, 2}, {1, 0}, {1, 1});
  max.ceil_mode = true;
  g.mark_output(b.max_pool(x, max));
  PoolAttrs avg = pool_attrs({3, 3}, {2, 3}, {}, {1, 1}, {1, 1});
  avg.count_include_pad = true;
  g.mark_output(b.avg_pool(x, avg));
  g.mark_output(b.avg_pool(x, pool_attrs({2, 2}, {}, {}, {1, 0}, {0, 1})));
  g.mark_output(b.global_avg_pool(x));
  std::vector<ValueId> with_indices = g.add_node(
      OpKind::max_pool,
      [] {
        PoolAttrs a = pool_attrs({2, 2}, {2, 2}, {}, {}, {});
        a.return_indices = true;
        return a;
      }(),
      {x}, "argmax");
  g.mark_output(with_indices[0]);
  g.mark_output(with_indices[1]);
  expect_round_trip(g, feeds);
}

TEST(OnnxRoundTrip, ShapeOps) {
  Graph g("shape");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {2, 3, 4}, 35);
  g.mark_output(b.reshape(x, {3, -1, 0}));
  g.mark_output(b.flatten(x, 2));
  g.mark_output(b.transpose(x, {2, 0, 1}));
  g.mark_output(b.transpose(x));
  g.mark_output(b.concat({x, b.neg(x)}, -1));
  g.mark_output(b.slice(x, SliceAttrs{{-1, 0}, {INT64_MIN, 100}, {2, 1}, {-2, 2}}));
  g.mark_output(b.slice(x, SliceAttrs{{1}, {3}, {}, {}}));
  g.mark_output(b.pad(x, {.pads = {0, 1, 2, 1, 0, -1}, .mode = PadMode::constant, .value = 1.5}));
  g.mark_output(b.pad(x, {.pads = {0, 0, 2, 0, 1, 1}, .mode = PadMode::reflect}));
  g.mark_output(b.pad(x, {.pads = {1, 0, 0, 0, 2, 3}, .mode = PadMode::edge}));
  ValueId u = b.unsqueeze(x, {0, 3});
  g.mark_output(u);
  g.mark_output(b.squeeze(u, {0}));
  g.mark_output(b.squeeze(u));
  g.mark_output(b.cast(x, DType::f16));
  g.mark_output(b.cast(b.cast(x, DType::i32), DType::f64));
  g.mark_output(b.add(x, b.constant(Tensor::full(DType::f32, {4}, 0.25))));
  g.mark_output(g.add_node(OpKind::expand, ExpandAttrs{{5, 2, 3, 4}}, {x}, "expand").at(0));
  expect_round_trip(g, feeds);
}

TEST(OnnxRoundTrip, ZeroSizedReshape) {
  Graph g("zero");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {0, 6}, 36);
  // With allow_zero, 0 is an extent (exported as Reshape with allowzero=1).
  g.mark_output(g.add_node(OpKind::reshape, ReshapeAttrs{{3, 0, 2}, true}, {x}, "r").at(0));
  expect_round_trip(g, feeds);
}

TEST(OnnxRoundTrip, CrossEntropy) {
  Graph g("loss");
  Builder b(g);
  NamedTensors feeds;
  ValueId logits = random_input(g, feeds, "logits", {4, 5, 3}, 37, DType::f32, -3, 3);
  ValueId labels = random_input(g, feeds, "labels", {4, 3}, 38, DType::i64, 0, 5);
  ValueId weight = random_const(g, "weight", {5}, 39, DType::f32, 0.1, 1);
  for (auto [reduction, ignore] : {std::pair{Reduction::mean, std::optional<int64_t>(2)},
                                   std::pair{Reduction::sum, std::optional<int64_t>()},
                                   std::pair{Reduction::none, std::optional<int64_t>(0)}}) {
    std::vector<ValueId> outs = b.cross_entropy(logits, labels, weight, {reduction, ignore});
    g.mark_output(outs[0]);
    g.mark_output(outs[1]);
  }
  expect_round_trip(g, feeds, true, 1e-6, 1e-6);
}

// Constants and graph inputs may be graph outputs themselves.
TEST(OnnxRoundTrip, OutputsThatAreConstantsOrInputs) {
  Graph g("passthrough");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {3}, 40);
  ValueId c = g.add_constant("c", Tensor::from_vector<float>({3}, {1, 2, 3}));
  g.mark_output(c);
  g.mark_output(x);
  g.mark_output(b.add(x, c));
  expect_round_trip(g, feeds);
}

TEST(OnnxExport, ConvBackwardFilterHasNoOnnxForm) {
  Graph g("grad");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {1, 2, 5, 5});
  ValueId dy = g.add_input("dy", DType::f32, {1, 3, 3, 3});
  ConvBackwardFilterAttrs a;
  a.filter_spatial = {3, 3};
  g.mark_output(b.name("dw").conv_backward_filter(x, dy, a));
  EXPECT_TRUE(throws_error_with([&] { export_onnx_bytes(g); },
                                {"onnx export", "conv_backward_filter 'dw'", "no ONNX"}));
}

// A training batch_norm 'bn1' of an x [2, 3, 4] input with constant per-channel operands: its
// five outputs, none marked.
std::vector<ValueId> training_batch_norm(Graph& g, BatchNormAttrs a = {}) {
  ValueId x = g.add_input("x", DType::f32, {2, 3, 4});
  std::vector<ValueId> p;
  for (const char* n : {"s", "b", "m", "v"})
    p.push_back(g.add_constant(n, Tensor::full(DType::f32, {3}, 1)));
  return Builder(g).name("bn1").batch_norm_training(x, p[0], p[1], p[2], p[3], a);
}

TEST(OnnxExport, BatchNormTrainingWithUsedSavedStatistics) {
  Graph g("bn");
  std::vector<ValueId> outs = training_batch_norm(g);
  g.mark_output(outs[0]);
  g.mark_output(outs[3]);  // saved mean: ONNX has no such output
  EXPECT_TRUE(
      throws_error_with([&] { export_onnx_bytes(g); }, {"batch_norm 'bn1'", "saved statistic"}));
}

TEST(OnnxExport, SyncBatchNormHasNoOnnxForm) {
  Graph g("bn");
  g.mark_output(training_batch_norm(g, {.sync = true}).at(0));
  EXPECT_TRUE(throws_error_with([&] { export_onnx_bytes(g); },
                                {"batch_norm 'bn1'", "synchronized", "no ONNX operator"}));
}

TEST(OnnxExport, FileRoundTrip) {
  Graph g("file");
  Builder b(g);
  NamedTensors feeds;
  ValueId x = random_input(g, feeds, "x", {2, 2}, 41);
  g.mark_output(b.relu(x));
  const std::string path = ::testing::TempDir() + "/fusebox_export_test.onnx";
  export_onnx_file(g, path);
  Graph back = import_onnx_file(path);
  EXPECT_TRUE(
      all_close(run_graph(back, feeds).begin()->second, run_graph(g, feeds).begin()->second, 0, 0));
}

}  // namespace
}  // namespace fusebox::testing
