// Channels-last on the GPU (passes/layout.h): run_node gives each op what it needs whatever
// the layouts of its operands (dispatch.cpp), and whole graphs run with the layout plan
// match the CPU and the all-contiguous plan: a ResNet-like block (inference) and its
// training graph (autodiff: conv backward ops, batch-norm and pool backward, elementwise
// gradients), ConvNeXt's block (its permutes compiled as views of their inputs) and a
// DenseNet-like concatenation written channels-last.
#include "fusebox/ir/builder.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/layout.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/runtime/executor.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::ScopedEnv;

// `t` on the device in `format`, by way of a contiguous upload.
DeviceTensor upload_as(OpHarness& h, const Tensor& t, MemoryFormat format) {
  DeviceTensor contiguous = h.upload(t);
  if (format == MemoryFormat::contiguous) return contiguous;
  DeviceTensor d = DeviceTensor::empty(h.ctx().allocator, t.dtype(), t.shape(), format);
  copy_strided(h.ctx(), contiguous, d);
  h.encoder().synchronize();
  return d;
}

// Runs the node through run_node (the dispatcher) on inputs in the given formats, with
// outputs allocated in `out_format` and poisoned; returns the outputs as contiguous tensors.
std::vector<Tensor> run_dispatched(OpHarness& h, OpKind op, Attrs attrs,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<MemoryFormat>& in_formats,
                                   MemoryFormat out_format) {
  const BuiltNode built = build_node(op, std::move(attrs), inputs);
  std::vector<DeviceTensor> device;
  device.reserve(inputs.size());
  std::vector<const DeviceTensor*> pointers;
  for (size_t i = 0; i < inputs.size(); ++i) {
    device.push_back(upload_as(h, inputs[i], in_formats.at(i)));
    pointers.push_back(&device.back());
  }
  std::vector<DeviceTensor> outputs;
  for (const TensorType& type : built.outputs) {
    outputs.push_back(
        DeviceTensor::empty(h.ctx().allocator, type.dtype, type.shape,
                            type.shape.size() >= 3 ? out_format : MemoryFormat::contiguous));
    h.encoder().memset(outputs.back().range(), 0xFF);
  }
  run_node(h.ctx(), built.node, pointers, outputs);
  std::vector<Tensor> result;
  for (const DeviceTensor& d : outputs) {
    DeviceTensor contiguous = DeviceTensor::empty(h.ctx().allocator, d.dtype, d.shape);
    copy_strided(h.ctx(), d, contiguous);
    h.encoder().synchronize();
    result.push_back(h.download(contiguous));
  }
  return result;
}

constexpr MemoryFormat kCL = MemoryFormat::channels_last;
constexpr MemoryFormat kContig = MemoryFormat::contiguous;

void expect_matches_cpu(OpHarness& h, OpKind op, Attrs attrs, const std::vector<Tensor>& inputs,
                        const std::vector<MemoryFormat>& in_formats, MemoryFormat out_format,
                        double rtol, double atol) {
  const std::vector<Tensor> want = fusebox::testing::run_op(op, attrs, inputs);
  const std::vector<Tensor> got = run_dispatched(h, op, attrs, inputs, in_formats, out_format);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(all_close(got[i], want[i], rtol, atol))
        << op_name(op) << " output " << i << " (out " << memory_format_name(out_format) << ")";
}

// Reductions of a channels-last x that keep C alone (per-channel statistics, bias gradients)
// run in x's physical order; the others (another kept dim) after a contiguous copy.
TEST(CudaLayout, ReductionsOfChannelsLastInputs) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  const Tensor x = random_tensor(DType::f32, {3, 6, 5, 7}, 4);
  const Tensor x16 = random_tensor(DType::bf16, {4, 40, 9, 9}, 5);
  for (OpKind op : {OpKind::reduce_sum, OpKind::reduce_mean, OpKind::reduce_max}) {
    for (bool keepdims : {true, false}) {
      for (const std::vector<int64_t>& axes :
           {std::vector<int64_t>{0, 2, 3}, std::vector<int64_t>{2, 3},
            std::vector<int64_t>{0, 3}}) {
        SCOPED_TRACE(cat(op_name(op), " keepdims ", keepdims, " axes ", shape_str(axes)));
        expect_matches_cpu(h, op, ReduceAttrs{axes, keepdims}, {x}, {kCL}, kContig, 1e-5, 1e-5);
      }
      expect_matches_cpu(h, op, ReduceAttrs{{0, 2, 3}, keepdims}, {x16}, {kCL}, kContig, 1e-2,
                         1e-2);
    }
  }
}

TEST(CudaLayout, ElementwiseOpsInEveryMixOfLayouts) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  const Tensor a = random_tensor(DType::f32, {2, 5, 3, 7}, 1);
  const Tensor b = random_tensor(DType::f32, {2, 5, 3, 7}, 2);
  const Tensor bias = random_tensor(DType::f32, {5, 1, 1}, 3);  // lower rank, broadcast
  const Tensor pos = random_tensor(DType::f32, {2, 5, 3, 7}, 4, 0.5, 2.0);
  for (MemoryFormat out : {kCL, kContig}) {
    for (MemoryFormat fa : {kCL, kContig}) {
      expect_matches_cpu(h, OpKind::add, {}, {a, b}, {fa, kCL}, out, 0, 0);
      expect_matches_cpu(h, OpKind::mul, {}, {a, bias}, {fa, kContig}, out, 0, 0);
      expect_matches_cpu(h, OpKind::relu, {}, {a}, {fa}, out, 0, 0);
      expect_matches_cpu(h, OpKind::cast, CastAttrs{DType::f16}, {a}, {fa}, out, 0, 0);
      expect_matches_cpu(h, OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::relu}, {b, a},
                         {kContig, fa}, out, 0, 0);
      // Two outputs (da, db), an input that is not contiguous after the permutation.
      expect_matches_cpu(h, OpKind::binary_backward, BinaryBackwardAttrs{OpKind::pow}, {b, pos, a},
                         {fa, kCL, kContig}, out, 1e-5, 1e-6);
    }
  }
  // An optimizer update with a scalar operand (lr), channels-last parameters.
  const Tensor lr = Tensor::scalar(DType::f32, 0.1);
  expect_matches_cpu(h, OpKind::sgd_update, SgdAttrs{.momentum = 0.9}, {a, b, pos, lr},
                     {kCL, kContig, kCL, kContig}, kCL, 1e-6, 1e-7);
}

// Ops that need contiguous data get copies, and their outputs, when allocated
// channels-last, are computed contiguous and copied into place.
TEST(CudaLayout, ContiguousOpsWithChannelsLastOperands) {
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  const Tensor x = random_tensor(DType::f32, {2, 6, 4, 5}, 5);
  expect_matches_cpu(h, OpKind::softmax, SoftmaxAttrs{1}, {x}, {kCL}, kCL, 1e-5, 1e-7);
  expect_matches_cpu(h, OpKind::softmax, SoftmaxAttrs{1}, {x}, {kCL}, kContig, 1e-5, 1e-7);
  expect_matches_cpu(h, OpKind::reduce_sum, ReduceAttrs{{2, 3}, true}, {x}, {kCL}, kContig, 1e-5,
                     1e-6);
  expect_matches_cpu(h, OpKind::transpose, TransposeAttrs{{0, 2, 3, 1}}, {x}, {kCL}, kContig, 0, 0);
}

// A ResNet-like block: conv -> bn -> relu -> max_pool -> conv -> bn -> + -> relu ->
// global_avg_pool -> flatten -> gemm, run with the layout plan and all-contiguous.
Graph resnet_block(DType dtype) {
  Graph g("layout_block");
  Builder b(g);
  auto param = [&](const std::string& name, Shape shape, uint64_t seed, double lo = -0.5,
                   double hi = 0.5) {
    return g.add_constant(name, random_tensor(dtype, shape, seed, lo, hi));
  };
  ValueId x = g.add_input("x", dtype, {4, 16, 20, 20});
  auto bn = [&](ValueId v, int64_t c, const std::string& p) {
    return b.batch_norm(v, param(p + ".s", {c}, 11, 0.5, 1.5), param(p + ".b", {c}, 12),
                        param(p + ".m", {c}, 13), param(p + ".v", {c}, 14, 0.5, 1.5));
  };
  const ConvAttrs same{.pads_begin = {1, 1}, .pads_end = {1, 1}};
  ValueId h =
      b.relu(bn(b.conv(x, param("w1", {32, 16, 3, 3}, 1, -0.2, 0.2), kNoValue, same), 32, "bn1"));
  h = b.max_pool(
      h, PoolAttrs{.kernel = {3, 3}, .strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}});
  ValueId r = bn(b.conv(h, param("w2", {32, 32, 3, 3}, 2, -0.1, 0.1), kNoValue, same), 32, "bn2");
  h = b.relu(b.add(r, h));
  h = b.avg_pool(h, PoolAttrs{.kernel = {2, 2}, .strides = {2, 2}});
  ValueId logits = b.gemm(b.flatten(b.global_avg_pool(h)), param("fc", {32, 10}, 3, -0.3, 0.3));
  g.mark_output(logits);
  g.mark_output(h);  // a channels-last graph output, converted when read back
  return g;
}

TEST(CudaLayout, ResnetBlockMatchesCpuAndContiguousPlan) {
  FUSEBOX_REQUIRE_GPU();
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", "0");
  const Graph g = resnet_block(DType::f32);
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_GE(plan.channels_last_values, 10);
  EXPECT_EQ(plan.conversions.size(), 1u) << plan.describe(g);  // the output h
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {4, 16, 20, 20}, 7)}};
  const NamedTensors want = run_graph(g, feeds);
  NamedTensors auto_layout, contiguous;
  {
    ScopedEnv layout("FUSEBOX_LAYOUT", "auto");
    auto_layout = run_graph(g, feeds, {.device = fusebox::Device::cuda});
    // Twice: the second run replays the compiled step (input conversion included).
    NamedTensors again = run_graph(g, feeds, {.device = fusebox::Device::cuda});
    for (const auto& [name, t] : again) EXPECT_TRUE(all_close(t, auto_layout.at(name), 0, 0));
  }
  {
    ScopedEnv layout("FUSEBOX_LAYOUT", "contiguous");
    contiguous = run_graph(g, feeds, {.device = fusebox::Device::cuda});
  }
  for (const auto& [name, t] : want) {
    EXPECT_TRUE(all_close(auto_layout.at(name), t, 1e-4, 1e-5)) << name << " (channels-last)";
    EXPECT_TRUE(all_close(contiguous.at(name), t, 1e-4, 1e-5)) << name << " (contiguous)";
  }
}

TEST(CudaLayout, ResnetBlockBf16) {
  FUSEBOX_REQUIRE_GPU();
  const Graph g = resnet_block(DType::bf16);
  const NamedTensors feeds{{"x", random_tensor(DType::bf16, {4, 16, 20, 20}, 8)}};
  const NamedTensors want = run_graph(g, feeds);
  ScopedEnv layout("FUSEBOX_LAYOUT", "auto");
  const NamedTensors got = run_graph(g, feeds, {.device = fusebox::Device::cuda});
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 5e-2, 5e-2)) << name;
}

// A convolution reading a value that a contiguous-only op wrote (pad, as ONNX exporters
// emit before convolutions): the dispatcher converts it to the output's channels-last order.
TEST(CudaLayout, ConvolutionAfterAContiguousOpMatchesCpu) {
  FUSEBOX_REQUIRE_GPU();
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", "0");
  Graph g("layout_pad_conv");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 8, 9, 9});
  ValueId h =
      b.conv(x, g.add_constant("w1", random_tensor(DType::f32, {16, 8, 3, 3}, 1, -0.2, 0.2)));
  h = b.pad(h, PadAttrs{.pads = {0, 0, 1, 2, 0, 0, 1, 0}});
  ValueId y = b.relu(
      b.conv(h, g.add_constant("w2", random_tensor(DType::f32, {8, 16, 3, 3}, 2, -0.2, 0.2))));
  g.mark_output(y);
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(plan.of(h), MemoryFormat::contiguous);
  EXPECT_EQ(plan.of(y), MemoryFormat::channels_last);
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {2, 8, 9, 9}, 3)}};
  const NamedTensors want = run_graph(g, feeds);
  ScopedEnv layout("FUSEBOX_LAYOUT", "auto");
  const NamedTensors got = run_graph(g, feeds, {.device = fusebox::Device::cuda});
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 1e-4, 1e-5)) << name;
}

// The training graph of a small CNN (autodiff): gradients of the filters (channels-last
// graph inputs and outputs) and of the batch-norm parameters.
TEST(CudaLayout, TrainingGradientsMatchCpu) {
  FUSEBOX_REQUIRE_GPU();
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", "0");
  Graph g("layout_train");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {3, 3, 12, 12});
  ValueId w1 = g.add_input("w1", DType::f32, {8, 3, 3, 3});
  ValueId w2 = g.add_input("w2", DType::f32, {8, 8, 3, 3});
  ValueId s1 = g.add_input("s1", DType::f32, {8});
  auto bn = [&](ValueId v, ValueId scale, const std::string& p, uint64_t seed) {
    return b.batch_norm_training(
        v, scale, g.add_constant(p + ".b", random_tensor(DType::f32, {8}, seed)),
        g.add_constant(p + ".m", random_tensor(DType::f32, {8}, seed + 1)),
        g.add_constant(p + ".v", random_tensor(DType::f32, {8}, seed + 2, 0.5, 1.5)),
        BatchNormAttrs{.training = true})[0];
  };
  const ConvAttrs same{.pads_begin = {1, 1}, .pads_end = {1, 1}};
  ValueId h = b.relu(bn(b.conv(x, w1, kNoValue, same), s1, "bn1", 20));
  h = b.max_pool(h, PoolAttrs{.kernel = {2, 2}, .strides = {2, 2}});
  ValueId s2 = g.add_constant("s2", random_tensor(DType::f32, {8}, 30, 0.5, 1.5));
  ValueId h2 = b.relu(b.add(bn(b.conv(h, w2, kNoValue, same), s2, "bn2", 31), h));
  ValueId t = g.add_input("target", DType::f32, {3, 8, 6, 6});
  ValueId d = b.sub(h2, t);
  ValueId loss = b.reduce_mean(b.mul(d, d), {}, false);
  g.mark_output(loss);
  GradResult r = grad(g, loss, {w1, w2, s1, x});
  for (ValueId v : {w1, w2, s1, x}) g.mark_output(r.of(v));

  const NamedTensors feeds{{"x", random_tensor(DType::f32, {3, 3, 12, 12}, 1)},
                           {"w1", random_tensor(DType::f32, {8, 3, 3, 3}, 2, -0.3, 0.3)},
                           {"w2", random_tensor(DType::f32, {8, 8, 3, 3}, 3, -0.2, 0.2)},
                           {"s1", random_tensor(DType::f32, {8}, 4, 0.5, 1.5)},
                           {"target", random_tensor(DType::f32, {3, 8, 6, 6}, 5)}};
  const NamedTensors want = run_graph(g, feeds);
  ScopedEnv layout("FUSEBOX_LAYOUT", "auto");
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(plan.of(r.of(w1)), MemoryFormat::channels_last) << plan.describe(g);
  const NamedTensors got = run_graph(g, feeds, {.device = fusebox::Device::cuda});
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 2e-4, 2e-5)) << name;
}

// UNet's skip connection in training: the concat's gradient sliced channels-last into the
// gradients its convolutions' backward ops read (one slice a view, one a strided copy), and
// the bias gradient of the convolution that reads a slice reduced in its channels-last order.
TEST(CudaLayout, SkipConnectionGradientsMatchCpu) {
  FUSEBOX_REQUIRE_GPU();
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", "0");
  Graph g("layout_skip");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 8, 10, 10});
  ValueId w1 = g.add_input("w1", DType::f32, {8, 8, 3, 3});
  ValueId w2 = g.add_input("w2", DType::f32, {8, 8, 1, 1});
  ValueId b2 = g.add_input("b2", DType::f32, {8});
  ValueId w3 = g.add_input("w3", DType::f32, {8, 16, 3, 3});
  const ConvAttrs same{.pads_begin = {1, 1}, .pads_end = {1, 1}};
  ValueId skip = b.relu(b.conv(x, w1, kNoValue, same));
  ValueId up = b.conv(skip, w2, b2);
  ValueId y = b.conv(b.concat({skip, up}, 1), w3, kNoValue, same);
  ValueId loss = b.reduce_mean(b.mul(y, y), {}, false);
  g.mark_output(loss);
  GradResult r = grad(g, loss, {w1, w2, b2, w3, x});
  for (ValueId v : {w1, w2, b2, w3, x}) g.mark_output(r.of(v));

  const NamedTensors feeds{{"x", random_tensor(DType::f32, {2, 8, 10, 10}, 1)},
                           {"w1", random_tensor(DType::f32, {8, 8, 3, 3}, 2, -0.2, 0.2)},
                           {"w2", random_tensor(DType::f32, {8, 8, 1, 1}, 3, -0.3, 0.3)},
                           {"b2", random_tensor(DType::f32, {8}, 4)},
                           {"w3", random_tensor(DType::f32, {8, 16, 3, 3}, 5, -0.2, 0.2)}};
  const NamedTensors want = run_graph(g, feeds);
  ScopedEnv layout("FUSEBOX_LAYOUT", "auto");
  const LayoutPlan plan = plan_layouts(g);
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::slice)
      EXPECT_EQ(plan.of(n.outputs[0]), MemoryFormat::channels_last) << plan.describe(g);
  }
  auto exe = Executable::compile(g, {.device = fusebox::Device::cuda, .poison = true});
  const NamedTensors got = exe->run(feeds);
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 2e-4, 2e-5)) << name;
}

// A random f32 constant of `g` in [lo, hi).
ValueId f32_constant(Graph& g, const std::string& name, Shape shape, uint64_t seed, double lo,
                     double hi) {
  return g.add_constant(name, random_tensor(DType::f32, shape, seed, lo, hi));
}

// ConvNeXt's block: depthwise conv -> permute to NHWC -> layer norm -> linear -> GELU ->
// linear -> permute back -> layer scale -> + residual -> conv. Both permutes are compiled as
// views of their inputs (no copy; poisoned outputs elsewhere), and the block and its
// gradients match the CPU.
Graph convnext_block(bool with_gradients) {
  Graph g("layout_convnext");
  Builder b(g);
  auto param = [&](const std::string& name, Shape shape, uint64_t seed, double lo = -0.3,
                   double hi = 0.3) {
    return f32_constant(g, name, std::move(shape), seed, lo, hi);
  };
  ValueId x = g.add_input("x", DType::f32, {2, 16, 7, 7});
  ValueId dw = g.add_input("dw", DType::f32, {16, 1, 7, 7});
  ValueId d = b.conv(x, dw, param("dw.b", {16}, 2),
                     ConvAttrs{.pads_begin = {3, 3}, .pads_end = {3, 3}, .groups = 16});
  ValueId ln = b.layer_norm(b.transpose(d, {0, 2, 3, 1}), param("ln.s", {16}, 3, 0.5, 1.5),
                            param("ln.b", {16}, 4));
  ValueId fc1 = g.add_input("fc1", DType::f32, {16, 64});
  ValueId h = b.gelu(b.matmul(ln, fc1));
  ValueId o = b.matmul(h, param("fc2", {64, 16}, 6));
  ValueId sum = b.add(b.mul(b.transpose(o, {0, 3, 1, 2}), param("gamma", {16, 1, 1}, 7)), x);
  ValueId y = b.conv(sum, param("w2", {8, 16, 1, 1}, 8));
  g.mark_output(y);
  if (with_gradients) {
    ValueId loss = b.reduce_mean(b.mul(y, y), {}, false);
    g.mark_output(loss);
    GradResult r = grad(g, loss, {dw, fc1, x});
    for (ValueId v : {dw, fc1, x}) g.mark_output(r.of(v));
  }
  return g;
}

TEST(CudaLayout, ConvNextPermutesAreViewsAndMatchCpu) {
  FUSEBOX_REQUIRE_GPU();
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", "0");
  ScopedEnv layout("FUSEBOX_LAYOUT", "auto");
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {2, 16, 7, 7}, 1)},
                           {"dw", random_tensor(DType::f32, {16, 1, 7, 7}, 2, -0.2, 0.2)},
                           {"fc1", random_tensor(DType::f32, {16, 64}, 3, -0.3, 0.3)}};
  for (bool with_gradients : {false, true}) {
    const Graph g = convnext_block(with_gradients);
    EXPECT_GE(plan_layouts(g).transpose_views, 2) << plan_layouts(g).describe(g);
    const NamedTensors want = run_graph(g, feeds);
    auto exe = Executable::compile(g, {.device = fusebox::Device::cuda, .poison = true});
    EXPECT_GE(exe->stats().views, 2u) << "gradients " << with_gradients;
    for (int run = 0; run < 2; ++run) {  // the second replays the recorded step
      const NamedTensors got = exe->run(feeds);
      for (const auto& [name, t] : want)
        EXPECT_TRUE(all_close(got.at(name), t, 2e-4, 2e-5))
            << name << " (gradients " << with_gradients << ", run " << run << ")";
    }
  }
}

// A DenseNet-like block: concatenations of channels-last convolution outputs, each read by
// batch norm, ReLU and a convolution; written channels-last, slab by slab.
TEST(CudaLayout, ConcatOfConvolutionsMatchesCpu) {
  FUSEBOX_REQUIRE_GPU();
  ScopedEnv tf32("FUSEBOX_ALLOW_TF32", "0");
  ScopedEnv layout("FUSEBOX_LAYOUT", "auto");
  Graph g("layout_dense");
  Builder b(g);
  auto param = [&](const std::string& name, Shape shape, uint64_t seed, double lo = -0.3,
                   double hi = 0.3) {
    return f32_constant(g, name, std::move(shape), seed, lo, hi);
  };
  ValueId features = g.add_input("x", DType::f32, {2, 8, 9, 9});
  for (int layer = 0; layer < 3; ++layer) {
    const int64_t c = 8 + 4 * layer;
    const std::string p = "l" + std::to_string(layer);
    ValueId h = b.relu(b.batch_norm(features, param(p + ".s", {c}, 10 + layer, 0.5, 1.5),
                                    param(p + ".b", {c}, 20 + layer), param(p + ".m", {c}, 30),
                                    param(p + ".v", {c}, 40, 0.5, 1.5)));
    h = b.conv(h, param(p + ".w", {4, c, 3, 3}, 50 + layer, -0.2, 0.2), kNoValue,
               ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}});
    features = b.concat({features, h}, 1);
  }
  g.mark_output(features);
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(plan.of(features), MemoryFormat::channels_last) << plan.describe(g);
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {2, 8, 9, 9}, 5)}};
  const NamedTensors want = run_graph(g, feeds);
  auto exe = Executable::compile(g, {.device = fusebox::Device::cuda, .poison = true});
  const NamedTensors got = exe->run(feeds);
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 1e-4, 1e-5)) << name;
}

}  // namespace
}  // namespace fusebox::cuda::testing
