// autodiff's graph-level behaviour: a whole small CNN checked against finite
// differences, what is (not) built, zero gradients, the seed, naming, and the errors.
#include <algorithm>
#include <set>

#include "fusebox/passes/autodiff.h"
#include "gradcheck.h"

namespace fusebox::testing {
namespace {

using gradcheck::check_gradients;
using gradcheck::Forward;
using gradcheck::input;
using gradcheck::Leaf;
using gradcheck::param;

// The nodes grad() appended (those after the first `forward_nodes`).
std::vector<Node> appended(const Graph& g, size_t forward_nodes) {
  return std::vector<Node>(g.nodes().begin() + int64_t(forward_nodes), g.nodes().end());
}

std::multiset<std::string> op_names(const std::vector<Node>& nodes) {
  std::multiset<std::string> out;
  for (const Node& n : nodes) out.insert(op_name(n.op));
  return out;
}

bool reads(const std::vector<Node>& nodes, ValueId v) {
  for (const Node& n : nodes)
    if (std::count(n.inputs.begin(), n.inputs.end(), v)) return true;
  return false;
}

// Runs a copy of g with v marked as an output and returns v.
Tensor run_value(const Graph& g, const NamedTensors& feeds, ValueId v) {
  Graph copy = g;
  copy.mark_output(v);
  return run_graph(copy, feeds).at(g.value(v).name);
}

// conv -> batch_norm (training) -> relu -> max_pool -> flatten -> gemm -> cross_entropy,
// every parameter checked on a few random elements.
TEST(AutodiffGraph, SmallCnnMatchesFiniteDifferences) {
  const Tensor labels = Tensor::from_vector<int64_t>({3}, {4, 0, 2});
  std::vector<Leaf> leaves = {input("image", {3, 3, 6, 6}, 9000),
                              param("conv.w", {4, 3, 3, 3}, 9001),
                              param("conv.b", {4}, 9002),
                              param("bn.scale", {4}, 9003, 0.5, 1.5),
                              param("bn.bias", {4}, 9004),
                              param("bn.mean", {4}, 9005),
                              param("bn.var", {4}, 9006, 0.5, 2.0),
                              param("fc.w", {5, 36}, 9007),
                              param("fc.b", {5}, 9008),
                              {"labels", labels, false, false}};
  leaves[5].differentiate = leaves[6].differentiate = false;  // running statistics
  Forward f = [](Builder& b, const std::vector<ValueId>& v) {
    ConvAttrs conv;
    conv.pads_begin = conv.pads_end = {1, 1};
    ValueId h = b.conv(v[0], v[1], v[2], conv);
    h = b.batch_norm_training(h, v[3], v[4], v[5], v[6], BatchNormAttrs{1e-5, 0.9, true}).at(0);
    h = b.relu(h);
    h = b.max_pool(h, PoolAttrs{.kernel = {2, 2}, .strides = {2, 2}});
    h = b.flatten(h, 1);
    h = b.gemm(h, v[7], v[8], GemmAttrs{false, true, 1.0, 1.0});
    return std::vector<ValueId>{b.cross_entropy(h, v[9]).at(0)};
  };
  EXPECT_TRUE(check_gradients(
      leaves, f,
      {"cnn: conv-bn(training)-relu-max_pool-gemm-cross_entropy", "small CNN", {}, 6, 9010}));
}

// The same network in f32 and f64: the backward graph is built in the graph's dtype
// (literals included) and agrees with the f64 one to f32 precision. Every float op of
// a small training step appears: conv, batch_norm (training), gelu, avg_pool,
// layer_norm, matmul and cross_entropy.
TEST(AutodiffGraph, F32GradientsMatchF64) {
  const auto gradients = [](DType t) {
    Graph g("typed");
    Builder b(g);
    const auto param = [&](const char* name, const Shape& s, uint64_t seed) {
      return g.add_constant(name, random_tensor(DType::f64, s, seed).cast(t));
    };
    const ValueId x = g.add_input("x", t, {2, 2, 5, 5});
    const ValueId labels = g.add_input("labels", DType::i64, {2});
    const ValueId w = param("w", {3, 2, 3, 3}, 1), scale = param("scale", {3}, 2),
                  bias = param("bias", {3}, 3), mean = param("mean", {3}, 4),
                  var = g.add_constant("var", Tensor::full(t, {3}, 1.0)),
                  fc = param("fc", {12, 4}, 5), ln = param("ln", {12}, 6);
    ValueId h = b.conv(x, w, kNoValue);  // [2, 3, 3, 3]
    h = b.gelu(b.batch_norm_training(h, scale, bias, mean, var, {1e-5, 0.9, true}).at(0));
    h = b.avg_pool(h, PoolAttrs{.kernel = {2, 2}, .strides = {1, 1}});
    h = b.layer_norm(b.flatten(h, 1), ln, kNoValue);
    const ValueId loss = b.cross_entropy(b.matmul(h, fc), labels).at(0);
    GradOptions opts;
    opts.mark_outputs = true;
    const std::vector<ValueId> wrt = {x, w, scale, bias, fc, ln};
    const GradResult r = grad(g, loss, wrt, opts);
    const NamedTensors out =
        run_graph(g, {{"x", random_tensor(DType::f64, {2, 2, 5, 5}, 7).cast(t)},
                      {"labels", Tensor::from_vector<int64_t>({2}, {3, 1})}});
    std::vector<Tensor> grads;
    for (ValueId v : wrt) {
      const Tensor& d = out.at(g.value(r.of(v)).name);
      EXPECT_EQ(d.dtype(), t);
      grads.push_back(d.cast(DType::f64));
    }
    return grads;
  };
  const std::vector<Tensor> f32 = gradients(DType::f32), f64 = gradients(DType::f64);
  for (size_t i = 0; i < f64.size(); ++i) EXPECT_TRUE(all_close(f32[i], f64[i], 1e-3, 1e-5)) << i;
}

// Only the path from the wrt values to the loss is differentiated.
//   loss = sum(relu(x * w1) * w2 + exp(u)), wrt {w1}
// needs: the seed, reduce_sum's reshape + expand, mul(dy, w2) for relu's output,
// unary_backward, mul(dy, x) for w1. Not: exp's branch (u), x's gradient (which would
// read w1), w2's gradient (which would read relu's output).
TEST(AutodiffGraph, BuildsOnlyNeededGradients) {
  Graph g("needed");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {2, 3});
  const ValueId u = g.add_input("u", DType::f64, {2, 3});
  const ValueId w1 = g.add_constant("w1", random_tensor(DType::f64, {2, 3}, 1));
  const ValueId w2 = g.add_constant("w2", random_tensor(DType::f64, {2, 3}, 2));
  const ValueId y1 = b.relu(b.mul(x, w1));
  const ValueId side = b.exp(u);
  const ValueId loss = b.reduce_sum(b.add(b.mul(y1, w2), side), {}, false);
  const size_t forward = g.nodes().size();

  const GradResult r = grad(g, loss, {w1});
  const std::vector<Node> added = appended(g, forward);
  EXPECT_EQ(added.size(), 6u) << g.dump();
  EXPECT_EQ(op_names(added), (std::multiset<std::string>{"constant", "reshape", "expand", "mul",
                                                         "unary_backward", "mul"}));
  EXPECT_FALSE(reads(added, u));
  EXPECT_FALSE(reads(added, side));
  EXPECT_FALSE(reads(added, w1));  // x's gradient is dy * w1: not built
  // w2's gradient, dy * y1, is not built: only relu's own backward reads y1 (its output,
  // which tells where x * w1 > 0).
  std::vector<Node> muls;
  for (const Node& n : added)
    if (n.op == OpKind::mul) muls.push_back(n);
  EXPECT_FALSE(reads(muls, y1));
  g.verify();

  // The gradient itself: d/dw1 = x * w2 * (x * w1 > 0).
  const Tensor xv = random_tensor(DType::f64, {2, 3}, 3);
  const Tensor dw1 = run_value(g, {{"x", xv}, {"u", xv}}, r.of(w1));
  const Tensor& w1v = *g.constant(w1);
  const Tensor& w2v = *g.constant(w2);
  for (int64_t i = 0; i < 6; ++i) {
    const double expected = xv.get(i) * w1v.get(i) > 0 ? xv.get(i) * w2v.get(i) : 0.0;
    EXPECT_DOUBLE_EQ(dw1.get(i), expected) << i;
  }
}

// conv's gradients are the backward ops (never a forward conv guessed from shapes);
// a transposed conv's input gradient is a forward conv.
TEST(AutodiffGraph, ConvUsesBackwardOps) {
  Graph g("conv");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {1, 2, 6, 5});
  const ValueId w = g.add_constant("w", random_tensor(DType::f64, {3, 2, 3, 3}, 1));
  const ValueId bias = g.add_constant("b", random_tensor(DType::f64, {3}, 2));
  ConvAttrs a;
  a.strides = {2, 2};
  a.pads_begin = {1, 0};
  const ValueId y = b.conv(x, w, bias, a);
  const size_t forward = g.nodes().size();
  grad(g, b.reduce_sum(y, {}, false), {x, w, bias});
  const std::multiset<std::string> ops = op_names(appended(g, forward));
  EXPECT_EQ(ops.count("conv_backward_data"), 1u);
  EXPECT_EQ(ops.count("conv_backward_filter"), 1u);
  EXPECT_EQ(ops.count("conv"), 0u);

  Graph t("transposed");
  Builder bt(t);
  const ValueId u = t.add_input("u", DType::f64, {1, 3, 3, 2});
  const ValueId wt = t.add_constant("w", random_tensor(DType::f64, {3, 2, 3, 3}, 1));
  const ValueId z = bt.conv_backward_data(u, wt, ConvBackwardDataAttrs{a, {6, 5}});
  const size_t forward_t = t.nodes().size();
  grad(t, bt.reduce_sum(z, {}, false), {u, wt});
  const std::multiset<std::string> ops_t = op_names(appended(t, forward_t));
  EXPECT_EQ(ops_t.count("conv"), 1u);
  EXPECT_EQ(ops_t.count("conv_backward_filter"), 1u);
}

// A wrt the loss does not depend on (unused, or reaching it only through an integer
// cast) gets zeros of its own shape; a used one is unaffected.
TEST(AutodiffGraph, UnreachedWrtGetsZeros) {
  Graph g("zeros");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {2, 3});
  const ValueId unused = g.add_input("unused", DType::f64, {4});
  const ValueId k = g.add_input("k", DType::f64, {2, 3});
  const ValueId through_int = b.cast(b.cast(k, DType::i64), DType::f64);
  const ValueId loss = b.reduce_sum(b.add(b.mul(x, x), through_int), {}, false);
  const size_t forward = g.nodes().size();
  GradOptions opts;
  opts.mark_outputs = true;
  const GradResult r = grad(g, loss, {x, unused, k}, opts);
  // Nothing differentiates through the casts: no backward node reads k or the casts.
  EXPECT_FALSE(reads(appended(g, forward), k));
  EXPECT_FALSE(reads(appended(g, forward), through_int));

  const Tensor xv = random_tensor(DType::f64, {2, 3}, 1);
  const Tensor kv = random_tensor(DType::f64, {2, 3}, 2, -5, 5);
  const NamedTensors out =
      run_graph(g, {{"x", xv}, {"unused", random_tensor(DType::f64, {4}, 3)}, {"k", kv}});
  const Tensor& dunused = out.at(g.value(r.of(unused)).name);
  const Tensor& dk = out.at(g.value(r.of(k)).name);
  EXPECT_TRUE(all_close(dunused, Tensor::zeros(DType::f64, {4}), 0, 0));
  EXPECT_TRUE(all_close(dk, Tensor::zeros(DType::f64, {2, 3}), 0, 0));
  Tensor two_x = xv.clone();
  for (int64_t i = 0; i < 6; ++i) two_x.set(i, 2 * xv.get(i));
  EXPECT_TRUE(all_close(out.at(g.value(r.of(x)).name), two_x, 0, 0));
}

// seed_input: a non-scalar loss with a fed seed gives the vector-Jacobian product.
TEST(AutodiffGraph, SeedInputGivesVjp) {
  Graph g("vjp");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {3, 4});
  const ValueId y = b.name("y").mul(x, x);
  GradOptions opts;
  opts.seed_input = true;
  const GradResult r = grad(g, y, {x}, opts);
  ASSERT_TRUE(g.find_value("y:grad").has_value());
  EXPECT_EQ(*g.find_value("y:grad"), r.seed);
  EXPECT_EQ(g.value(r.of(x)).name, "x:grad");
  const Tensor xv = random_tensor(DType::f64, {3, 4}, 1);
  const Tensor seed = random_tensor(DType::f64, {3, 4}, 2);
  const Tensor dx = run_value(g, {{"x", xv}, {"y:grad", seed}}, r.of(x));
  Tensor expected = xv.clone();
  for (int64_t i = 0; i < 12; ++i) expected.set(i, 2 * xv.get(i) * seed.get(i));
  EXPECT_TRUE(all_close(dx, expected, 1e-15, 0));

  // Without seed_input, a non-scalar loss is seeded with ones (the gradient of its sum).
  Graph h("ones");
  Builder bh(h);
  const ValueId hx = h.add_input("x", DType::f64, {3, 4});
  const GradResult rh = grad(h, bh.mul(hx, hx), {hx});
  Tensor two_x = xv.clone();
  for (int64_t i = 0; i < 12; ++i) two_x.set(i, 2 * xv.get(i));
  EXPECT_TRUE(all_close(run_value(h, {{"x", xv}}, rh.of(hx)), two_x, 1e-15, 0));
}

// Intermediate values, the loss itself, and one gradient shared by two wrt values.
TEST(AutodiffGraph, IntermediateWrtAndNaming) {
  Graph g("intermediate");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {2, 2});
  const ValueId h = b.name("h").tanh(x);
  const ValueId hid = b.name("hid").identity(h);
  const ValueId square = b.mul(hid, hid);
  const ValueId loss = b.name("loss").reduce_sum(square, {}, false);
  GradOptions opts;
  opts.mark_outputs = true;
  const GradResult r = grad(g, loss, {x, h, hid, loss}, opts);
  g.verify();
  EXPECT_EQ(g.value(r.of(h)).name, "h:grad");
  EXPECT_EQ(g.value(r.of(hid)).name, "hid:grad");
  EXPECT_NE(r.of(h), r.of(hid));  // identity passes the gradient through: copied
  const Tensor xv = random_tensor(DType::f64, {2, 2}, 1);
  const NamedTensors out = run_graph(g, {{"x", xv}});
  for (int64_t i = 0; i < 4; ++i) {
    const double t = std::tanh(xv.get(i));
    EXPECT_NEAR(out.at("h:grad").get(i), 2 * t, 1e-15);
    EXPECT_NEAR(out.at("hid:grad").get(i), 2 * t, 1e-15);
    EXPECT_NEAR(out.at("x:grad").get(i), 2 * t * (1 - t * t), 1e-15);
  }
  EXPECT_EQ(out.at("loss:grad").get(0), 1.0);
  EXPECT_THROW(r.of(g.inputs()[0] + 1000), Error);
}

// Literal numbers are constant nodes: the graph's constants stay the parameters.
TEST(AutodiffGraph, AddsNoGraphConstants) {
  Graph g("constants");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {2, 3});
  const ValueId w = g.add_constant("w", random_tensor(DType::f64, {3}, 1));
  const ValueId loss = b.reduce_mean(b.global_avg_pool(b.unsqueeze(b.mul(x, w), {0})), {}, false);
  const size_t before = g.constants().size();
  grad(g, loss, {x, w});
  EXPECT_EQ(g.constants().size(), before);
}

// A value read by several branches (x -> four convolutions, summed) holds one running sum of
// their gradients: each add comes right after the branch whose contribution it takes, before
// the next branch's backward, so no more than two branch gradients are ever live. The sum's
// order is the branches' arrival order, as when summed at the end: the same values.
TEST(AutodiffGraph, ContributionsAreSummedAsTheyArrive) {
  Graph g("branches");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {2, 3, 5, 5});
  std::vector<ValueId> w;
  ValueId sum = kNoValue;
  for (int i = 0; i < 4; ++i) {
    w.push_back(g.add_input(cat("w", i), DType::f64, {3, 3, 1, 1}));
    const ValueId branch = b.conv(x, w.back());
    sum = sum == kNoValue ? branch : b.add(sum, branch);
  }
  const ValueId loss = b.reduce_sum(b.mul(sum, sum), {}, false);
  const size_t forward = g.nodes().size();
  const GradResult r = grad(g, loss, {x});
  const std::vector<Node> backward = appended(g, forward);
  std::vector<size_t> dx, adds;  // positions of the branches' input gradients and their sums
  for (size_t i = 0; i < backward.size(); ++i) {
    if (backward[i].op == OpKind::conv_backward_data) dx.push_back(i);
    const bool sums_a_dx =
        backward[i].op == OpKind::add &&
        std::any_of(backward[i].inputs.begin(), backward[i].inputs.end(), [&](ValueId v) {
          const NodeId p = g.value(v).producer;
          return p >= 0 && g.node(p).op == OpKind::conv_backward_data;
        });
    if (sums_a_dx) adds.push_back(i);
  }
  ASSERT_EQ(dx.size(), 4u);
  ASSERT_EQ(adds.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_GT(adds[k], dx[k + 1]) << k;
    if (k + 2 < dx.size()) EXPECT_LT(adds[k], dx[k + 2]) << k;
  }
  EXPECT_EQ(g.value(r.of(x)).producer, NodeId(forward + adds.back()));
  std::vector<Leaf> leaves = {input("x", {2, 3, 5, 5}, 9100)};
  for (int i = 0; i < 4; ++i)
    leaves.push_back(param(cat("w", i), {3, 3, 1, 1}, 9101 + uint64_t(i)));
  Forward f = [](Builder& fb, const std::vector<ValueId>& v) {
    ValueId s = kNoValue;
    for (size_t i = 1; i <= 4; ++i) {
      const ValueId branch = fb.conv(v[0], v[i]);
      s = s == kNoValue ? branch : fb.add(s, branch);
    }
    return std::vector<ValueId>{fb.reduce_sum(fb.mul(s, s), {}, false)};
  };
  EXPECT_TRUE(check_gradients(leaves, f, {"four branches of x, summed", "branches", {}, 6, 9110}));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Gradients through conv_backward_filter (second order) are refused, naming the node,
// but only when a wrt actually reaches it.
TEST(AutodiffErrors, SecondOrderNamesTheNode) {
  Graph g("second_order");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {1, 2, 5, 5});
  const ValueId dy = g.add_input("dy", DType::f64, {1, 3, 3, 3});
  const ValueId z = g.add_input("z", DType::f64, {2});
  const ValueId dw =
      b.name("filter_grad").conv_backward_filter(x, dy, ConvBackwardFilterAttrs{{}, {3, 3}});
  const ValueId loss = b.add(b.reduce_sum(dw, {}, false), b.reduce_sum(b.mul(z, z), {}, false));
  Graph copy = g;
  const std::string message = error_of([&] { grad(g, loss, {x}); });
  EXPECT_NE(message.find("conv_backward_filter 'filter_grad'"), std::string::npos) << message;
  EXPECT_NE(message.find("no gradient"), std::string::npos) << message;
  EXPECT_NO_THROW(grad(copy, loss, {z}));  // the other branch: not through the node
}

TEST(AutodiffErrors, StatisticsOutputsAndClassWeights) {
  {
    Graph g("bn_stats");
    Builder b(g);
    const ValueId x = g.add_input("x", DType::f64, {2, 3, 4});
    std::vector<ValueId> p;
    for (int i = 0; i < 4; ++i)
      p.push_back(g.add_constant(cat("p", i), Tensor::full(DType::f64, {3}, 1.0)));
    const std::vector<ValueId> bn = b.name("bn").batch_norm_training(
        x, p[0], p[1], p[2], p[3], BatchNormAttrs{1e-5, 0.9, true});
    const ValueId loss = b.reduce_sum(b.add(bn[1], b.reduce_sum(bn[0], {0, 2}, false)), {}, false);
    const std::string m = error_of([&] { grad(g, loss, {x}); });
    EXPECT_NE(m.find("batch_norm 'bn'"), std::string::npos) << m;
    EXPECT_NE(m.find("output 1"), std::string::npos) << m;
  }
  {
    Graph g("ln_stats");
    Builder b(g);
    const ValueId x = g.add_input("x", DType::f64, {2, 3});
    const std::vector<ValueId> ln = b.name("ln").op(OpKind::layer_norm, NormAttrs{}, {x});
    const std::string m = error_of([&] { grad(g, b.reduce_sum(ln[2], {}, false), {x}); });
    EXPECT_NE(m.find("layer_norm 'ln'"), std::string::npos) << m;
  }
  {
    Graph g("ce_weight");
    Builder b(g);
    const ValueId logits = g.add_input("logits", DType::f64, {2, 3});
    const ValueId labels = g.add_input("labels", DType::i64, {2});
    const ValueId weight = g.add_constant("weight", Tensor::full(DType::f64, {3}, 1.0));
    const ValueId loss = b.name("ce").cross_entropy(logits, labels, weight).at(0);
    Graph copy = g;
    const std::string m = error_of([&] { grad(g, loss, {logits, weight}); });
    EXPECT_NE(m.find("cross_entropy 'ce'"), std::string::npos) << m;
    EXPECT_NE(m.find("class weights"), std::string::npos) << m;
    EXPECT_NO_THROW(grad(copy, loss, {logits}));
  }
}

TEST(AutodiffErrors, BadArguments) {
  Graph g("bad");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {2});
  const ValueId labels = g.add_input("labels", DType::i64, {2});
  const ValueId loss = b.reduce_sum(x, {}, false);
  EXPECT_NE(error_of([&] { grad(g, loss, {labels}); }).find("'labels': it is i64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { grad(g, labels, {x}); }).find("loss 'labels' is i64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { grad(g, loss, {ValueId(999)}); }).find("999"), std::string::npos);
  EXPECT_NE(error_of([&] { grad(g, ValueId(-3), {x}); }).find("-3"), std::string::npos);
  g.add_input(g.value(loss).name + ":grad", DType::f64, {});
  GradOptions opts;
  opts.seed_input = true;
  EXPECT_NE(error_of([&] { grad(g, loss, {x}, opts); }).find("name is taken"), std::string::npos);
}

}  // namespace
}  // namespace fusebox::testing
