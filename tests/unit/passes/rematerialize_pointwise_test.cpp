// rematerialize_pointwise (passes/rematerialize.h): in a training step, the gates of SiLU and
// HardSwish as exported (x * sigmoid(x), x * clip(x / 6 + 1/2)) are computed again where the
// backward reads them instead of being kept from the forward; a large widened copy of a bf16
// value is cast again for the norm backward that reads it; the gradients keep their bits; a
// value whose recomputation needs a value nothing keeps, or that a matmul's backward reads,
// stays.
#include "fusebox/ir/builder.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/rematerialize.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr RematerializeOptions kSmallGraph{.min_gap = 2, .max_chain = 8, .min_unfused_bytes = 0};

ValueId scalar(Builder& b, double value) {
  return b.constant(Tensor::full(DType::f32, {}, value));
}

// The gradients of `params` (outputs "d<name>") of loss = sum(y * y).
void differentiate(Graph& g, Builder& b, ValueId y, const std::vector<ValueId>& params) {
  const ValueId loss = b.reduce_sum(b.mul(y, y), {}, false);
  const GradResult r = grad(g, loss, params);
  for (ValueId p : params) {
    g.rename_value(r.of(p), "d" + g.value(p).name);
    g.mark_output(r.of(p));
  }
}

// x [16, 32] -> SiLU(x w0) -> HardSwish(. w1) -> . w2, as PyTorch's export spells them.
Graph activations_step() {
  Graph g("activations");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {16, 32});
  std::vector<ValueId> w;
  for (int i = 0; i < 3; ++i) w.push_back(g.add_input(cat("w", i), DType::f32, {32, 32}));
  const ValueId h0 = b.matmul(x, w[0]);
  g.rename_value(h0, "h0");
  const ValueId gate0 = b.sigmoid(h0);
  g.rename_value(gate0, "gate0");
  const ValueId h1 = b.matmul(b.mul(h0, gate0), w[1]);
  g.rename_value(h1, "h1");
  const ValueId shifted = b.add(b.mul(h1, scalar(b, 1.0 / 6.0)), scalar(b, 0.5));
  g.rename_value(shifted, "shifted");
  const ValueId gate1 = b.clip(shifted, 0, 1);
  g.rename_value(gate1, "gate1");
  differentiate(g, b, b.matmul(b.mul(h1, gate1), w[2]), w);
  return g;
}

NamedTensors activation_feeds() {
  NamedTensors feeds{{"x", random_tensor(DType::f32, {16, 32}, 1, -2, 2)}};
  for (int i = 0; i < 3; ++i)
    feeds[cat("w", i)] = random_tensor(DType::f32, {32, 32}, uint64_t(2 + i), -0.5, 0.5);
  return feeds;
}

// The nodes reading the value named `name`, by position.
std::vector<NodeId> readers_of(const Graph& g, const std::string& name) {
  const ValueId v = *g.find_value(name);
  std::vector<NodeId> readers;
  for (const Node& n : g.nodes())
    if (std::find(n.inputs.begin(), n.inputs.end(), v) != n.inputs.end()) readers.push_back(n.id);
  return readers;
}

TEST(RematerializePointwise, GatesAreComputedAgainWhereTheBackwardReadsThem) {
  const Graph before = activations_step();
  Graph g = before;
  EXPECT_EQ(rematerialize_pointwise(g, nullptr, kSmallGraph), 2u);  // gate0, gate1
  g.verify();
  // Each gate is read by its forward product alone; a copy computes it for the backward,
  // from the pre-activation the backward reads anyway.
  for (const char* gate : {"gate0", "gate1"}) {
    SCOPED_TRACE(gate);
    const std::vector<NodeId> readers = readers_of(g, gate);
    ASSERT_EQ(readers.size(), 1u);
    EXPECT_EQ(g.node(readers[0]).op, OpKind::mul);
    const std::string copy = cat(gate, "/recompute");
    ASSERT_TRUE(g.find_value(copy).has_value());
    EXPECT_GT(readers_of(g, copy).front(), readers[0] + NodeId(kSmallGraph.min_gap));
  }
  const Node& sigmoid_copy = g.node(g.value(*g.find_value("gate0/recompute")).producer);
  EXPECT_EQ(sigmoid_copy.op, OpKind::sigmoid);
  EXPECT_EQ(sigmoid_copy.inputs[0], *g.find_value("h0"));
  // The clip's input is read by the clip's own backward (its mask): live there anyway, so the
  // copy starts from it and leaves its product and sum alone.
  EXPECT_EQ(g.node(g.value(*g.find_value("gate1/recompute")).producer).inputs[0],
            *g.find_value("shifted"));
  // The same gradients, bit for bit.
  const NamedTensors feeds = activation_feeds();
  const NamedTensors want = run_graph(before, feeds), got = run_graph(g, feeds);
  for (const char* d : {"dw0", "dw1", "dw2"})
    EXPECT_TRUE(all_close(got.at(d), want.at(d), 0, 0)) << d;
  EXPECT_EQ(rematerialize_pointwise(g, nullptr, kSmallGraph), 0u);  // nothing left to do
}

TEST(RematerializePointwise, LeavesWhatCostsMoreThanItSaves) {
  Graph g = activations_step();
  // The products h * gate are read by the next matmul's backward (not elementwise: a copy
  // would be a kernel of its own); with too wide a minimum gap nothing qualifies at all.
  Graph wide = g;
  EXPECT_EQ(rematerialize_pointwise(wide, nullptr, {.min_gap = 1000}), 0u);
  rematerialize_pointwise(g, nullptr, kSmallGraph);
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::mul && g.value(n.inputs[0]).name.rfind("h", 0) == 0) {
      EXPECT_EQ(n.name.find("/recompute"), std::string::npos) << n.name;
    }
  }
  // A gate whose input nothing else keeps (h * (a / 2), a another product's output that only
  // the gate reads) would keep that input alive instead, as many bytes for longer: it stays.
  Graph kept("kept");
  Builder b(kept);
  const ValueId x = kept.add_input("x", DType::f32, {16, 32});
  const ValueId w = kept.add_input("w", DType::f32, {32, 32});
  const ValueId wa = kept.add_input("wa", DType::f32, {32, 32});
  const ValueId gate = b.mul(b.matmul(x, wa), scalar(b, 0.5));
  kept.rename_value(gate, "gate");
  differentiate(kept, b, b.mul(b.matmul(x, w), gate), {w});
  ASSERT_EQ(readers_of(kept, "gate").size(), 2u);  // the product and its gradient
  EXPECT_EQ(rematerialize_pointwise(kept, nullptr, kSmallGraph), 0u);
}

TEST(RematerializePointwise, AWidenedNormInputIsCastAgainForTheNormBackward) {
  Graph g("widened");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::bf16, {64, 32});
  const ValueId w = g.add_input("w", DType::bf16, {32, 32});
  const ValueId h = b.matmul(x, w);  // bf16, read by nothing in the backward
  g.rename_value(h, "h");
  const ValueId wide = b.cast(h, DType::f32);
  g.rename_value(wide, "wide");
  const ValueId y = g.add_node(OpKind::layer_norm, NormAttrs{.axis = -1, .epsilon = 1e-5}, {wide},
                               "norm", {"y", "mean", "inv_std"})[0];
  const ValueId w2 = g.add_input("w2", DType::f32, {32, 32});
  differentiate(g, b, b.matmul(y, w2), {w, w2});
  const Graph before = g;
  // Below min_unfused_bytes (a kernel of its own for 8 KiB) it stays.
  Graph small = g;
  EXPECT_EQ(rematerialize_pointwise(small, nullptr, {.min_gap = 2}), 0u);
  EXPECT_EQ(rematerialize_pointwise(g, nullptr, kSmallGraph), 1u);
  const std::vector<NodeId> readers = readers_of(g, "wide");
  ASSERT_EQ(readers.size(), 1u);
  EXPECT_EQ(g.node(readers[0]).op, OpKind::layer_norm);
  const Node& copy = g.node(g.value(*g.find_value("wide/recompute")).producer);
  EXPECT_EQ(copy.op, OpKind::cast);
  EXPECT_EQ(g.value(copy.inputs[0]).name, "h");
  NamedTensors feeds{{"x", random_tensor(DType::bf16, {64, 32}, 1, -2, 2)},
                     {"w", random_tensor(DType::bf16, {32, 32}, 2, -0.5, 0.5)},
                     {"w2", random_tensor(DType::f32, {32, 32}, 3, -0.5, 0.5)}};
  const NamedTensors want = run_graph(before, feeds), got = run_graph(g, feeds);
  for (const char* d : {"dw", "dw2"}) EXPECT_TRUE(all_close(got.at(d), want.at(d), 0, 0)) << d;
}

// x [8, 4, 5, 5] in `t` -> a training batch norm (`param` scale, bias and statistics; `relu`
// fused) -> y -> `after` -> a 1x1 convolution; the gradients of scale, bias and the filter.
// after: "hardswish" (y * clip(y / 6 + 1/2), as exported: its backward reads y), "gate"
// (y * sigmoid(mean of y over H, W), squeeze-and-excitation: its backward reads y), or
// "none" (the convolution reads y: its wgrad does too).
Graph batch_norm_step(DType t, DType param, bool relu, const std::string& after) {
  Graph g("batch_norm_step");
  Builder b(g);
  const ValueId x = g.add_input("x", t, {8, 4, 5, 5});
  std::vector<ValueId> p;
  for (const char* name : {"scale", "bias", "running_mean", "running_var"})
    p.push_back(g.add_input(name, param, {4}));
  const ValueId y = b.batch_norm_training(x, p[0], p[1], p[2], p[3],
                                          {.epsilon = 1e-3, .training = true, .relu = relu})[0];
  g.rename_value(y, "y");
  ValueId h = y;
  if (after == "hardswish") {
    const ValueId gate =
        b.clip(b.add(b.mul(y, b.cast(scalar(b, 1.0 / 6.0), t)), b.cast(scalar(b, 0.5), t)), 0, 1);
    h = b.mul(y, gate);
  } else if (after == "gate") {
    h = b.mul(y, b.sigmoid(b.reduce_mean(y, {2, 3}, true)));
  }
  const ValueId w = g.add_input("w", t, {6, 4, 1, 1});
  differentiate(g, b, b.conv(h, w), {p[0], p[1], w});
  return g;
}

NamedTensors batch_norm_feeds(DType t, DType param) {
  return {{"x", random_tensor(t, {8, 4, 5, 5}, 11, -2, 3)},
          {"scale", random_tensor(param, {4}, 12, 0.5, 1.5)},
          {"bias", random_tensor(param, {4}, 13, -0.5, 0.5)},
          {"running_mean", random_tensor(param, {4}, 14, -0.5, 0.5)},
          {"running_var", random_tensor(param, {4}, 15, 0.5, 1.5)},
          {"w", random_tensor(t, {6, 4, 1, 1}, 16, -0.5, 0.5)}};
}

// The batch_norm_apply nodes of g.
std::vector<const Node*> applies(const Graph& g) {
  std::vector<const Node*> out;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::batch_norm_apply) out.push_back(&n);
  return out;
}

TEST(RematerializePointwise, ABatchNormsYIsAppliedAgainForElementwiseBackwardReaders) {
  struct Case {
    DType t, param;
    bool relu;
    const char* after;
  };
  for (const Case& k :
       {Case{DType::f32, DType::f32, false, "hardswish"},
        Case{DType::bf16, DType::f32, false, "hardswish"},
        Case{DType::f32, DType::f32, true, "gate"}, Case{DType::bf16, DType::f32, true, "gate"}}) {
    SCOPED_TRACE(cat(dtype_name(k.t), " x, ", dtype_name(k.param), " params, ", k.after,
                     k.relu ? ", relu" : ""));
    const Graph before = batch_norm_step(k.t, k.param, k.relu, k.after);
    Graph g = before;
    EXPECT_GE(rematerialize_pointwise(g, nullptr, kSmallGraph), 1u);
    g.verify();
    const std::vector<const Node*> apply = applies(g);
    ASSERT_EQ(apply.size(), 1u);
    // From x and the saved statistics, with the forward's relu; y itself is read by the
    // forward alone now (its last reader well before the copy's first).
    const Node& bn = g.node(g.value(*g.find_value("y")).producer);
    EXPECT_EQ(apply[0]->inputs[0], bn.inputs[0]);
    EXPECT_EQ(apply[0]->inputs[3], bn.outputs[3]);
    EXPECT_EQ(apply[0]->inputs[4], bn.outputs[4]);
    EXPECT_EQ(std::get<BatchNormAttrs>(apply[0]->attrs).relu, k.relu);
    const std::vector<NodeId> y_readers = readers_of(g, "y");
    ASSERT_FALSE(readers_of(g, "y/recompute").empty());
    EXPECT_LT(y_readers.back(), readers_of(g, "y/recompute").front());
    for (NodeId r : y_readers) EXPECT_LT(r, apply[0]->id);
    // The same gradients, bit for bit (the forward normalises with the statistics as stored).
    const NamedTensors feeds = batch_norm_feeds(k.t, k.param);
    const NamedTensors want = run_graph(before, feeds), got = run_graph(g, feeds);
    for (const char* d : {"dscale", "dbias", "dw"})
      EXPECT_TRUE(all_close(got.at(d), want.at(d), 0, 0)) << d;
  }
}

TEST(RematerializePointwise, ABatchNormsYStaysWhereAConvolutionOrInexactStatisticsReadIt) {
  // The convolution's wgrad reads y: it is the convolution's input, kept.
  Graph conv = batch_norm_step(DType::f32, DType::f32, true, "none");
  rematerialize_pointwise(conv, nullptr, kSmallGraph);
  EXPECT_TRUE(applies(conv).empty());
  // bf16 statistics (not x's compute type): y from them would not be the forward's bits.
  Graph low = batch_norm_step(DType::bf16, DType::bf16, false, "hardswish");
  rematerialize_pointwise(low, nullptr, kSmallGraph);
  EXPECT_TRUE(applies(low).empty());
}

}  // namespace
}  // namespace fusebox::testing
