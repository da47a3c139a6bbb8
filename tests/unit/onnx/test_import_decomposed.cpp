// Ops imported as chains of existing ops or evaluated at import (import_ops_known.cpp,
// import_ops_einsum.cpp, and the Resize, Split, Tile, Gather forms of import_ops_shape.cpp):
// each against its definition, and the refusals (unsupported, naming the node).
#include <cmath>
#include <limits>
#include <map>

#include "fusebox/train/session.h"
#include "onnx_test_util.h"

namespace fusebox::testing {
namespace {

using onnx::TensorProto;

// The exporters' shape arithmetic: Shape -> Equal -> Where (a -1 in a target shape replaced by
// the input's extent), Mod (window padding), Range, comparisons and logic, all known at import,
// fold away; Expand becomes the graph's expand op.
TEST(OnnxImport, ShapeArithmeticFoldsAtImport) {
  TestModel m(17);
  m.input("x", TensorProto::FLOAT, {2, 3, 4});
  m.node("Shape", {"x"}, {"shape"});
  m.initializer("target", Tensor::from_vector<int64_t>({3}, {-1, 3, 1}));
  m.initializer("minus_one", Tensor::from_vector<int64_t>({}, {-1}));
  m.node("Equal", {"target", "minus_one"}, {"is_free"});
  m.node("Where", {"is_free", "shape", "target"}, {"dims"});  // [2, 3, 1]
  m.initializer("seven", Tensor::from_vector<int64_t>({}, {7}));
  attr_int(m.node("Mod", {"seven", "dims"}, {"rem"}), "fmod", 0);  // 7 mod [2, 3, 1] = [1, 1, 0]
  m.node("Not", {"is_free"}, {"fixed"});
  m.node("And", {"fixed", "is_free"}, {"none"});
  m.initializer("zero", Tensor::from_vector<int64_t>({}, {0}));
  m.initializer("one", Tensor::from_vector<int64_t>({}, {1}));
  m.initializer("four", Tensor::from_vector<int64_t>({}, {4}));
  m.node("Range", {"zero", "four", "one"}, {"range"});  // [0, 1, 2, 3]
  m.node("Greater", {"range", "one"}, {"big"});         // [F, F, T, T]
  m.node("Expand", {"x", "dims"}, {"y"});               // [2, 3, 4]: dims' 1 broadcasts
  m.output("y");
  m.output("rem", TensorProto::INT64);
  m.output("none", TensorProto::BOOL);
  m.output("big", TensorProto::BOOL);
  OnnxImportReport report;
  Graph g = import(m, {.report = &report});
  EXPECT_EQ(report.onnx_nodes, 9);
  EXPECT_EQ(report.folded, 8);  // all but the Expand
  EXPECT_EQ(report.folded_by_op["Shape"], 1);
  EXPECT_EQ(report.folded_by_op.count("Expand"), 0u);
  int computed = 0;  // nodes other than constants: the expand alone
  for (const Node& n : g.nodes()) computed += n.op != OpKind::constant;
  EXPECT_EQ(computed, 1);
  const Tensor x = random_tensor(DType::f32, {2, 3, 4}, 5);
  EXPECT_EQ(run1(g, {{"x", x}}, "y").to_doubles(), x.to_doubles());
  EXPECT_EQ(run1(g, {{"x", x}}, "rem").to_doubles(), (std::vector<double>{1, 1, 0}));
  EXPECT_EQ(run1(g, {{"x", x}}, "none").to_doubles(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(run1(g, {{"x", x}}, "big").to_doubles(), (std::vector<double>{0, 0, 1, 1}));
}

// HardSigmoid, HardSwish, Softplus, Elu and PRelu import as chains of existing ops; their
// values against the ONNX formulas in double, including large |x| (Softplus and Elu must not
// overflow into inf or NaN).
TEST(OnnxImport, DecomposedActivationsMatchTheirFormulas) {
  const std::vector<double> xs = {-100, -3.5, -1, -0.25, 0, 0.3, 1, 2.9, 4, 100};
  const Tensor x = Tensor::from_doubles(DType::f32, {int64_t(xs.size())}, xs);
  TestModel m(17);
  m.input("x", TensorProto::FLOAT, {int64_t(xs.size())});
  onnx::NodeProto* hs = m.node("HardSigmoid", {"x"}, {"hsig"});
  attr_float(hs, "alpha", 0.3f);
  attr_float(hs, "beta", 0.4f);
  m.node("HardSwish", {"x"}, {"hswish"});
  m.node("Softplus", {"x"}, {"softplus"});
  attr_float(m.node("Elu", {"x"}, {"elu"}), "alpha", 2.0f);
  m.initializer("slope", Tensor::from_vector<float>({1}, {0.25f}));
  m.node("PRelu", {"x", "slope"}, {"prelu"});
  for (const char* name : {"hsig", "hswish", "softplus", "elu", "prelu"}) m.output(name);
  const Graph g = import(m);
  auto expect = [&](const char* name, auto f) {
    const std::vector<double> got = run1(g, {{"x", x}}, name).to_doubles();
    for (size_t i = 0; i < xs.size(); ++i) {
      const double want = f(double(float(xs[i])));
      EXPECT_NEAR(got[i], want, 1e-5 * std::max(1.0, std::abs(want)))
          << name << "(" << xs[i] << ")";
    }
  };
  auto clamp01 = [](double v) { return std::min(1.0, std::max(0.0, v)); };
  expect("hsig", [&](double v) { return clamp01(double(0.3f) * v + double(0.4f)); });
  expect("hswish", [&](double v) { return v * clamp01(v / 6 + 0.5); });
  expect("softplus", [](double v) { return v > 30 ? v : std::log1p(std::exp(v)); });
  expect("elu", [](double v) { return v > 0 ? v : 2 * (std::exp(v) - 1); });
  expect("prelu", [](double v) { return v > 0 ? v : 0.25 * v; });
}

// A shared PReLU slope [1] (nn.PReLU()'s default) stays a parameter for training, unlike a
// one-element literal that only arithmetic reads (train/session.h).
TEST(OnnxImport, SharedPReluSlopeIsTrained) {
  TestModel m(17);
  m.input("x", TensorProto::FLOAT, {2, 3});
  m.initializer("act.weight", Tensor::from_vector<float>({1}, {0.25f}));
  m.node("PRelu", {"x", "act.weight"}, {"logits"});
  m.output("logits");
  const TrainingSession session(import(m), LossSpec{}, SgdOptions{});
  EXPECT_TRUE(session.parameters().count("act.weight"));
}

// InstanceNormalization as reshape + layer_norm + per-channel affine, against the formula.
TEST(OnnxImport, InstanceNormalizationMatchesItsFormula) {
  const Shape shape = {2, 3, 4, 5};
  const Tensor x = random_tensor(DType::f32, shape, 11, -3, 3);
  const Tensor scale = Tensor::from_vector<float>({3}, {0.5f, -1.0f, 2.0f});
  const Tensor bias = Tensor::from_vector<float>({3}, {0.1f, 0.0f, -0.3f});
  TestModel m(17);
  m.input("x", TensorProto::FLOAT, shape);
  m.initializer("s", scale);
  m.initializer("b", bias);
  attr_float(m.node("InstanceNormalization", {"x", "s", "b"}, {"y"}, "inorm"), "epsilon", 1e-3f);
  m.output("y");
  const std::vector<double> got = run1(import(m), {{"x", x}}, "y").to_doubles();
  const std::vector<double> v = x.to_doubles(), s = scale.to_doubles(), b = bias.to_doubles();
  const size_t plane = 20;
  for (size_t p = 0; p < 6; ++p) {
    double mean = 0, var = 0;
    for (size_t i = 0; i < plane; ++i) mean += v[p * plane + i] / plane;
    for (size_t i = 0; i < plane; ++i)
      var += (v[p * plane + i] - mean) * (v[p * plane + i] - mean) / plane;
    for (size_t i = 0; i < plane; ++i) {
      const double want =
          s[p % 3] * (v[p * plane + i] - mean) / std::sqrt(var + double(1e-3f)) + b[p % 3];
      EXPECT_NEAR(got[p * plane + i], want, 1e-5) << "plane " << p << " element " << i;
    }
  }
  // A rank-2 input is an error naming the node.
  TestModel bad(17);
  bad.input("x", TensorProto::FLOAT, {2, 3});
  bad.initializer("s", scale);
  bad.initializer("b", bias);
  bad.node("InstanceNormalization", {"x", "s", "b"}, {"y"}, "inorm");
  bad.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(bad); },
                                {"node 'inorm' (InstanceNormalization)", "[N, C, D1"}));
}

// Split and Tile: slices and expand + reshape; bad sizes are errors naming the node.
TEST(OnnxImport, SplitAndTile) {
  const Tensor x = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  TestModel m(17);
  m.input("x", TensorProto::FLOAT, {2, 3});
  m.initializer("sizes", Tensor::from_vector<int64_t>({2}, {1, 2}));
  attr_int(m.node("Split", {"x", "sizes"}, {"a", "b"}), "axis", 1);
  m.initializer("reps", Tensor::from_vector<int64_t>({2}, {2, 1}));
  m.node("Tile", {"b", "reps"}, {"t"});
  for (const char* name : {"a", "b", "t"}) m.output(name);
  const Graph g = import(m);
  EXPECT_EQ(run1(g, {{"x", x}}, "a").to_doubles(), (std::vector<double>{1, 4}));
  EXPECT_EQ(run1(g, {{"x", x}}, "t").shape(), (Shape{4, 2}));
  EXPECT_EQ(run1(g, {{"x", x}}, "t").to_doubles(), (std::vector<double>{2, 3, 5, 6, 2, 3, 5, 6}));
  TestModel bad(17);
  bad.input("x", TensorProto::FLOAT, {2, 3});
  bad.initializer("sizes", Tensor::from_vector<int64_t>({2}, {1, 1}));
  attr_int(bad.node("Split", {"x", "sizes"}, {"a", "b"}, "sp"), "axis", 1);
  bad.output("a");
  EXPECT_TRUE(throws_error_with([&] { import(bad); }, {"node 'sp' (Split)", "add up to 2"}));
  TestModel uneven(17);
  uneven.input("x", TensorProto::FLOAT, {2, 3});
  attr_int(uneven.node("Split", {"x"}, {"a", "b"}, "sp"), "axis", 1);
  uneven.output("a");
  EXPECT_TRUE(throws_error_with([&] { import(uneven); }, {"node 'sp' (Split)", "2 equal parts"}));
  TestModel neg(17);
  neg.input("x", TensorProto::FLOAT, {2, 3});
  neg.initializer("reps", Tensor::from_vector<int64_t>({2}, {-1, 1}));
  neg.node("Tile", {"x", "reps"}, {"t"}, "tile");
  neg.output("t");
  EXPECT_TRUE(throws_error_with([&] { import(neg); }, {"node 'tile' (Tile)", "negative repeat"}));
}

// Einsum against a naive evaluation over every label assignment (letters only; the ellipsis
// case is written with its dims spelled out for the reference).
std::vector<double> naive_einsum(const std::vector<std::string>& terms, const std::string& out,
                                 const std::vector<Tensor>& in, std::map<char, int64_t> extent) {
  std::string labels;  // the labels the operands use
  for (const std::string& t : terms)
    for (char ch : t)
      if (labels.find(ch) == std::string::npos) labels += ch;
  std::vector<double> result;
  int64_t out_count = 1;
  for (char ch : out) out_count *= extent[ch];
  result.assign(size_t(out_count), 0.0);
  std::vector<std::vector<double>> values;
  for (const Tensor& t : in) values.push_back(t.to_doubles());
  std::map<char, int64_t> at;
  for (char ch : labels) at[ch] = 0;
  auto offset = [&](const std::string& term) {
    int64_t o = 0;
    for (char ch : term) o = o * extent[ch] + at[ch];
    return o;
  };
  for (;;) {
    double p = 1;
    for (size_t i = 0; i < terms.size(); ++i) p *= values[i][size_t(offset(terms[i]))];
    result[size_t(offset(out))] += p;
    size_t d = labels.size();
    while (d-- > 0) {
      if (++at[labels[d]] < extent[labels[d]]) break;
      at[labels[d]] = 0;
    }
    if (d == size_t(-1)) break;
  }
  return result;
}

TEST(OnnxImport, EinsumAsMatmulTransposeAndSums) {
  struct Case {
    std::string equation;
    std::vector<std::string> terms;  // letters only, for the reference
    std::string out;
  };
  const std::map<char, int64_t> extent = {{'a', 2}, {'b', 3}, {'h', 2}, {'i', 4},
                                          {'j', 3}, {'d', 5}, {'k', 2}, {'x', 3}};
  const Case cases[] = {
      {"bhid,bhjd->bhij", {"bhid", "bhjd"}, "bhij"},  // attention scores
      {"bij,bjk->bik", {"bij", "bjk"}, "bik"},
      {"ij,jk", {"ij", "jk"}, "ik"},  // implicit output
      {"...ij,...jk->...ik", {"xij", "xjk"}, "xik"},
      {"ab,bd->d", {"ab", "bd"}, "d"},  // a summed away first
      {"ijk->kj", {"ijk"}, "kj"},
      {"ij->", {"ij"}, ""},
      {"bhij,bhjd->bihd", {"bhij", "bhjd"}, "bihd"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.equation);
    TestModel m(17);
    std::vector<Tensor> in;
    std::vector<std::string> names;
    for (size_t i = 0; i < k.terms.size(); ++i) {
      Shape shape;
      for (char ch : k.terms[i]) shape.push_back(extent.at(ch));
      in.push_back(random_tensor(DType::f32, shape, 40 + i));
      names.push_back(cat("in", i));
      m.input(names.back(), TensorProto::FLOAT, shape);
    }
    attr_string(m.node("Einsum", names, {"y"}), "equation", k.equation);
    m.output("y");
    NamedTensors feeds;
    for (size_t i = 0; i < in.size(); ++i) feeds[names[i]] = in[i];
    const std::vector<double> got = run1(import(m), feeds, "y").to_doubles();
    const std::vector<double> want = naive_einsum(k.terms, k.out, in, extent);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
  }
  // Three operands and mismatched extents are unsupported; a bad character is an error.
  TestModel three(17);
  for (const char* n : {"p", "q", "r"}) three.input(n, TensorProto::FLOAT, {2, 2});
  attr_string(three.node("Einsum", {"p", "q", "r"}, {"y"}, "e3"), "equation", "ij,jk,kl->il");
  three.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(three); },
                                {"unsupported: node 'e3' (Einsum)", "more than two"}));
  TestModel mismatch(17);
  mismatch.input("p", TensorProto::FLOAT, {2, 3});
  mismatch.input("q", TensorProto::FLOAT, {4, 2});
  attr_string(mismatch.node("Einsum", {"p", "q"}, {"y"}, "em"), "equation", "ij,jk->ik");
  mismatch.output("y");
  EXPECT_TRUE(
      throws_error_with([&] { import(mismatch); }, {"node 'em' (Einsum)", "extents 3 and 4"}));
  TestModel bad(17);
  bad.input("p", TensorProto::FLOAT, {2, 3});
  attr_string(bad.node("Einsum", {"p"}, {"y"}, "eb"), "equation", "i7->i");
  bad.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(bad); }, {"node 'eb' (Einsum)", "'7'"}));
}

// Resize as a repeat: PyTorch's nearest upsampling export (asymmetric, floor) by 3 along W and
// 2 along H, against out[i] = in[i / factor]; linear mode is refused as unsupported.
TEST(OnnxImport, ResizeNearestIntegerUpsamplingIsARepeat) {
  const Tensor x = random_tensor(DType::f32, {1, 2, 2, 3}, 21);
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {1, 2, 2, 3});
  m.initializer("roi", Tensor::from_vector<float>({0}, {}));
  m.initializer("scales", Tensor::from_vector<float>({4}, {1, 1, 2, 3}));
  onnx::NodeProto* r = m.node("Resize", {"x", "roi", "scales"}, {"y"}, "up");
  attr_string(r, "mode", "nearest");
  attr_string(r, "coordinate_transformation_mode", "asymmetric");
  attr_string(r, "nearest_mode", "floor");
  m.output("y");
  const Tensor y = run1(import(m), {{"x", x}}, "y");
  ASSERT_EQ(y.shape(), (Shape{1, 2, 4, 9}));
  const std::vector<double> in = x.to_doubles(), out = y.to_doubles();
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t w = 0; w < 9; ++w)
        EXPECT_EQ(out[size_t((c * 4 + h) * 9 + w)], in[size_t((c * 2 + h / 2) * 3 + w / 3)]);
  auto set = [&](const std::string& name, const std::string& value) {
    for (onnx::AttributeProto& a : *r->mutable_attribute())
      if (a.name() == name) a.set_s(value);
  };
  EXPECT_EQ(count_ops(import(m), OpKind::resize), 0);
  // Anything but a repeat is the resize op (ops.h), with the node's mapping.
  set("mode", "linear");
  EXPECT_EQ(count_ops(import(m), OpKind::resize), 1);
  set("mode", "nearest");
  set("nearest_mode", "ceil");
  const Graph g = import(m);
  ASSERT_EQ(count_ops(g, OpKind::resize), 1);
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::resize) continue;
    const auto& a = std::get<ResizeAttrs>(n.attrs);
    EXPECT_EQ(a.nearest, ResizeNearest::ceil);
    EXPECT_EQ(a.coordinates, ResizeCoordinates::asymmetric);
    EXPECT_EQ(a.scales, (std::vector<double>{1, 1, 2, 3}));
  }
  set("coordinate_transformation_mode", "tf_half_pixel_for_nn");  // opsets 11-12 only
  EXPECT_TRUE(throws_error_with([&] { import(m); },
                                {"unsupported: node 'up' (Resize)", "tf_half_pixel_for_nn"}));
}

// ScatterND on known tensors (how Swin builds its attention mask): rows replaced, then added.
TEST(OnnxImport, ScatterNdOnKnownTensors) {
  TestModel m(16);
  m.initializer("data", Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6}));
  m.initializer("rows", Tensor::from_vector<int64_t>({2, 1}, {2, -3}));
  m.initializer("updates", Tensor::from_vector<float>({2, 2}, {10, 20, 30, 40}));
  m.node("ScatterND", {"data", "rows", "updates"}, {"set"});
  attr_string(m.node("ScatterND", {"data", "rows", "updates"}, {"sum"}), "reduction", "add");
  m.output("set");
  m.output("sum");
  const Graph g = import(m);
  EXPECT_EQ(run1(g, {}, "set").to_doubles(), (std::vector<double>{30, 40, 3, 4, 10, 20}));
  EXPECT_EQ(run1(g, {}, "sum").to_doubles(), (std::vector<double>{31, 42, 3, 4, 15, 26}));
  TestModel bad(16);
  bad.initializer("data", Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6}));
  bad.initializer("rows", Tensor::from_vector<int64_t>({1, 1}, {3}));
  bad.initializer("updates", Tensor::from_vector<float>({1, 2}, {0, 0}));
  bad.node("ScatterND", {"data", "rows", "updates"}, {"y"}, "sc");
  bad.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(bad); }, {"node 'sc' (ScatterND)", "out of range"}));
}

// ScatterND and ScatterElements on run-time data and updates (known indices) agree with the
// same nodes folded at import (data and updates as initializers): every reduction, repeated
// targets (combined in order; the last one wins without a reduction), negative indices.
TEST(OnnxImport, ScattersOnRunTimeValuesMatchTheFoldedOnes) {
  struct Case {
    const char* op;
    Shape data, indices, updates;
    std::vector<int64_t> index_values;
    int64_t axis;
  };
  const Case cases[] = {
      {"ScatterND", {4, 3}, {3, 1}, {3, 3}, {2, -4, 2}, 0},        // rows, row 2 twice
      {"ScatterND", {2, 3, 2}, {2, 2}, {2, 2}, {1, 2, 0, -1}, 0},  // slices of 2
      {"ScatterElements", {3, 4}, {2, 4}, {2, 4}, {0, 2, 1, 0, 2, 2, -1, 0}, 0},
      {"ScatterElements", {3, 4}, {3, 2}, {3, 2}, {3, 3, 0, -4, 1, 1}, 1},  // repeats per row
  };
  for (const Case& k : cases) {
    for (const char* reduction : {"none", "add", "mul", "max", "min"}) {
      SCOPED_TRACE(cat(k.op, " ", shape_str(k.data), " ", reduction));
      const Tensor data = random_tensor(DType::f32, k.data, 1, -2, 2);
      const Tensor updates = random_tensor(DType::f32, k.updates, 2, -2, 2);
      const Tensor indices = Tensor::from_vector<int64_t>(k.indices, k.index_values);
      auto model = [&](bool known) {
        TestModel m(18);
        if (known) {
          m.initializer("data", data);
          m.initializer("updates", updates);
        } else {
          m.input("data", TensorProto::FLOAT, k.data);
          m.input("updates", TensorProto::FLOAT, k.updates);
        }
        m.initializer("indices", indices);
        onnx::NodeProto* n = m.node(k.op, {"data", "indices", "updates"}, {"y"}, "sc");
        attr_string(n, "reduction", reduction);
        if (std::string(k.op) == "ScatterElements") attr_int(n, "axis", k.axis);
        m.output("y");
        return m;
      };
      const Tensor want = run1(import(model(true)), {}, "y");
      const Tensor got = run1(import(model(false)), {{"data", data}, {"updates", updates}}, "y");
      // The fold combines in f64 and rounds once; the graph rounds after each f32 step.
      EXPECT_TRUE(all_close(got, want, 1e-6, 1e-6));
    }
  }
  // Indices computed at run time are refused, naming the input.
  TestModel r(16);
  r.input("data", TensorProto::FLOAT, {4});
  r.input("indices", TensorProto::INT64, {1, 1});
  r.input("updates", TensorProto::FLOAT, {1});
  r.node("ScatterND", {"data", "indices", "updates"}, {"y"}, "sc");
  r.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(r); }, {"node 'sc' (ScatterND)", "indices"}));
  // max / min are opset 18's.
  TestModel old(16);
  old.input("data", TensorProto::FLOAT, {4});
  old.initializer("indices", Tensor::from_vector<int64_t>({1, 1}, {0}));
  old.input("updates", TensorProto::FLOAT, {1});
  attr_string(old.node("ScatterND", {"data", "indices", "updates"}, {"y"}, "sc"), "reduction",
              "max");
  old.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(old); }, {"node 'sc' (ScatterND)", "reduction"}));
}

// GatherND with known indices on run-time data (Swin v2's relative-position lookup in the
// dynamo export): index tuples with negative entries, and batch_dims 1, against hand-worked
// values.
TEST(OnnxImport, GatherNdOnRunTimeData) {
  const Tensor data = Tensor::from_vector<float>({2, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  TestModel m(13);
  m.input("data", TensorProto::FLOAT, {2, 2, 3});
  m.initializer("pairs", Tensor::from_vector<int64_t>({2, 2}, {1, 0, -2, -1}));
  m.initializer("batched", Tensor::from_vector<int64_t>({2, 2, 1}, {1, 0, 0, -1}));
  m.node("GatherND", {"data", "pairs"}, {"rows"});
  attr_int(m.node("GatherND", {"data", "batched"}, {"per_batch"}), "batch_dims", 1);
  m.output("rows");
  m.output("per_batch");
  const Graph g = import(m);
  const Tensor rows = run1(g, {{"data", data}}, "rows");
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.to_doubles(), (std::vector<double>{6, 7, 8, 3, 4, 5}));  // [1,0], [0,1]
  const Tensor per_batch = run1(g, {{"data", data}}, "per_batch");
  EXPECT_EQ(per_batch.shape(), (Shape{2, 2, 3}));
  // batch 0 rows 1, 0; batch 1 rows 0, 1.
  EXPECT_EQ(per_batch.to_doubles(), (std::vector<double>{3, 4, 5, 0, 1, 2, 6, 7, 8, 9, 10, 11}));
  TestModel bad(13);
  bad.input("data", TensorProto::FLOAT, {2, 2, 3});
  bad.initializer("pairs", Tensor::from_vector<int64_t>({1, 2}, {2, 0}));
  bad.node("GatherND", {"data", "pairs"}, {"y"}, "gnd");
  bad.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(bad); }, {"node 'gnd' (GatherND)", "out of range"}));
}

// TopK: k from the input (opset 10+) or the attribute (opset 1), both outputs, k out of range
// (the exporter: test_round_trip.cpp).
TEST(OnnxImport, TopKBothOutputsAndOpsets) {
  const Tensor x = Tensor::from_vector<float>({2, 4}, {1, 9, 3, 9, -1, -5, 0, 2});
  TestModel m(11);
  m.input("x", TensorProto::FLOAT, {2, 4});
  m.initializer("k", Tensor::from_vector<int64_t>({1}, {2}));
  attr_int(m.node("TopK", {"x", "k"}, {"v", "i"}, "top"), "largest", 0);
  m.output("v");
  m.output("i");
  const Graph g = import(m);
  EXPECT_EQ(run1(g, {{"x", x}}, "v").to_doubles(), (std::vector<double>{1, 3, -5, -1}));
  EXPECT_EQ(run1(g, {{"x", x}}, "i").to_doubles(), (std::vector<double>{0, 2, 1, 0}));
  TestModel one(9);
  one.input("x", TensorProto::FLOAT, {2, 4});
  attr_int(one.node("TopK", {"x"}, {"v", "i"}, "top"), "k", 1);
  one.output("i");
  EXPECT_EQ(run1(import(one), {{"x", x}}, "i").to_doubles(), (std::vector<double>{1, 3}));
  TestModel big(11);
  big.input("x", TensorProto::FLOAT, {2, 4});
  big.initializer("k", Tensor::from_vector<int64_t>({1}, {5}));
  big.node("TopK", {"x", "k"}, {"v", "i"}, "top");
  big.output("v");
  EXPECT_TRUE(throws_error_with([&] { import(big); }, {"top", "k 5 is outside [0, 4]"}));
}

// Bilinear Resize by integer factors (half_pixel: PyTorch's align_corners=False) against the
// definition: source x = (i + 1/2) / s - 1/2 clamped at 0, weights on floor(x), floor(x) + 1
// clamped at the last index.
TEST(OnnxImport, ResizeLinearIntegerUpsamplingMatchesTheDefinition) {
  auto interpolate = [](const std::vector<double>& in, int64_t n, int64_t s, int64_t i) {
    double x = (double(i) + 0.5) / double(s) - 0.5;
    if (x < 0) x = 0;
    const int64_t x0 = std::min<int64_t>(int64_t(std::floor(x)), n - 1);
    const int64_t x1 = std::min<int64_t>(x0 + 1, n - 1);
    const double l = x - double(x0);
    return std::make_pair(std::make_pair(x0, x1), l);
  };
  for (const auto& [sh, sw] : {std::pair<int64_t, int64_t>{2, 3}, {4, 1}, {1, 8}}) {
    SCOPED_TRACE(cat("factors ", sh, "x", sw));
    const int64_t h = 3, w = 5;
    const Tensor x = random_tensor(DType::f32, {1, 2, h, w}, 31);
    TestModel m(13);
    m.input("x", TensorProto::FLOAT, {1, 2, h, w});
    m.initializer("roi", Tensor::from_vector<float>({0}, {}));
    m.initializer("scales", Tensor::from_vector<float>({4}, {1, 1, float(sh), float(sw)}));
    onnx::NodeProto* r = m.node("Resize", {"x", "roi", "scales"}, {"y"});
    attr_string(r, "mode", "linear");
    attr_string(r, "coordinate_transformation_mode", "pytorch_half_pixel");
    m.output("y");
    const Tensor y = run1(import(m), {{"x", x}}, "y");
    ASSERT_EQ(y.shape(), (Shape{1, 2, h * sh, w * sw}));
    const std::vector<double> in = x.to_doubles(), out = y.to_doubles();
    for (int64_t ch = 0; ch < 2; ++ch)
      for (int64_t i = 0; i < h * sh; ++i)
        for (int64_t j = 0; j < w * sw; ++j) {
          const auto [ri, li] = interpolate(in, h, sh, i);
          const auto [rj, lj] = interpolate(in, w, sw, j);
          auto at = [&](int64_t a, int64_t b) { return in[size_t((ch * h + a) * w + b)]; };
          const double want =
              (1 - li) * ((1 - lj) * at(ri.first, rj.first) + lj * at(ri.first, rj.second)) +
              li * ((1 - lj) * at(ri.second, rj.first) + lj * at(ri.second, rj.second));
          EXPECT_NEAR(out[size_t((ch * h * sh + i) * w * sw + j)], want, 1e-5) << i << "," << j;
        }
  }
}

TEST(OnnxImport, KnownOnlyOpsOnRunTimeValuesAreUnsupported) {
  TestModel m(17);
  m.input("limit", TensorProto::INT64, {});
  m.initializer("start", Tensor::from_vector<int64_t>({}, {0}));
  m.initializer("delta", Tensor::from_vector<int64_t>({}, {1}));
  m.node("Range", {"start", "limit", "delta"}, {"r"}, "range");
  m.output("r", TensorProto::INT64);
  EXPECT_TRUE(
      throws_error_with([&] { import(m); }, {"unsupported: node 'range' (Range)", "'limit'"}));
  // The comparisons, logic ops and Where on run-time values are the graph's ops.
  TestModel w(17);
  w.input("a", TensorProto::INT64, {3});
  w.initializer("b", Tensor::from_vector<int64_t>({3}, {1, 2, 3}));
  w.initializer("fill", Tensor::from_vector<int64_t>({}, {-1}));
  w.node("Equal", {"a", "b"}, {"eq"}, "cmp");
  w.node("Not", {"eq"}, {"ne"}, "not");
  w.node("Where", {"ne", "a", "fill"}, {"y"}, "pick");
  w.output("y", TensorProto::INT64);
  EXPECT_EQ(
      run1(import(w), {{"a", Tensor::from_vector<int64_t>({3}, {1, 5, 3})}}, "y").to_doubles(),
      (std::vector<double>{-1, 5, -1}));
  // Mod's integer divisor of zero, and float Mod without fmod, are errors naming the node.
  TestModel z(17);
  z.initializer("a", Tensor::from_vector<int64_t>({2}, {5, 6}));
  z.initializer("b", Tensor::from_vector<int64_t>({2}, {2, 0}));
  z.node("Mod", {"a", "b"}, {"r"}, "mod");
  z.output("r", TensorProto::INT64);
  EXPECT_TRUE(throws_error_with([&] { import(z); }, {"node 'mod' (Mod)", "zero divisor"}));
  TestModel f(17);
  f.initializer("a", Tensor::from_vector<float>({1}, {5.5f}));
  f.initializer("b", Tensor::from_vector<float>({1}, {2}));
  f.node("Mod", {"a", "b"}, {"r"}, "fmod");
  f.output("r");
  EXPECT_TRUE(throws_error_with([&] { import(f); }, {"node 'fmod' (Mod)", "fmod"}));
  // Python-style sign (fmod = 0) and C-style (fmod = 1) on negative operands, INT64_MAX kept.
  TestModel s(17);
  s.initializer("a",
                Tensor::from_vector<int64_t>({3}, {-7, 7, std::numeric_limits<int64_t>::max()}));
  s.initializer("b", Tensor::from_vector<int64_t>({3}, {3, -3, 10}));
  s.node("Mod", {"a", "b"}, {"py"});
  attr_int(s.node("Mod", {"a", "b"}, {"c"}), "fmod", 1);
  s.initializer("yes", Tensor::from_doubles(DType::boolean, {3}, {1, 1, 1}));
  s.node("Where", {"yes", "a", "b"}, {"kept"});
  for (const char* name : {"py", "c", "kept"}) s.output(name, TensorProto::INT64);
  Graph g = import(s);
  EXPECT_EQ(run1(g, {}, "py").to_doubles(), (std::vector<double>{2, -2, 7}));
  EXPECT_EQ(run1(g, {}, "c").to_doubles(), (std::vector<double>{-1, 1, 7}));
  EXPECT_EQ(run1(g, {}, "kept").data<int64_t>()[2], std::numeric_limits<int64_t>::max());
}

// Integer Mod on run-time values: Python's sign (fmod = 0) and C's (fmod = 1), every sign
// combination, a broadcast divisor, i32 and i64, MIN % -1 = 0; a zero divisor is a run-time
// error naming the node.
TEST(OnnxImport, IntegerModOnRunTimeValues) {
  for (auto [proto, dtype] :
       {std::pair{TensorProto::INT64, DType::i64}, std::pair{TensorProto::INT32, DType::i32}}) {
    SCOPED_TRACE(dtype_name(dtype));
    TestModel m(17);
    m.input("a", proto, {2, 4});
    m.input("b", proto, {4});
    m.node("Mod", {"a", "b"}, {"py"}, "mod");
    attr_int(m.node("Mod", {"a", "b"}, {"c"}, "cmod"), "fmod", 1);
    m.output("py", proto);
    m.output("c", proto);
    const Graph g = import(m);
    const double min = dtype == DType::i64 ? double(std::numeric_limits<int64_t>::min())
                                           : double(std::numeric_limits<int32_t>::min());
    const Tensor a = Tensor::from_doubles(dtype, {2, 4}, {-7, 7, -7, 7, 6, -6, min, 0});
    const Tensor b = Tensor::from_doubles(dtype, {4}, {3, -3, -3, 3});
    const NamedTensors out = run_graph(g, {{"a", a}, {"b", b}});
    // Python: -7 % 3 = 2, 7 % -3 = -2, -7 % -3 = -1, 7 % 3 = 1, 6 % 3 = 0, -6 % -3 = 0.
    const std::vector<double> py = out.at("py").to_doubles(), c = out.at("c").to_doubles();
    const std::vector<double> av = a.to_doubles(), bv = b.to_doubles();
    for (size_t i = 0; i < py.size(); ++i) {
      const int64_t x = int64_t(av[i]), y = int64_t(bv[i % 4]);
      int64_t r = x % y;
      EXPECT_EQ(int64_t(c[i]), r) << x << " fmod " << y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      EXPECT_EQ(int64_t(py[i]), r) << x << " mod " << y;
    }
  }
  // MIN % -1: 0, not a trap.
  TestModel w(17);
  w.input("a", TensorProto::INT64, {1});
  w.input("b", TensorProto::INT64, {1});
  w.node("Mod", {"a", "b"}, {"r"}, "mod");
  w.output("r", TensorProto::INT64);
  const Graph wg = import(w);
  EXPECT_EQ(run1(wg,
                 {{"a", Tensor::from_vector<int64_t>({1}, {std::numeric_limits<int64_t>::min()})},
                  {"b", Tensor::from_vector<int64_t>({1}, {-1})}},
                 "r")
                .to_doubles(),
            (std::vector<double>{0}));
  EXPECT_TRUE(throws_error_with(
      [&] {
        run1(wg,
             {{"a", Tensor::from_vector<int64_t>({1}, {5})},
              {"b", Tensor::from_vector<int64_t>({1}, {0})}},
             "r");
      },
      {"mod", "integer division by zero"}));
}

// Float Mod (fmod = 1) on run-time values is a - b * trunc(a / b), as C's fmod: signs follow
// a, a broadcast divisor, an infinite divisor gives a finite a, an infinite a NaN
// (fmod(inf, inf) too), a zero divisor NaN; on CUDA the same; fmod = 0 is refused.
TEST(OnnxImport, FloatModOnRunTimeValuesIsFmod) {
  TestModel m(17);
  m.input("a", TensorProto::FLOAT, {4, 4});
  m.input("b", TensorProto::FLOAT, {4});
  attr_int(m.node("Mod", {"a", "b"}, {"r"}, "mod"), "fmod", 1);
  m.output("r");
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor a =
      Tensor::from_vector<float>({4, 4}, {-4.3f, 7.2f, 5.0f, 9.5f, 4.3f, -7.2f, 8.0f, -1.0f,  //
                                          inf, -inf, inf, -inf, NAN, 0.5f, -0.5f, 3.0f});
  const Tensor b = Tensor::from_vector<float>({4}, {2.1f, -3.4f, inf, 0.0f});
  const Graph g = import(m);
  const Tensor got = run1(g, {{"a", a}, {"b", b}}, "r");
  const std::vector<double> r = got.to_doubles();
  const std::vector<double> av = a.to_doubles(), bv = b.to_doubles();
  for (size_t i = 0; i < r.size(); ++i) {
    const float want = std::fmod(float(av[i]), float(bv[i % 4]));
    SCOPED_TRACE(cat(i, ": fmod(", av[i], ", ", bv[i % 4], ") = ", want, ", got ", r[i]));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(r[i]));
    else
      EXPECT_NEAR(r[i], want, 1e-6);
  }
  if (cuda_available()) {
    const Tensor on_gpu = run_graph(g, {{"a", a}, {"b", b}}, {.device = Device::cuda}).at("r");
    EXPECT_TRUE(all_close(on_gpu, got, 0, 0)) << "CUDA";
  }
  TestModel p(17);
  p.input("a", TensorProto::FLOAT, {2});
  p.input("b", TensorProto::FLOAT, {2});
  p.node("Mod", {"a", "b"}, {"r"}, "pymod");
  p.output("r");
  EXPECT_TRUE(throws_error_with([&] { import(p); }, {"node 'pymod' (Mod)", "fmod"}));
}

}  // namespace
}  // namespace fusebox::testing
