// The mixed-precision pass (passes/mixed_precision.h): where the casts go on small graphs
// and on the zoo ResNet-18, that f32 / tf32 change nothing, and how far the bf16 / f16
// graphs' logits and gradients (autodiff through the inserted casts, cross_entropy on the
// f32 logits) are from the f32 graph's on the CPU. Tolerances are stated at each test;
// docs/mixed_precision.md lists the measured values.
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/mixed_precision.h"
#include "fusebox/zoo.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

// The zoo models at 32x32, 10 classes, seeded weights (f32 parameters as constants).
Graph zoo(const std::string& name, int64_t batch, bool training) {
  return build_zoo_model(
      name, {.batch = batch, .image_size = 32, .num_classes = 10, .seed = 7, .training = training});
}

Graph resnet18(bool training) {
  return zoo("resnet18", 4, training);
}

ValueId find(const Graph& g, const std::string& name) {
  auto v = g.find_value(name);
  EXPECT_TRUE(v.has_value()) << name;
  return v.value_or(kNoValue);
}

DType dtype_of(const Graph& g, ValueId v) {
  return g.value(v).type.dtype;
}

// max |a - b| / max |b|, and ||a - b|| / ||b|| (any dtypes, same shape).
struct Difference {
  double max_rel = 0, l2_rel = 0;
};
Difference difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double max_diff = 0, max_ref = 0, diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = a.get(i) - b.get(i);
    max_diff = std::max(max_diff, std::abs(d));
    max_ref = std::max(max_ref, std::abs(b.get(i)));
    diff2 += d * d;
    ref2 += b.get(i) * b.get(i);
  }
  return {max_diff / std::max(max_ref, 1e-30), std::sqrt(diff2 / std::max(ref2, 1e-60))};
}

TEST(MixedPrecision, PrecisionNames) {
  for (Precision p : {Precision::f32, Precision::tf32, Precision::bf16, Precision::f16})
    EXPECT_EQ(parse_precision(precision_name(p)), p);
  EXPECT_EQ(precision_dtype(Precision::bf16), DType::bf16);
  EXPECT_EQ(precision_dtype(Precision::f16), DType::f16);
  EXPECT_EQ(precision_dtype(Precision::tf32), DType::f32);
  try {
    parse_precision("fp8");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown precision 'fp8' (choose f32, tf32, bf16 or f16)"),
              std::string::npos)
        << e.what();
  }
}

TEST(MixedPrecision, RulesFollowAutocastLists) {
  for (OpKind op : {OpKind::conv, OpKind::conv_backward_data, OpKind::matmul, OpKind::gemm})
    EXPECT_EQ(autocast_rule(op), AutocastRule::low) << op_name(op);
  for (OpKind op : {OpKind::softmax, OpKind::log_softmax, OpKind::cross_entropy, OpKind::reduce_sum,
                    OpKind::reduce_mean, OpKind::layer_norm, OpKind::rms_norm, OpKind::exp,
                    OpKind::log, OpKind::pow, OpKind::reciprocal, OpKind::rsqrt})
    EXPECT_EQ(autocast_rule(op), AutocastRule::f32) << op_name(op);
  for (OpKind op : {OpKind::relu, OpKind::add, OpKind::max_pool, OpKind::global_avg_pool,
                    OpKind::concat, OpKind::reshape, OpKind::reduce_max, OpKind::cast})
    EXPECT_EQ(autocast_rule(op), AutocastRule::follow) << op_name(op);
  EXPECT_EQ(autocast_rule(OpKind::batch_norm), AutocastRule::batch_norm);
  for (OpKind op : {OpKind::batch_norm_backward, OpKind::conv_backward_filter, OpKind::sgd_update})
    EXPECT_EQ(autocast_rule(op), AutocastRule::keep) << op_name(op);
}

TEST(MixedPrecision, F32AndTf32LeaveTheGraphIdentical) {
  const Graph g = resnet18(false);
  for (Precision p : {Precision::f32, Precision::tf32}) {
    MixedPrecisionReport report;
    report.casts_inserted = 99;
    const Graph same = apply_mixed_precision(g, p, &report);
    EXPECT_EQ(same.dump(), g.dump()) << precision_name(p);
    EXPECT_EQ(report.casts_inserted, 0);
    EXPECT_EQ(report.ops_low, 0);
  }
}

// matmul (low) -> add with an f32 bias (promotes to f32, as PyTorch's bf16 + f32) ->
// mul by a scalar literal (a constant node: folded to f32, no cast) -> softmax (f32);
// a second matmul reads w again (one shared cast) and feeds layer_norm (f32 statistics)
// and relu (stays bf16, its output cast back for the graph output).
TEST(MixedPrecision, CastsOnASmallGraph) {
  Graph g("small");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 4});
  const ValueId w = g.add_constant("w", random_tensor(DType::f32, {4, 4}, 1));
  const ValueId bias = g.add_constant("bias", random_tensor(DType::f32, {4}, 2));
  // One node per statement: Builder::name names the next node added.
  const ValueId h = b.name("mm").matmul(x, w);
  const ValueId biased = b.name("biased").add(h, bias);
  const ValueId half = b.name("half").constant(Tensor::scalar(DType::f32, 0.5));
  const ValueId scaled = b.name("scaled").mul(biased, half);
  const ValueId p = b.name("probs").softmax(scaled);
  const ValueId act = b.name("act").relu(h);
  const ValueId h2 = b.name("mm2").matmul(act, w);
  const ValueId ln = b.name("ln").layer_norm(h2, kNoValue, kNoValue);
  const ValueId act2 = b.name("act2").relu(h2);
  g.mark_output(p);
  g.mark_output(ln);
  g.mark_output(act2);

  MixedPrecisionReport report;
  const Graph amp = apply_mixed_precision(g, Precision::bf16, &report);
  auto node = [&](const std::string& name) -> const Node& {
    for (const Node& n : amp.nodes())
      if (n.name == name) return n;
    ADD_FAILURE() << "no node " << name;
    return amp.nodes().front();
  };
  for (const char* mm : {"mm", "mm2"}) {
    for (ValueId v : node(mm).inputs) EXPECT_EQ(dtype_of(amp, v), DType::bf16) << mm;
  }
  EXPECT_EQ(node("mm").inputs[1], node("mm2").inputs[1]) << "one cast of w, shared";
  EXPECT_EQ(dtype_of(amp, node("biased").outputs[0]), DType::f32) << "bf16 + f32 promotes";
  EXPECT_EQ(dtype_of(amp, node("probs").outputs[0]), DType::f32);
  EXPECT_EQ(dtype_of(amp, node("act").outputs[0]), DType::bf16);
  EXPECT_EQ(dtype_of(amp, node("ln").inputs[0]), DType::f32);
  EXPECT_EQ(dtype_of(amp, node("act2").outputs[0]), DType::bf16);
  // Graph outputs keep their names and dtypes.
  ASSERT_EQ(amp.outputs().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(amp.value(amp.outputs()[i]).name, g.value(g.outputs()[i]).name);
    EXPECT_EQ(amp.value(amp.outputs()[i]).type, g.value(g.outputs()[i]).type);
  }
  // Casts: x, w (once), mm's output up for the add and for ln's f32, act2 back to f32.
  EXPECT_EQ(report.casts_inserted, 5);
  EXPECT_EQ(report.outputs_cast, 1);
  EXPECT_EQ(report.ops_low, 2);
  EXPECT_EQ(report.ops_f32, 2);
  EXPECT_EQ(report.constants_folded, 0);
  EXPECT_TRUE(amp.is_constant(find(amp, "w")));
  EXPECT_EQ(dtype_of(amp, find(amp, "w")), DType::f32) << "master weights stay f32";

  // Folding constants (inference graphs): w becomes a bf16 constant and the f32 copy goes;
  // the bias, a constant too, no longer promotes the add: it is folded to bf16 (so is the
  // scalar literal the bf16 sum is then scaled by), as in a bf16 model.
  const Graph folded = apply_mixed_precision(g, Precision::bf16, &report, {.fold_constants = true});
  EXPECT_EQ(report.constants_folded, 3);
  for (const Node& n : folded.nodes()) {
    if (n.name == "biased") {
      EXPECT_EQ(dtype_of(folded, n.outputs[0]), DType::bf16);
    }
  }
  EXPECT_FALSE(folded.find_value("w").has_value());
  const ValueId w16 = find(folded, "w:bf16");
  EXPECT_TRUE(folded.is_constant(w16));
  EXPECT_EQ(dtype_of(folded, w16), DType::bf16);

  // Same results on the CPU within bf16's rounding.
  const NamedTensors feeds = {{"x", random_tensor(DType::f32, {2, 4}, 3)}};
  const NamedTensors want = run_graph(g, feeds), got = run_graph(amp, feeds);
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 3e-2, 3e-2)) << name;
}

// A position embedding (a graph constant) added to a low product: autocast's promotion makes
// the sum f32 (and everything after it) in training; in inference, constants folded, the
// embedding is folded to bf16 and the sum stays bf16, as in a bf16 model. An f32 graph input
// still promotes.
TEST(MixedPrecision, FoldedConstantsDoNotPromote) {
  Graph g("embed");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 3, 8});
  const ValueId h = b.matmul(x, g.add_constant("w", random_tensor(DType::f32, {8, 8}, 1)));
  const ValueId pos = g.add_constant("pos", random_tensor(DType::f32, {1, 3, 8}, 2));
  const ValueId y = b.name("embed").add(h, pos);
  g.rename_value(y, "y");
  g.mark_output(y);
  const ValueId z = b.name("shift").add(h, g.add_input("offset", DType::f32, {1, 3, 8}));
  g.rename_value(z, "z");
  g.mark_output(z);
  auto sum_dtype = [](const Graph& amp, const char* node) {
    for (const Node& n : amp.nodes())
      if (n.name == node) return amp.value(n.outputs[0]).type.dtype;
    return DType::boolean;
  };
  const Graph trained = apply_mixed_precision(g, Precision::bf16);
  EXPECT_EQ(sum_dtype(trained, "embed"), DType::f32);
  const Graph folded = apply_mixed_precision(g, Precision::bf16, nullptr, {.fold_constants = true});
  EXPECT_EQ(sum_dtype(folded, "embed"), DType::bf16);
  EXPECT_EQ(sum_dtype(folded, "shift"), DType::f32);  // an input, not a weight: it promotes
  EXPECT_EQ(folded.value(*folded.find_value("y")).type.dtype, DType::f32);  // cast back out
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {2, 3, 8}, 3)},
                           {"offset", random_tensor(DType::f32, {1, 3, 8}, 4)}};
  const NamedTensors want = run_graph(g, feeds), got = run_graph(folded, feeds);
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 3e-2, 3e-2)) << name;
}

// Every conv / gemm reads bf16 (weights through one cast each); batch norm reads bf16 x and
// its f32 parameters and statistics directly; the logits come back f32 under their name.
TEST(MixedPrecision, ResNet18Dtypes) {
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training form" : "inference form");
    const Graph g = resnet18(training);
    MixedPrecisionReport report;
    const Graph amp = apply_mixed_precision(g, Precision::bf16, &report);
    EXPECT_NO_THROW(amp.verify());
    int convs = 0, bns = 0, weight_casts = 0;
    for (const Node& n : amp.nodes()) {
      if (n.op == OpKind::conv || n.op == OpKind::gemm) {
        ++convs;
        for (ValueId v : n.inputs) {
          if (v != kNoValue) {
            EXPECT_EQ(dtype_of(amp, v), DType::bf16) << n.name;
          }
        }
        EXPECT_EQ(dtype_of(amp, n.outputs[0]), DType::bf16) << n.name;
      } else if (n.op == OpKind::batch_norm) {
        ++bns;
        EXPECT_EQ(dtype_of(amp, n.inputs[0]), DType::bf16) << n.name;
        for (size_t i = 1; i <= 4; ++i) {
          EXPECT_EQ(dtype_of(amp, n.inputs[i]), DType::f32) << n.name;
          EXPECT_TRUE(amp.is_constant(n.inputs[i])) << n.name << " reads its parameters directly";
        }
        for (size_t o = 1; o < n.outputs.size(); ++o)
          EXPECT_EQ(dtype_of(amp, n.outputs[o]), DType::f32);
      } else if (n.op == OpKind::relu || n.op == OpKind::add || n.op == OpKind::max_pool) {
        EXPECT_EQ(dtype_of(amp, n.outputs[0]), DType::bf16) << n.name;
      } else if (n.op == OpKind::cast && amp.is_constant(n.inputs[0])) {
        ++weight_casts;
      }
    }
    EXPECT_EQ(convs, 21);  // 20 convolutions and fc
    EXPECT_EQ(bns, 20);
    EXPECT_EQ(weight_casts, 22);  // every conv weight, fc's weight and bias
    EXPECT_EQ(report.ops_low, 21);
    EXPECT_EQ(report.outputs_cast, 1);
    EXPECT_EQ(report.casts_inserted, 22 + 1 + 1);  // weights, the input image, the logits
    EXPECT_EQ(report.ops_f32, 0);
    ASSERT_EQ(amp.outputs().size(), 1u);
    EXPECT_EQ(amp.value(amp.outputs()[0]).name, "logits");
    EXPECT_EQ(amp.value(amp.outputs()[0]).type, g.value(g.outputs()[0]).type);
    EXPECT_EQ(amp.constants().size(), g.constants().size()) << "no constant lost or added";
    // f16 places the casts the same way.
    const Graph half = apply_mixed_precision(g, Precision::f16);
    EXPECT_EQ(half.nodes().size(), amp.nodes().size());
  }
}

// The inference-form ResNet-18 on the CPU: rewritten graph against the f32 graph. Bound:
// the largest logit difference within 2% (bf16) / 0.5% (f16) of the largest |logit|
// (measured 1.2% / 0.18%: bf16 rounds each of ~40 stored activations by up to 2^-9).
TEST(MixedPrecision, ResNet18LogitsCloseToF32) {
  const Graph g = resnet18(false);
  const NamedTensors feeds = {{"input", random_tensor(DType::f32, {4, 3, 32, 32}, 11)}};
  const Tensor want = run_graph(g, feeds).at("logits");
  for (Precision p : {Precision::bf16, Precision::f16}) {
    const Tensor got = run_graph(apply_mixed_precision(g, p), feeds).at("logits");
    ASSERT_EQ(got.dtype(), DType::f32);
    const Difference d = difference(got, want);
    std::printf("[ resnet18 ] %s logits: max |diff| / max |logit| %.3g, relative L2 %.3g\n",
                precision_name(p), d.max_rel, d.l2_rel);
    EXPECT_LT(d.max_rel, p == Precision::bf16 ? 2e-2 : 5e-3) << precision_name(p);
  }
}

// loss = cross_entropy(logits, labels) on a training-form model; gradients of every
// parameter (the constants the nodes read, batch norm statistics aside) by autodiff.
struct Gradients {
  double loss = 0;
  NamedTensors grads;  // by parameter name
  std::map<std::string, DType> dtypes;
};

Gradients gradients(Graph g, const NamedTensors& feeds, Device device = Device::cpu) {
  Builder b(g);
  const ValueId logits = find(g, "logits");
  const ValueId labels = g.add_input("labels", DType::i64, feeds.at("labels").shape());
  const ValueId loss = b.name("loss").cross_entropy(logits, labels).at(0);
  g.mark_output(loss);
  std::set<ValueId> statistics;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::batch_norm) statistics.insert({n.inputs[3], n.inputs[4]});
  std::vector<ValueId> params;
  for (const auto& [v, t] : g.constants())
    if (!statistics.count(v) && t.rank() > 0) params.push_back(v);
  const GradResult r = grad(g, loss, params, {.mark_outputs = true});
  const NamedTensors out = run_graph(g, feeds, {.device = device});
  Gradients result;
  result.loss = out.at(g.value(loss).name).get(0);
  for (ValueId v : params) {
    const Value& gv = g.value(r.of(v));
    result.grads[g.value(v).name] = out.at(gv.name);
    result.dtypes[g.value(v).name] = gv.type.dtype;
  }
  return result;
}

// The mean over parameters of the gradients' relative L2 difference, and the worst one.
struct GradientError {
  double mean = 0, worst = 0;
  std::string worst_name;
};
GradientError gradient_error(const Gradients& got, const Gradients& want) {
  GradientError e;
  for (const auto& [name, w] : want.grads) {
    const double d = difference(got.grads.at(name), w).l2_rel;
    e.mean += d / double(want.grads.size());
    if (d > e.worst) {
      e.worst = d;
      e.worst_name = name;
    }
  }
  return e;
}

// A training-like step on the CPU: cross_entropy on the rewritten model's (f32) logits,
// autodiff through the inserted casts, every parameter's gradient against the f32 model's.
//
// How close is close enough: at random initialisation, with batch norm on batch
// statistics, these gradients are ill-conditioned and not smooth (ReLU and max-pool
// switch where activations move). Rounding only the input image to bf16 (2^-9 relative)
// moves the f32 model's own gradients by the `floor` printed below (relative L2 averaged
// over parameters: 15% for ResNet-18, 2.3% for the small CNN); the rewritten model rounds
// every activation and gradient so, and errs by 2-2.5 floors. Bounds: the measured values
// (docs/mixed_precision.md) with ~1.5x margin, and bf16's mean within 4 floors. f16 errs
// about a third of bf16 (not an eighth, its 3 extra mantissa bits: the same non-smoothness;
// scaling the loss by 1024 changes nothing, so it is not underflow here).
struct GradientCase {
  const char* model;
  double bf16_mean, bf16_worst, f16_mean, f16_worst;
};

class MixedPrecisionGradients : public ::testing::TestWithParam<GradientCase> {};

TEST_P(MixedPrecisionGradients, CloseToF32) {
  const GradientCase& c = GetParam();
  const int64_t batch = 16;
  const Graph g = zoo(c.model, batch, true);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < batch; ++i) labels.push_back((7 * i + 3) % 10);
  NamedTensors feeds = {{"input", random_tensor(DType::f32, {batch, 3, 32, 32}, 12)},
                        {"labels", Tensor::from_vector<int64_t>({batch}, labels)}};
  const Gradients want = gradients(g, feeds);
  NamedTensors rounded = feeds;
  rounded["input"] = feeds["input"].cast(DType::bf16).cast(DType::f32);
  const double floor = gradient_error(gradients(g, rounded), want).mean;
  for (Precision p : {Precision::bf16, Precision::f16}) {
    SCOPED_TRACE(precision_name(p));
    const Gradients got = gradients(apply_mixed_precision(g, p), feeds);
    ASSERT_EQ(got.grads.size(), want.grads.size());
    for (const auto& [name, t] : got.grads) {
      EXPECT_EQ(got.dtypes.at(name), DType::f32) << name << ": f32 parameters get f32 gradients";
      EXPECT_EQ(t.dtype(), DType::f32) << name;
    }
    const GradientError e = gradient_error(got, want);
    const double loss_rel = std::abs(got.loss - want.loss) / std::abs(want.loss);
    std::printf(
        "[ %s ] %s gradients: relative L2 mean %.3g, worst %.3g (%s); floor (f32, input "
        "rounded to bf16) %.3g; loss %.6g vs %.6g (relative %.2g)\n",
        c.model, precision_name(p), e.mean, e.worst, e.worst_name.c_str(), floor, got.loss,
        want.loss, loss_rel);
    const bool bf16 = p == Precision::bf16;
    EXPECT_LT(e.mean, bf16 ? c.bf16_mean : c.f16_mean);
    if (bf16) {
      EXPECT_LT(e.mean, 4 * floor);
    }
    EXPECT_LT(e.worst, bf16 ? c.bf16_worst : c.f16_worst) << e.worst_name;
    EXPECT_LT(loss_rel, 2e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, MixedPrecisionGradients,
                         ::testing::Values(GradientCase{"small_cnn", 0.06, 0.15, 0.025, 0.06},
                                           GradientCase{"resnet18", 0.5, 0.8, 0.16, 0.25}),
                         [](const ::testing::TestParamInfo<GradientCase>& p) {
                           return std::string(p.param.model);
                         });

// The rewritten ResNet-18 on the GPU against the CPU (cuDNN's bf16 / f16 convolutions,
// the mixed batch norm kernels, casts): the inference form's logits within the bounds of
// the f32 comparison above (both sides round to the low dtype at every layer, differently),
// the training form's loss within 2e-3 and its gradients within the bf16 / f16 gradient
// bounds of MixedPrecisionGradients (ResNet-18's row), f32 for f32 parameters.
TEST(MixedPrecision, CudaMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (or no CUDA backend in this build)";
  const NamedTensors feeds = {{"input", random_tensor(DType::f32, {4, 3, 32, 32}, 13)}};
  // Batch 16 for the gradients, as MixedPrecisionGradients (batch 4 is far worse conditioned).
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 16; ++i) labels.push_back((3 * i + 1) % 10);
  const NamedTensors train_feeds = {{"input", random_tensor(DType::f32, {16, 3, 32, 32}, 14)},
                                    {"labels", Tensor::from_vector<int64_t>({16}, labels)}};
  for (Precision p : {Precision::bf16, Precision::f16}) {
    SCOPED_TRACE(precision_name(p));
    const bool bf16 = p == Precision::bf16;
    const Graph amp = apply_mixed_precision(resnet18(false), p);
    const Tensor cpu = run_graph(amp, feeds).at("logits");
    const Tensor gpu = run_graph(amp, feeds, {.device = Device::cuda}).at("logits");
    const Difference d = difference(gpu, cpu);
    std::printf("[ resnet18 ] %s logits, cuda vs cpu: max |diff| / max |logit| %.3g\n",
                precision_name(p), d.max_rel);
    EXPECT_LT(d.max_rel, bf16 ? 2e-2 : 5e-3);

    const Graph train = apply_mixed_precision(zoo("resnet18", 16, true), p);
    const Gradients want = gradients(train, train_feeds);
    const Gradients got = gradients(train, train_feeds, Device::cuda);
    const GradientError e = gradient_error(got, want);
    const double loss_rel = std::abs(got.loss - want.loss) / std::abs(want.loss);
    std::printf(
        "[ resnet18 ] %s gradients, cuda vs cpu: relative L2 mean %.3g, worst %.3g (%s); "
        "loss relative %.2g\n",
        precision_name(p), e.mean, e.worst, e.worst_name.c_str(), loss_rel);
    for (const auto& [name, t] : got.grads) EXPECT_EQ(t.dtype(), DType::f32) << name;
    EXPECT_LT(loss_rel, 2e-3);
    EXPECT_LT(e.mean, bf16 ? 0.5 : 0.16);
  }
}

// Parameters that are graph inputs (as in the training step graph, which turns the model's
// constants into inputs): read through casts, never folded, f32 gradients.
TEST(MixedPrecision, ParametersAsInputs) {
  Graph g("linear");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {3, 5});
  const ValueId w = g.add_input("w", DType::f32, {4, 5});
  const ValueId bias = g.add_input("b", DType::f32, {4});
  const ValueId logits = b.name("fc").gemm(x, w, bias, GemmAttrs{.trans_b = true});
  g.rename_value(logits, "logits");
  g.mark_output(logits);
  MixedPrecisionReport report;
  Graph amp = apply_mixed_precision(g, Precision::bf16, &report, {.fold_constants = true});
  EXPECT_EQ(report.constants_folded, 0);
  EXPECT_EQ(report.casts_inserted, 4);  // x, w, b, and the logits back
  const ValueId labels = amp.add_input("labels", DType::i64, {3});
  Builder amp_builder(amp);
  const ValueId loss = amp_builder.cross_entropy(find(amp, "logits"), labels).at(0);
  const ValueId aw = find(amp, "w"), abias = find(amp, "b");
  EXPECT_EQ(dtype_of(amp, aw), DType::f32);
  const GradResult r = grad(amp, loss, {aw, abias}, {.mark_outputs = true});
  EXPECT_EQ(dtype_of(amp, r.of(aw)), DType::f32);
  EXPECT_EQ(dtype_of(amp, r.of(abias)), DType::f32);
  const NamedTensors out =
      run_graph(amp, {{"x", random_tensor(DType::f32, {3, 5}, 31)},
                      {"w", random_tensor(DType::f32, {4, 5}, 32)},
                      {"b", random_tensor(DType::f32, {4}, 33)},
                      {"labels", Tensor::from_vector<int64_t>({3}, {0, 3, 1})}});
  EXPECT_EQ(out.at(amp.value(r.of(aw)).name).dtype(), DType::f32);
}

}  // namespace
}  // namespace fusebox::testing
