// The convolution problem without a GPU: its plan-cache key (every attribute changes it,
// equal problems give equal keys), the 1-D-as-2-D lowering, the high-pad normalisation,
// cudnn_cannot_implement's reasons, and the environment settings (a bad value is a clear
// Error naming the variable).
#include <gtest/gtest.h>

#include <map>

#include "backends/cuda/kernels/conv/problem.h"
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
  add("forced plan", [](Problem& p) { p.settings.forced_plan_index = 0; });
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
  // The lowering: a problem that differs from another only in it has another key.
  ConvProblem lowered = base.make();
  const std::string standard_key = conv_problem_key(lowered);
  lowered.lowering = ConvLowering::subsampled_1x1;
  EXPECT_NE(conv_problem_key(lowered), standard_key);
  EXPECT_NE(conv_problem_key_text(lowered).find("lowering"), std::string::npos);
  // The standard lowering adds no field: keys (and disk files) of earlier releases hold.
  EXPECT_EQ(conv_problem_key_text(base.make()).find("lowering"), std::string::npos);
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

// The subsampled-1x1 lowering: a stride-1 1x1 over a strided view of x, for fprop with a
// 1x1 filter, zero pads, stride > 1 and one group only.
TEST(ConvProblemKey, SubsampledOneByOneIsAStridedView) {
  Problem p;
  p.op = OpKind::conv;
  p.x = {64, 1024, 14, 14}, p.w = {2048, 1024, 1, 1};
  p.strides = {2, 2}, p.pb = {0, 0}, p.pe = {0, 0};
  p.channels_last = true;
  const ConvProblem c = p.make();
  const std::optional<ConvProblem> v = subsampled_1x1(c);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->lowering, ConvLowering::subsampled_1x1);
  EXPECT_EQ(v->x.dims, (std::vector<int64_t>{64, 1024, 7, 7}));
  // NHWC strides [HWC, 1, WC, C] with H and W steps doubled.
  EXPECT_EQ(v->x.strides, (std::vector<int64_t>{14 * 14 * 1024, 1, 2 * 14 * 1024, 2 * 1024}));
  EXPECT_EQ(v->stride, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(v->y.dims, c.y.dims);
  EXPECT_EQ(v->y.strides, c.y.strides);
  EXPECT_EQ(v->w.dims, c.w.dims);
  EXPECT_EQ(v->x.alignment, c.x.alignment);
  EXPECT_FALSE(cudnn_cannot_implement(*v).has_value());
  EXPECT_NE(v->describe().find("subsampled_1x1"), std::string::npos) << v->describe();
  EXPECT_NE(conv_problem_key(*v), conv_problem_key(c));
  EXPECT_FALSE(subsampled_1x1(*v).has_value()) << "a lowered problem is not lowered again";

  // NCHW, odd extent and stride 3 on one dim only: O = (13 - 1) / 3 + 1 = 5, 7.
  p.channels_last = false;
  p.x = {2, 8, 13, 7}, p.w = {4, 8, 1, 1}, p.strides = {3, 1};
  const ConvProblem nchw = p.make();
  const std::optional<ConvProblem> w = subsampled_1x1(nchw);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->x.dims, (std::vector<int64_t>{2, 8, 5, 7}));
  EXPECT_EQ(w->x.strides, (std::vector<int64_t>{8 * 13 * 7, 13 * 7, 3 * 7, 1}));
  // The view never reaches past x: the last element's offset is within x's.
  int64_t last = 0, x_last = 0;
  for (size_t i = 0; i < 4; ++i) {
    last += (w->x.dims[i] - 1) * w->x.strides[i];
    x_last += (nchw.x.dims[i] - 1) * nchw.x.strides[i];
  }
  EXPECT_LE(last, x_last);

  // 1-D (lowered to 2-D, the inserted dim untouched) and 3-D.
  Problem one = p;
  one.x = {2, 8, 9}, one.w = {4, 8, 1}, one.strides = {2}, one.dilations = {1}, one.pb = {0},
  one.pe = {0};
  const std::optional<ConvProblem> o = subsampled_1x1(one.make());
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->x.dims, (std::vector<int64_t>{2, 8, 1, 5}));
  EXPECT_EQ(o->x.strides, (std::vector<int64_t>{72, 9, 9, 2}));
  Problem three = p;
  three.x = {1, 4, 5, 6, 7}, three.w = {4, 4, 1, 1, 1}, three.strides = {2, 2, 3},
  three.dilations = {1, 1, 1}, three.pb = {0, 0, 0}, three.pe = {0, 0, 0};
  const std::optional<ConvProblem> t = subsampled_1x1(three.make());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->x.dims, (std::vector<int64_t>{1, 4, 3, 3, 3}));
  EXPECT_EQ(t->x.strides, (std::vector<int64_t>{840, 210, 84, 14, 3}));

  // Not applicable: stride 1, padding, a 3x3 filter, groups, dgrad, wgrad.
  auto refused = [&](const char* what, auto change) {
    Problem q = p;
    change(q);
    EXPECT_FALSE(subsampled_1x1(q.make()).has_value()) << what;
  };
  refused("stride 1", [](Problem& q) { q.strides = {1, 1}; });
  refused("padding", [](Problem& q) { q.pb = {1, 0}, q.pe = {1, 0}; });
  refused("3x3", [](Problem& q) { q.w = {4, 8, 3, 3}, q.pb = {1, 1}, q.pe = {1, 1}; });
  refused("groups", [](Problem& q) { q.groups = 2, q.w = {4, 4, 1, 1}; });
  refused("dgrad", [](Problem& q) { q.op = OpKind::conv_backward_data; });
  refused("wgrad", [](Problem& q) { q.op = OpKind::conv_backward_filter; });
}

// Grouped 3-D half-precision wgrads bar the two engines found wrong on the H100 (and say so
// in the key); nothing else does; the diagnosis switch lifts the bar. Asymmetric padding is
// no reason to refuse cuDNN any more.
TEST(ConvProblemKey, KnownWrongEnginesAreBarredAndKeyed) {
  Problem p;
  p.op = OpKind::conv_backward_filter;
  p.dtype = DType::bf16;
  p.x = {3, 9, 3, 7, 4}, p.w = {6, 3, 3, 1, 3}, p.groups = 3;  // the matrix's config 191
  p.strides = {1, 1, 1}, p.dilations = {1, 1, 1}, p.pb = {0, 0, 2}, p.pe = {0, 0, 0};
  const ConvProblem barred = p.make();
  EXPECT_FALSE(cudnn_cannot_implement(barred).has_value());
  EXPECT_EQ(barred_engines(barred), (std::vector<std::string>{"eng1", "eng20"}));
  EXPECT_NE(conv_problem_key_text(barred).find("barred_engine"), std::string::npos);
  p.settings.allow_barred_engines = true;
  const ConvProblem allowed = p.make();
  EXPECT_TRUE(barred_engines(allowed).empty());
  EXPECT_NE(conv_problem_key(allowed), conv_problem_key(barred));
  p.settings.allow_barred_engines = false;
  for (DType t : {DType::f32}) {  // f32: every engine right in the probe
    p.dtype = t;
    EXPECT_TRUE(barred_engines(p.make()).empty());
  }
  p.dtype = DType::f16;
  EXPECT_FALSE(barred_engines(p.make()).empty());
  p.groups = 1, p.w = {6, 9, 3, 1, 3};  // ungrouped
  EXPECT_TRUE(barred_engines(p.make()).empty());
  Problem two_d;  // 2-D grouped wgrad with asymmetric padding: not barred, not refused
  two_d.op = OpKind::conv_backward_filter;
  two_d.dtype = DType::bf16;
  two_d.groups = 2, two_d.w = {16, 4, 3, 3};
  two_d.pb = {1, 1}, two_d.pe = {0, 1};
  EXPECT_TRUE(barred_engines(two_d.make()).empty());
  EXPECT_FALSE(cudnn_cannot_implement(two_d.make()).has_value());
  // Grouped half-precision dgrad with asymmetric pads: eng6 left dx elements unwritten.
  Problem dgrad = two_d;
  dgrad.op = OpKind::conv_backward_data;
  EXPECT_EQ(barred_engines(dgrad.make()), (std::vector<std::string>{"eng6"}));
  dgrad.pe = {1, 1};  // symmetric
  EXPECT_TRUE(barred_engines(dgrad.make()).empty());
  dgrad.pe = {0, 1}, dgrad.dtype = DType::f32;
  EXPECT_TRUE(barred_engines(dgrad.make()).empty());
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
        e("FUSEBOX_CONV_PLAN_CACHE", std::nullopt), f("FUSEBOX_CONV_AUTOTUNE_MODE_B", std::nullopt),
        g("FUSEBOX_CONV_AUTOTUNE_CANDIDATES", std::nullopt),
        h("FUSEBOX_CONV_SUBSAMPLE_1X1", std::nullopt),
        i("FUSEBOX_CONV_ALLOW_BARRED_ENGINES", std::nullopt),
        j("FUSEBOX_CONV_PLAN_INDEX", std::nullopt);
    const ConvSettings s = conv_settings();
    EXPECT_EQ(s.backend, ConvBackend::automatic);
    EXPECT_TRUE(s.allow_tf32);
    EXPECT_FALSE(s.deterministic);
    EXPECT_FALSE(s.autotune);
    EXPECT_EQ(s.plan_cache_capacity, 256u);
    EXPECT_FALSE(s.autotune_mode_b);
    EXPECT_EQ(s.autotune_candidates, 48u);
    EXPECT_EQ(s.subsample_1x1, ConvSubsample::off);
    EXPECT_FALSE(s.allow_barred_engines);
    EXPECT_EQ(s.forced_plan_index, -1);
  }
  {
    ScopedEnv a("FUSEBOX_CONV_BACKEND", "own"), b("FUSEBOX_ALLOW_TF32", "0"),
        c("FUSEBOX_DETERMINISTIC", "1"), d("FUSEBOX_AUTOTUNE", "1"),
        e("FUSEBOX_CONV_PLAN_CACHE", "7"), f("FUSEBOX_CONV_AUTOTUNE_MODE_B", "1"),
        g("FUSEBOX_CONV_AUTOTUNE_CANDIDATES", "0"), h("FUSEBOX_CONV_SUBSAMPLE_1X1", "1"),
        i("FUSEBOX_CONV_ALLOW_BARRED_ENGINES", "1"), j("FUSEBOX_CONV_PLAN_INDEX", "3");
    const ConvSettings s = conv_settings();
    EXPECT_EQ(s.backend, ConvBackend::own);
    EXPECT_FALSE(s.allow_tf32);
    EXPECT_TRUE(s.deterministic);
    EXPECT_TRUE(s.autotune);
    EXPECT_EQ(s.plan_cache_capacity, 7u);
    EXPECT_TRUE(s.autotune_mode_b);
    EXPECT_EQ(s.autotune_candidates, 0u);
    EXPECT_EQ(s.subsample_1x1, ConvSubsample::on);
    EXPECT_TRUE(s.allow_barred_engines);
    EXPECT_EQ(s.forced_plan_index, 3);
  }
  {
    ScopedEnv h("FUSEBOX_CONV_SUBSAMPLE_1X1", "auto");
    EXPECT_EQ(conv_settings().subsample_1x1, ConvSubsample::automatic);
  }
  ScopedEnv a("FUSEBOX_CONV_BACKEND", "cudnn");
  EXPECT_EQ(conv_settings().backend, ConvBackend::cudnn);
  ScopedEnv b("FUSEBOX_AUTOTUNE", "0");
  set_conv_autotune_override(true);  // fusebox run --autotune
  EXPECT_TRUE(conv_settings().autotune);
  set_conv_autotune_override(std::nullopt);
  EXPECT_FALSE(conv_settings().autotune);
}

TEST(ConvSettingsEnv, BadValuesAreClearErrors) {
  const std::pair<const char*, const char*> bad[] = {{"FUSEBOX_CONV_BACKEND", "cuda"},
                                                     {"FUSEBOX_CONV_BACKEND", "AUTO"},
                                                     {"FUSEBOX_ALLOW_TF32", "yes"},
                                                     {"FUSEBOX_ALLOW_TF32", "2"},
                                                     {"FUSEBOX_AUTOTUNE", "on"},
                                                     {"FUSEBOX_DETERMINISTIC", "true"},
                                                     {"FUSEBOX_CONV_PLAN_CACHE", "-1"},
                                                     {"FUSEBOX_CONV_AUTOTUNE_MODE_B", "yes"},
                                                     {"FUSEBOX_CONV_AUTOTUNE_CANDIDATES", "many"},
                                                     {"FUSEBOX_CONV_SUBSAMPLE_1X1", "on"},
                                                     {"FUSEBOX_CONV_ALLOW_BARRED_ENGINES", "2"},
                                                     {"FUSEBOX_CONV_PLAN_INDEX", "-1"}};
  for (const auto& [name, value] : bad) {
    SCOPED_TRACE(cat(name, "=", value));
    ScopedEnv env(name, value);
    try {
      conv_settings();
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
