// The convolution problem without a GPU: its plan-cache key (every attribute changes it,
// equal problems give equal keys), the 1-D-as-2-D lowering, the high-pad normalisation,
// cudnn_cannot_implement's reasons, and the environment settings (a bad value is a clear
// Error naming the variable).
#include <gtest/gtest.h>

#include <map>

#include "backends/cuda/conv_problem.h"
#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

// A DeviceTensor with no memory: shape, strides and a fake element offset (for alignment).
DeviceTensor fake(DType dtype, Shape shape, Shape strides = {}, int64_t offset = 0) {
  DeviceTensor t;
  t.dtype = dtype;
  t.strides = strides.empty() ? contiguous_strides(shape) : std::move(strides);
  t.shape = std::move(shape);
  t.offset = offset;
  return t;
}

struct Problem {
  OpKind op = OpKind::conv;
  DType dtype = DType::f16;
  Shape x = {2, 8, 10, 10}, w = {16, 8, 3, 3};
  std::vector<int64_t> strides = {1, 1}, dilations = {1, 1}, pb = {1, 1}, pe = {1, 1};
  int64_t groups = 1;
  bool bias = false, channels_last = false;
  int64_t x_offset = 0;
  ConvSettings settings;
  int device = 0;

  ConvConfig config() const {
    ConvConfig c;
    c.op = op, c.dtype = dtype, c.batch = x[0], c.in_channels = x[1], c.out_channels = w[0];
    c.groups = groups;
    c.spatial.assign(x.begin() + 2, x.end());
    c.filter.assign(w.begin() + 2, w.end());
    c.strides = strides, c.dilations = dilations, c.pads_begin = pb, c.pads_end = pe;
    c.bias = bias;
    return c;
  }
  ConvProblem make() const {
    const ConvConfig c = config();
    Shape xs = c.x_shape(), ws = c.w_shape(), ys = c.y_shape();
    auto layout = [&](const Shape& s) {
      return channels_last ? channels_last_strides(s) : contiguous_strides(s);
    };
    DeviceTensor xt = fake(dtype, xs, layout(xs), x_offset), wt = fake(dtype, ws, layout(ws)),
                 yt = fake(dtype, ys, layout(ys));
    DeviceTensor bt = fake(dtype, {op == OpKind::conv ? ws[0] : xs[1]});
    std::vector<Tensor> shapes = {Tensor::empty(dtype, xs), Tensor::empty(dtype, ws),
                                  bias ? Tensor::empty(dtype, bt.shape) : Tensor()};
    if (op == OpKind::conv_backward_data) shapes[0] = Tensor::empty(dtype, ys);
    if (op == OpKind::conv_backward_filter)
      shapes = {Tensor::empty(dtype, xs), Tensor::empty(dtype, ys)};
    const BuiltNode built = build_node(op, c.node_attrs(), shapes);
    const DeviceTensor* b = bias ? &bt : nullptr;
    switch (op) {
      case OpKind::conv_backward_data:
        return make_conv_problem(built.node, {&yt, &wt, b}, xt, settings, device);
      case OpKind::conv_backward_filter:
        return make_conv_problem(built.node, {&xt, &yt}, wt, settings, device);
      default:
        return make_conv_problem(built.node, {&xt, &wt, b}, yt, settings, device);
    }
  }
};

TEST(ConvProblemKey, EveryAttributeChangesTheKey) {
  std::vector<std::pair<std::string, Problem>> variants;
  Problem base;
  variants.emplace_back("base", base);
  auto add = [&](const std::string& name, auto change) {
    Problem p = base;
    change(p);
    variants.emplace_back(name, p);
  };
  add("dgrad", [](Problem& p) { p.op = OpKind::conv_backward_data; });
  add("wgrad", [](Problem& p) { p.op = OpKind::conv_backward_filter; });
  add("dtype", [](Problem& p) { p.dtype = DType::bf16; });
  add("batch", [](Problem& p) { p.x[0] = 3; });
  add("channels", [](Problem& p) { p.x[1] = 16, p.w[1] = 16; });
  add("out channels", [](Problem& p) { p.w[0] = 8; });
  add("height", [](Problem& p) { p.x[2] = 11; });
  add("width", [](Problem& p) { p.x[3] = 12; });
  add("filter", [](Problem& p) { p.w[2] = 5, p.pb = {2, 1}, p.pe = {2, 1}; });
  add("stride", [](Problem& p) { p.strides = {2, 1}; });
  add("dilation", [](Problem& p) { p.dilations = {1, 2}; });
  add("pad low", [](Problem& p) { p.pb = {0, 1}; });
  // The high pad is implied by D, O and the low pad (up to stride - 1 of slack, which
  // effective_pad_hi normalises away), so it changes the key together with the width.
  add("pad high", [](Problem& p) { p.pe = {1, 0}, p.x[3] = 11; });
  add("groups", [](Problem& p) { p.groups = 2, p.w[1] = 4; });
  add("depthwise", [](Problem& p) { p.groups = 8, p.w = {8, 1, 3, 3}; });
  add("bias", [](Problem& p) { p.bias = true; });
  add("layout", [](Problem& p) { p.channels_last = true; });
  add("alignment", [](Problem& p) { p.x_offset = 1; });  // 2-byte aligned x
  add("device", [](Problem& p) { p.device = 1; });
  add("tf32", [](Problem& p) { p.settings.allow_tf32 = false; });
  add("deterministic", [](Problem& p) { p.settings.deterministic = true; });
  add("1d", [](Problem& p) {
    p.x = {2, 8, 10}, p.w = {16, 8, 3}, p.strides = {1}, p.dilations = {1}, p.pb = {1}, p.pe = {1};
  });
  add("3d", [](Problem& p) {
    p.x = {2, 8, 4, 10, 10}, p.w = {16, 8, 1, 3, 3}, p.strides = {1, 1, 1}, p.dilations = {1, 1, 1},
    p.pb = {0, 1, 1}, p.pe = {0, 1, 1};
  });
  std::map<std::string, std::string> seen;
  for (const auto& [name, p] : variants) {
    SCOPED_TRACE(name);
    const std::string key = conv_problem_key(p.make());
    EXPECT_EQ(key, conv_problem_key(p.make())) << "equal problems, equal keys";
    auto [it, fresh] = seen.emplace(key, name);
    EXPECT_TRUE(fresh) << name << " has the same key as " << it->second;
  }
  // The human-readable form names the fields.
  const std::string text = conv_problem_key_text(base.make());
  for (const char* field : {"op", "x.dims", "x.strides", "x.align", "w.dims", "pad_lo", "pad_hi",
                            "stride", "dilation", "groups", "tf32", "deterministic"}) {
    EXPECT_NE(text.find(field), std::string::npos) << field << " missing in " << text;
  }
}

TEST(ConvProblemKey, OneDimensionalIsLoweredToTwo) {
  Problem p;
  p.x = {2, 8, 20}, p.w = {16, 8, 3}, p.strides = {2}, p.dilations = {2}, p.pb = {2}, p.pe = {1};
  for (bool channels_last : {false, true}) {
    p.channels_last = channels_last;
    const ConvProblem c = p.make();
    EXPECT_EQ(c.spatial_rank, 1);
    EXPECT_EQ(c.lowered_spatial_rank(), 2);
    EXPECT_EQ(c.x.dims, (std::vector<int64_t>{2, 8, 1, 20}));
    EXPECT_EQ(c.w.dims, (std::vector<int64_t>{16, 8, 1, 3}));
    // O = (20 + 3 - 5) / 2 + 1 = 10
    EXPECT_EQ(c.y.dims, (std::vector<int64_t>{2, 16, 1, 10}));
    EXPECT_EQ(c.stride, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(c.dilation, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(c.pad_lo, (std::vector<int64_t>{0, 2}));
    if (channels_last) {
      // NLC stays NHWC-packed: [N, C, 1, L] strides [L*C, 1, L*C, C].
      EXPECT_EQ(c.x.strides, (std::vector<int64_t>{160, 1, 160, 8}));
      EXPECT_NE(c.describe().find("nhwc"), std::string::npos) << c.describe();
    } else {
      EXPECT_EQ(c.x.strides, (std::vector<int64_t>{160, 20, 20, 1}));
      EXPECT_NE(c.describe().find("nchw"), std::string::npos) << c.describe();
    }
  }
}

TEST(ConvProblemKey, HighPadIsMadeSymmetricWhenTheOutputAllowsIt) {
  // ResNet's stride-2 3x3 on 56: pads 1/1 give O = 28, and so would 1/0.
  EXPECT_EQ(effective_pad_hi(56, 28, 3, 2, 1, 1, 0), 1);
  EXPECT_EQ(effective_pad_hi(56, 28, 3, 2, 1, 1, 1), 1);
  // 1/2 with stride 1 changes O against 1/1: kept.
  EXPECT_EQ(effective_pad_hi(10, 11, 3, 1, 1, 1, 2), 2);
  // Low pad 2 would give a larger output: the node's high pad stays.
  EXPECT_EQ(effective_pad_hi(10, 9, 3, 1, 1, 2, 0), 0);
  Problem p;
  p.pb = {1, 1}, p.pe = {0, 0}, p.strides = {2, 2}, p.x = {1, 8, 10, 10};  // O = 5 either way
  const ConvProblem c = p.make();
  EXPECT_EQ(c.pad_hi, (std::vector<int64_t>{1, 1}));
}

TEST(ConvProblemKey, CannotImplementSaysWhy) {
  Problem p;
  EXPECT_FALSE(cudnn_cannot_implement(p.make()).has_value());
  p.dtype = DType::f64;
  auto why = cudnn_cannot_implement(p.make());
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("f64"), std::string::npos) << *why;
  p.dtype = DType::f16;
  p.x_offset = 1;  // an element offset: 2-byte aligned x, fine for cuDNN
  const ConvProblem c = p.make();
  EXPECT_EQ(c.x.alignment, 2u);
  EXPECT_EQ(c.w.alignment, 256u);  // no buffer: address 0
  EXPECT_FALSE(cudnn_cannot_implement(c).has_value());
  ConvProblem mixed = c;
  mixed.w.dtype = DType::bf16;
  why = cudnn_cannot_implement(mixed);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("mixed"), std::string::npos) << *why;
}

TEST(ConvProblemKey, BroadcastInputIsRefused) {
  Problem p;
  ConvProblem c = p.make();
  c.w.strides[0] = 0;  // a broadcast view of the filter
  const auto why = cudnn_cannot_implement(c);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("stride 0"), std::string::npos) << *why;
}

TEST(ConvProblemKey, GroupedAsymmetricWgradIsRefusedOnlyThere) {
  Problem p;
  ConvProblem c = p.make();
  c.op = ConvOp::wgrad;
  c.groups = 3;
  c.pad_lo.assign(c.pad_lo.size(), 1);
  c.pad_hi.assign(c.pad_hi.size(), 1);
  EXPECT_FALSE(cudnn_cannot_implement(c).has_value());  // symmetric: cuDNN
  c.pad_hi.back() = 0;
  const auto why = cudnn_cannot_implement(c);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("asymmetric"), std::string::npos) << *why;
  c.groups = 1;  // ungrouped: cuDNN
  EXPECT_FALSE(cudnn_cannot_implement(c).has_value());
  c.groups = 3;
  c.op = ConvOp::fprop;  // fprop and dgrad: cuDNN
  EXPECT_FALSE(cudnn_cannot_implement(c).has_value());
}

TEST(ConvProblemKey, MismatchedShapesAreAnErrorNamingTheNode) {
  Problem p;
  ConvConfig c = p.config();
  const BuiltNode built =
      build_node(OpKind::conv, c.node_attrs(),
                 {Tensor::empty(DType::f16, c.x_shape()), Tensor::empty(DType::f16, c.w_shape())});
  DeviceTensor x = fake(DType::f16, c.x_shape()), w = fake(DType::f16, c.w_shape());
  DeviceTensor y = fake(DType::f16, {2, 16, 9, 10});  // wrong height
  try {
    make_conv_problem(built.node, {&x, &w}, y, ConvSettings{}, 0);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv 'node'"), std::string::npos) << e.what();
  }
}

TEST(ConvSettingsEnv, ParsesEveryVariable) {
  {
    ScopedEnv a("FUSEBOX_CONV_BACKEND", std::nullopt), b("FUSEBOX_ALLOW_TF32", std::nullopt),
        c("FUSEBOX_DETERMINISTIC", std::nullopt), d("FUSEBOX_AUTOTUNE", std::nullopt),
        e("FUSEBOX_CONV_PLAN_CACHE", std::nullopt);
    const ConvSettings s = ConvSettings::from_env();
    EXPECT_EQ(s.backend, ConvBackend::automatic);
    EXPECT_TRUE(s.allow_tf32);
    EXPECT_FALSE(s.deterministic);
    EXPECT_FALSE(s.autotune);
    EXPECT_EQ(s.plan_cache_capacity, 256u);
  }
  {
    ScopedEnv a("FUSEBOX_CONV_BACKEND", "own"), b("FUSEBOX_ALLOW_TF32", "0"),
        c("FUSEBOX_DETERMINISTIC", "1"), d("FUSEBOX_AUTOTUNE", "1"),
        e("FUSEBOX_CONV_PLAN_CACHE", "7");
    const ConvSettings s = ConvSettings::from_env();
    EXPECT_EQ(s.backend, ConvBackend::own);
    EXPECT_FALSE(s.allow_tf32);
    EXPECT_TRUE(s.deterministic);
    EXPECT_TRUE(s.autotune);
    EXPECT_EQ(s.plan_cache_capacity, 7u);
  }
  ScopedEnv a("FUSEBOX_CONV_BACKEND", "cudnn");
  EXPECT_EQ(ConvSettings::from_env().backend, ConvBackend::cudnn);
  ScopedEnv b("FUSEBOX_AUTOTUNE", "0");
  set_conv_autotune_override(true);  // fusebox run --autotune
  EXPECT_TRUE(ConvSettings::from_env().autotune);
  set_conv_autotune_override(std::nullopt);
  EXPECT_FALSE(ConvSettings::from_env().autotune);
}

TEST(ConvSettingsEnv, BadValuesAreClearErrors) {
  const std::pair<const char*, const char*> bad[] = {
      {"FUSEBOX_CONV_BACKEND", "cuda"}, {"FUSEBOX_CONV_BACKEND", "AUTO"},
      {"FUSEBOX_ALLOW_TF32", "yes"},    {"FUSEBOX_ALLOW_TF32", "2"},
      {"FUSEBOX_AUTOTUNE", "on"},       {"FUSEBOX_DETERMINISTIC", "true"},
      {"FUSEBOX_CONV_PLAN_CACHE", "-1"}};
  for (const auto& [name, value] : bad) {
    SCOPED_TRACE(cat(name, "=", value));
    ScopedEnv env(name, value);
    try {
      ConvSettings::from_env();
      ADD_FAILURE() << "expected an Error";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(name), std::string::npos) << message;
      EXPECT_NE(message.find(value), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
