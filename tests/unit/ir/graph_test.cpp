// Graph and Builder: building, naming, errors at add time, verify() and dump().
#include <limits>
#include <set>

#include "fusebox/ir/builder.h"
#include "infer_testing.h"
#include "testing.h"

// Designated initialisers (ConvAttrs{.strides = ...}) leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::ir_test {
namespace {

using testing::error_message;  // tests/testing.h

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every node's outputs are held to kMaxTensorBytes where they are made, whatever the op: an
// expand to [2^44 + 1, 2^20] (2^66 bytes of f32, which wraps 2^64 to 4 MiB) is refused when
// the node is added, naming the node, the shape and the limit; so is a graph input.
TEST(Graph, ValuesPastTheTensorLimitAreRefusedWhereTheyAreMade) {
  Graph g("net");
  const ValueId x = g.add_input("x", DType::f32, {1, 1});
  const std::string message = error_message([&] {
    g.add_node(OpKind::expand, ExpandAttrs{{(int64_t(1) << 44) + 1, int64_t(1) << 20}}, {x}, "big");
  });
  EXPECT_TRUE(contains(message, "[expand 'big'] output 0 would be f32[17592186044417, 1048576]"))
      << message;
  EXPECT_TRUE(contains(message, "1.0 TiB one tensor may hold")) << message;
  EXPECT_EQ(g.nodes().size(), 0u);  // nothing was added
  // Within the limit, and empty but with extents whose product passes it.
  EXPECT_NO_THROW(g.add_node(OpKind::expand, ExpandAttrs{{1024, 1024}}, {x}, "fine"));
  const std::string wide = error_message([&] {
    g.add_node(OpKind::expand, ExpandAttrs{{0, int64_t(1) << 30, int64_t(1) << 20}}, {x}, "wide");
  });
  EXPECT_TRUE(contains(wide, "[expand 'wide'] output 0 would be f32[0, 1073741824, 1048576]"))
      << wide;
  EXPECT_TRUE(contains(wide, "over its nonzero extents")) << wide;
  EXPECT_TRUE(contains(error_message([&] {
                         g.add_input("huge", DType::bf16, {int64_t(1) << 62, 4});
                       }),
                       "[graph net] input 'huge' would be bf16[4611686018427387904, 4]"));
}

struct SmallCnn {
  Graph g{"net"};
  ValueId x, conv, pool, logits, probs;
};

// x -> conv(pad 1) -> relu -> max_pool 2x2 -> flatten -> gemm -> softmax
void build_small_cnn(SmallCnn& n) {
  Builder b(n.g);
  n.x = n.g.add_input("x", DType::f32, {1, 3, 8, 8});
  ValueId w = n.g.add_constant("w", Tensor::zeros(DType::f32, {4, 3, 3, 3}));
  ValueId fc_w = n.g.add_constant("fc_w", Tensor::zeros(DType::f32, {64, 10}));
  ValueId fc_b = n.g.add_constant("fc_b", Tensor::zeros(DType::f32, {10}));
  n.conv = b.name("c1").conv(n.x, w, kNoValue, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}});
  ValueId r = b.relu(n.conv);
  n.pool = b.max_pool(r, PoolAttrs{.kernel = {2, 2}, .strides = {2, 2}});
  n.logits = b.gemm(b.flatten(n.pool), fc_w, fc_b);
  n.probs = b.softmax(n.logits);
  n.g.mark_output(n.probs);
}

TEST(Builder, SmallCnnShapes) {
  SmallCnn n;
  build_small_cnn(n);
  const Graph& g = n.g;
  EXPECT_EQ(g.value(n.conv).type, f32({1, 4, 8, 8}));
  EXPECT_EQ(g.value(n.pool).type, f32({1, 4, 4, 4}));
  EXPECT_EQ(g.value(n.logits).type, f32({1, 10}));
  EXPECT_EQ(g.value(n.probs).type, f32({1, 10}));
  ASSERT_EQ(g.nodes().size(), 6u);
  EXPECT_EQ(g.nodes()[0].name, "c1");
  EXPECT_EQ(g.value(n.conv).name, "c1");
  EXPECT_EQ(g.find_value("c1"), n.conv);
  EXPECT_EQ(g.value(n.conv).producer, 0);
  EXPECT_EQ(g.outputs(), (std::vector<ValueId>{n.probs}));
  // Attributes were normalised at add time.
  const ConvAttrs& a = std::get<ConvAttrs>(g.nodes()[0].attrs);
  EXPECT_EQ(a.strides, (Ints{1, 1}));
  EXPECT_EQ(std::get<SoftmaxAttrs>(g.nodes()[5].attrs).axis, 1);
  EXPECT_NO_THROW(g.verify());
}

TEST(Builder, ErrorsNameTheNodeAndAddNothing) {
  Graph g("net");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {1, 3, 8, 8});
  ValueId w = g.add_constant("w", Tensor::zeros(DType::f32, {8, 2, 3, 3}));
  std::string msg = error_message([&] { b.name("c1").conv(x, w); });
  EXPECT_EQ(msg.rfind("[conv 'c1'] ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "x has 3 channels but w expects 2 (w [8, 2, 3, 3], groups 1)")) << msg;
  EXPECT_TRUE(g.nodes().empty());
  // The failed call used up the name; the next node gets a generated one.
  ValueId r = b.relu(x);
  EXPECT_NE(g.value(r).name, "c1");
  EXPECT_NO_THROW(g.verify());
}

TEST(Builder, AttributeDefaultsAndForms) {
  Graph g("net");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 3, 4, 4});
  ValueId c = g.add_constant("c", Tensor::zeros(DType::f32, {3}));
  b.leaky_relu(x);
  EXPECT_DOUBLE_EQ(std::get<LeakyReluAttrs>(g.nodes().back().attrs).alpha, 0.01);
  // batch_norm is the inference form whatever the attrs say; max_pool returns y only.
  ValueId y = b.batch_norm(x, c, c, c, c, BatchNormAttrs{.training = true});
  EXPECT_EQ(g.nodes().back().outputs.size(), 1u);
  EXPECT_EQ(g.value(y).type, f32({2, 3, 4, 4}));
  b.max_pool(x, PoolAttrs{.kernel = {2, 2}, .return_indices = true});
  EXPECT_EQ(g.nodes().back().outputs.size(), 1u);
  std::vector<ValueId> t = b.name("bn").batch_norm_training(x, c, c, c, c);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(g.value(t[0]).name, "bn:0");
  EXPECT_EQ(g.value(t[4]).name, "bn:4");
  EXPECT_EQ(g.value(t[3]).type, f32({3}));
  ValueId k = b.constant(Tensor::zeros(DType::i64, {5}));
  EXPECT_EQ(g.value(k).type, typed(DType::i64, {5}));
  ValueId labels = g.add_input("labels", DType::i64, {2, 4, 4});
  std::vector<ValueId> ce = b.cross_entropy(x, labels);
  ASSERT_EQ(ce.size(), 2u);
  EXPECT_EQ(g.value(ce[0]).type, f32({}));
  EXPECT_EQ(g.value(ce[1]).type, f32({2, 3, 4, 4}));
  EXPECT_NO_THROW(g.verify());
}

TEST(Graph, NodeAndValueNamesStayUnique) {
  Graph g("net");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {4});
  ValueId a = b.name("blk").relu(x);
  ValueId c = b.name("blk").relu(a);
  ValueId d = b.relu(c);
  ValueId e = b.relu(d);
  std::set<std::string> node_names, value_names;
  for (const Node& n : g.nodes()) node_names.insert(n.name);
  for (const Value& v : g.values()) value_names.insert(v.name);
  EXPECT_EQ(node_names.size(), g.nodes().size());
  EXPECT_EQ(value_names.size(), g.values().size());
  EXPECT_EQ(g.nodes()[0].name, "blk");
  EXPECT_NE(g.nodes()[1].name, "blk");
  EXPECT_NE(g.value(d).name, g.value(e).name);
  EXPECT_NO_THROW(g.verify());
}

TEST(Graph, AddNodeRejectsBadInputs) {
  Graph g("net");
  ValueId x = g.add_input("x", DType::f32, {4});
  std::string msg = error_message([&] { g.add_node(OpKind::relu, {}, {99}, "r"); });
  EXPECT_TRUE(contains(msg, "[relu 'r'] input 0 refers to value id 99 which does not exist"))
      << msg;
  msg = error_message([&] { g.add_node(OpKind::add, {}, {x, -7}, "a"); });
  EXPECT_TRUE(contains(msg, "input 1 refers to value id -7")) << msg;
  msg = error_message([&] { g.add_node(OpKind::relu, {}, {kNoValue}, "r"); });
  EXPECT_TRUE(contains(msg, "[relu 'r'] input 0 (x) is required but absent")) << msg;
  msg = error_message([&] { g.add_node(OpKind::relu, {}, {x}, "r", {"x"}); });
  EXPECT_TRUE(contains(msg, "output name 'x' is already used")) << msg;
  msg = error_message([&] { g.mark_output(42); });
  EXPECT_TRUE(contains(msg, "output value id 42 does not exist")) << msg;
  EXPECT_TRUE(g.nodes().empty());
  EXPECT_NO_THROW(g.verify());
}

TEST(Graph, VerifyAcceptsNormalisedNodes) {
  // Each of these attributes is rewritten at add time; verify() re-infers from the
  // rewritten form and must get the same types.
  Graph g("norm");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 1, 6, 5});
  ValueId flipped =
      b.slice(x, SliceAttrs{{-1, 0}, {std::numeric_limits<int64_t>::min(), -1}, {-1, 2}, {-1, 2}});
  EXPECT_EQ(g.value(flipped).type, f32({2, 1, 3, 5}));
  ValueId r = b.reshape(flipped, {0, -1});
  EXPECT_EQ(g.value(r).type, f32({2, 15}));
  ValueId empty = g.add_input("empty", DType::f32, {0, 4});
  EXPECT_EQ(g.value(b.reshape(empty, {0, 2, 2})).type, f32({0, 2, 2}));
  ValueId s = b.squeeze(x);
  EXPECT_EQ(g.value(s).type, f32({2, 6, 5}));
  ValueId u = b.unsqueeze(s, {-1, 0});
  EXPECT_EQ(g.value(u).type, f32({1, 2, 6, 5, 1}));
  ValueId t = b.transpose(u);
  EXPECT_EQ(g.value(t).type, f32({1, 5, 6, 2, 1}));
  ValueId red = b.reduce_mean(t, {});
  EXPECT_EQ(g.value(red).type, f32({1, 1, 1, 1, 1}));
  ValueId p = b.avg_pool(x, PoolAttrs{.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = true});
  EXPECT_EQ(g.value(p).type, f32({2, 1, 3, 2}));
  ValueId ln = b.layer_norm(x, kNoValue, kNoValue, NormAttrs{.axis = -2});
  EXPECT_EQ(g.value(ln).type, f32({2, 1, 6, 5}));
  EXPECT_EQ(g.nodes().back().outputs.size(), 3u);
  ValueId cat_ = b.concat({x, x}, -3);
  EXPECT_EQ(g.value(cat_).type, f32({2, 2, 6, 5}));
  EXPECT_NO_THROW(g.verify());
}

TEST(Graph, DumpShowsOpsShapesAndNames) {
  SmallCnn n;
  build_small_cnn(n);
  const std::string d = n.g.dump();
  for (const char* part : {"graph net (6 nodes, 3 constants)", "input  %x: f32[1, 3, 8, 8]",
                           "%c1: f32[1, 4, 8, 8] = conv(%x, $w)", "pads_begin=[1, 1]", "# c1",
                           "= relu(%c1)", "= max_pool(", "f32[1, 4, 4, 4]", "= flatten(",
                           "f32[1, 64]", "= gemm(", "$fc_b", "= softmax(", "output %"}) {
    EXPECT_TRUE(contains(d, part)) << "dump lacks '" << part << "':\n" << d;
  }
}

}  // namespace
}  // namespace fusebox::ir_test
