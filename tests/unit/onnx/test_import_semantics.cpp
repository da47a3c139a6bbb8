// Import semantics beyond single ops: names, constant folding, opset-dependent
// forms (Softmax before 13, Squeeze/Unsqueeze/ReduceSum axes), initializers listed
// as inputs, frozen inputs, Gather on known tensors. The ops imported as chains or evaluated at
// import: test_import_decomposed.cpp.
#include <cmath>

#include "onnx_test_util.h"

namespace fusebox::testing {
namespace {

using onnx::TensorProto;

TEST(OnnxImport, KeepsOnnxNamesAndNamesUnnamedNodes) {
  TestModel m;
  m.input("input:0", TensorProto::FLOAT, {2, 3});
  m.node("Relu", {"input:0"}, {"hidden"}, "layer/relu");
  m.node("Neg", {"hidden"}, {"out"});  // unnamed: "Neg_1"
  m.output("out");
  m.output("hidden");
  Graph g = import(m);
  ASSERT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.nodes()[0].name, "layer/relu");
  EXPECT_EQ(g.nodes()[1].name, "Neg_1");
  EXPECT_EQ(g.value(g.nodes()[0].outputs[0]).name, "hidden");
  EXPECT_EQ(g.value(g.outputs()[0]).name, "out");
  EXPECT_EQ(g.value(g.inputs()[0]).name, "input:0");
  Tensor x = random_tensor(DType::f32, {2, 3}, 1);
  NamedTensors r = run_graph(g, {{"input:0", x}});
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(r.at("out").get(i), -std::max(0.0, x.get(i)));
  EXPECT_EQ(r.count("hidden"), 1u);
}

// Helper values never steal a name that a later ONNX value uses.
TEST(OnnxImport, HelperNamesAvoidLaterOnnxNames) {
  TestModel m(11);
  m.input("x", TensorProto::FLOAT, {2, 3, 4});
  attr_int(m.node("Softmax", {"x"}, {"s"}, "sm"), "axis", 1);  // flatten + softmax + reshape
  m.node("Relu", {"s"}, {"sm/flatten"}, "r");
  m.node("Neg", {"sm/flatten"}, {"sm"}, "n");
  m.output("sm");
  Graph g = import(m);
  EXPECT_TRUE(g.find_value("sm/flatten").has_value());
  EXPECT_EQ(g.value(value_id(g, "sm/flatten")).producer, g.nodes().at(3).id);
}

// Shape -> Slice -> Concat -> Reshape, with ConstantOfShape and Size: the whole
// shape computation folds at import, leaving the Reshape alone.
TEST(OnnxImport, FoldsShapeComputations) {
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {2, 3, 4});
  m.node("Shape", {"x"}, {"shape"});
  m.initializer("zero", Tensor::from_vector<int64_t>({1}, {0}));
  m.initializer("one", Tensor::from_vector<int64_t>({1}, {1}));
  m.node("Slice", {"shape", "zero", "one"}, {"batch"});
  m.node("Size", {"x"}, {"size"});
  m.node("Div", {"size", "batch"}, {"rest"});  // i64 scalar / [1] -> [1]
  attr_tensor(m.node("ConstantOfShape", {"one"}, {"ones"}), "value",
              Tensor::from_vector<float>({1}, {1}));
  attr_int(m.node("Cast", {"ones"}, {"ones_i"}), "to", TensorProto::INT64);
  attr_int(m.node("Concat", {"batch", "rest", "ones_i"}, {"target"}), "axis", 0);
  m.node("Reshape", {"x", "target"}, {"y"}, "reshape");
  m.output("y");
  m.output("target");
  Graph g = import(m);
  ASSERT_EQ(g.nodes().size(), 1u) << g.dump();
  EXPECT_EQ(g.nodes()[0].op, OpKind::reshape);
  EXPECT_EQ(g.nodes()[0].name, "reshape");
  EXPECT_EQ(g.value(value_id(g, "y")).type.shape, (Shape{2, 12, 1}));
  // Only the folded value that is a graph output stays, as a constant.
  EXPECT_EQ(g.constants().size(), 1u);
  const Tensor* target = g.constant(value_id(g, "target"));
  ASSERT_NE(target, nullptr);
  EXPECT_EQ(target->to_doubles(), (std::vector<double>{2, 12, 1}));
  Tensor x = random_tensor(DType::f32, {2, 3, 4}, 2);
  Tensor y = run1(g, {{"x", x}}, "y");
  EXPECT_TRUE(all_close(y, x.reshaped({2, 12, 1}), 0, 0));
}

TEST(OnnxImport, ConstantNodeForms) {
  TestModel m(13);
  attr_float(m.node("Constant", {}, {"f"}), "value_float", 2.5f);
  attr_ints(m.node("Constant", {}, {"is"}), "value_ints", {3, -4});
  attr_tensor(m.node("Constant", {}, {"t"}), "value", Tensor::from_vector<double>({2}, {0.5, -1}));
  m.output("f");
  m.output("is");
  m.output("t");
  Graph g = import(m);
  NamedTensors r = run_graph(g, {});
  EXPECT_EQ(r.at("f").dtype(), DType::f32);
  EXPECT_EQ(r.at("f").get(0), 2.5);
  EXPECT_EQ(r.at("is").to_doubles(), (std::vector<double>{3, -4}));
  EXPECT_EQ(r.at("t").dtype(), DType::f64);
  EXPECT_EQ(r.at("t").to_doubles(), (std::vector<double>{0.5, -1}));

  TestModel sparse(13);
  sparse.node("Constant", {}, {"s"}, "c")->add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("sparse_value");
    a.set_type(onnx::AttributeProto::SPARSE_TENSOR);
    return a;
  }());
  sparse.output("s");
  EXPECT_TRUE(throws_error_with([&] { import(sparse); },
                                {"unsupported: node 'c' (Constant)", "sparse_value"}));
}

// Before opset 13, Softmax normalises the input coerced to 2-D at `axis`.
TEST(OnnxImport, SoftmaxBeforeOpset13CoercesTo2d) {
  TestModel m(11);
  m.input("x", TensorProto::FLOAT, {2, 3, 4});
  attr_int(m.node("Softmax", {"x"}, {"y"}, "sm"), "axis", 1);
  m.node("LogSoftmax", {"x"}, {"z"}, "lsm");  // default axis 1 too
  m.output("y");
  m.output("z");
  Graph g = import(m);
  Tensor x = random_tensor(DType::f32, {2, 3, 4}, 3, -2, 2);
  NamedTensors r = run_graph(g, {{"x", x}});
  for (int64_t n = 0; n < 2; ++n) {
    double sum = 0;
    for (int64_t i = 0; i < 12; ++i) sum += std::exp(x.get(n * 12 + i));
    for (int64_t i = 0; i < 12; ++i) {
      EXPECT_NEAR(r.at("y").get(n * 12 + i), std::exp(x.get(n * 12 + i)) / sum, 1e-6);
      EXPECT_NEAR(r.at("z").get(n * 12 + i), x.get(n * 12 + i) - std::log(sum), 1e-5);
    }
  }
  EXPECT_EQ(r.at("y").shape(), (Shape{2, 3, 4}));
  // Opset 13: the same attribute normalises along dim 1 only.
  TestModel m13(13);
  m13.input("x", TensorProto::FLOAT, {2, 3, 4});
  attr_int(m13.node("Softmax", {"x"}, {"y"}), "axis", 1);
  m13.output("y");
  Tensor y13 = run1(import(m13), {{"x", x}}, "y");
  double col = 0;
  for (int64_t c = 0; c < 3; ++c) col += y13.get(c * 4);
  EXPECT_NEAR(col, 1.0, 1e-6);
}

TEST(OnnxImport, AxesAttributeBeforeOpset13InputAfter) {
  Tensor x = random_tensor(DType::f32, {1, 3, 1, 2}, 4);
  TestModel a(11);
  a.input("x", TensorProto::FLOAT, {1, 3, 1, 2});
  attr_ints(a.node("Squeeze", {"x"}, {"s"}), "axes", {0, -2});
  attr_ints(a.node("Unsqueeze", {"s"}, {"u"}), "axes", {1});
  attr_ints(a.node("ReduceSum", {"u"}, {"r"}), "axes", {0});
  a.output("r");
  TestModel b(13);
  b.input("x", TensorProto::FLOAT, {1, 3, 1, 2});
  b.initializer("sq", Tensor::from_vector<int64_t>({2}, {0, -2}));
  b.initializer("un", Tensor::from_vector<int64_t>({1}, {1}));
  b.initializer("rd", Tensor::from_vector<int64_t>({1}, {0}));
  b.node("Squeeze", {"x", "sq"}, {"s"});
  b.node("Unsqueeze", {"s", "un"}, {"u"});
  b.node("ReduceSum", {"u", "rd"}, {"r"});
  b.output("r");
  Tensor ra = run1(import(a), {{"x", x}}, "r");
  Tensor rb = run1(import(b), {{"x", x}}, "r");
  EXPECT_EQ(ra.shape(), (Shape{1, 1, 2}));
  EXPECT_TRUE(all_close(ra, rb, 0, 0));
  // x [1, 3, 1, 2] -> [3, 2] -> [3, 1, 2] -> summed over dim 0: the column sums.
  for (int64_t j = 0; j < 2; ++j)
    EXPECT_NEAR(ra.get(j), x.get(j) + x.get(2 + j) + x.get(4 + j), 1e-6);
  // The attribute form is refused from opset 13 on (an unknown attribute there).
  TestModel c(13);
  c.input("x", TensorProto::FLOAT, {1, 3, 1, 2});
  attr_ints(c.node("Squeeze", {"x"}, {"s"}, "sq"), "axes", {0});
  c.output("s");
  EXPECT_TRUE(throws_error_with([&] { import(c); }, {"node 'sq' (Squeeze)", "'axes'"}));
}

// Initializers also listed as graph inputs (IR < 4 style) are constants.
TEST(OnnxImport, InitializerListedAsInputIsConstant) {
  TestModel m(11);
  m.input("x", TensorProto::FLOAT, {2});
  m.input("w", TensorProto::FLOAT, {2});
  m.initializer("w", Tensor::from_vector<float>({2}, {2, 3}));
  m.node("Mul", {"x", "w"}, {"y"});
  m.output("y");
  Graph g = import(m);
  ASSERT_EQ(g.inputs().size(), 1u);
  EXPECT_TRUE(g.is_constant(value_id(g, "w")));
  Tensor y = run1(g, {{"x", Tensor::from_vector<float>({2}, {1, -1})}}, "y");
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{2, -3}));
}

TEST(OnnxImport, GatherOnKnownTensors) {
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {2, 3, 4});
  m.node("Shape", {"x"}, {"shape"});
  m.initializer("idx", Tensor::from_vector<int64_t>({1}, {-1}));
  m.initializer("rest", Tensor::from_vector<int64_t>({1}, {-1}));
  m.node("Gather", {"shape", "idx"}, {"last"});
  attr_int(m.node("Concat", {"last", "rest"}, {"dims"}), "axis", 0);
  m.node("Reshape", {"x", "dims"}, {"y"});
  m.output("y");
  Graph g = import(m);
  EXPECT_EQ(g.value(value_id(g, "y")).type.shape, (Shape{4, 6}));
  EXPECT_EQ(g.nodes().size(), 1u);
  // A gather from a 2-D table along axis 1 with 2-D indices.
  TestModel t(13);
  t.initializer("table", Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6}));
  t.initializer("i", Tensor::from_vector<int64_t>({2, 2}, {2, 0, 1, 1}));
  attr_int(t.node("Gather", {"table", "i"}, {"g"}), "axis", 1);
  t.output("g");
  Tensor out = run1(import(t), {}, "g");
  EXPECT_EQ(out.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(out.to_doubles(), (std::vector<double>{3, 1, 2, 2, 6, 4, 5, 5}));
  // Gather from a graph input with known indices: a scalar index is a slice that squeezes the
  // axis; other indices the gather op (2-D ones too).
  TestModel d(13);
  d.input("x", TensorProto::FLOAT, {3, 4});
  d.initializer("i", Tensor::from_vector<int64_t>({}, {-1}));
  d.initializer("list", Tensor::from_vector<int64_t>({4}, {0, 1, 3, 2}));
  attr_int(d.node("Gather", {"x", "i"}, {"row"}), "axis", 0);
  attr_int(d.node("Gather", {"x", "list"}, {"cols"}), "axis", 1);
  d.output("row");
  d.output("cols");
  const Graph dg = import(d);
  const Tensor dx = Tensor::from_vector<float>({3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  EXPECT_EQ(run1(dg, {{"x", dx}}, "row").to_doubles(), (std::vector<double>{8, 9, 10, 11}));
  EXPECT_EQ(run1(dg, {{"x", dx}}, "cols").to_doubles(),
            (std::vector<double>{0, 1, 3, 2, 4, 5, 7, 6, 8, 9, 11, 10}));
  TestModel d2(13);
  d2.input("x", TensorProto::FLOAT, {3});
  d2.initializer("i", Tensor::from_vector<int64_t>({2, 2}, {2, 0, -1, 1}));
  d2.node("Gather", {"x", "i"}, {"g"}, "gx");
  d2.output("g");
  const Tensor gx = run1(import(d2), {{"x", Tensor::from_vector<float>({3}, {7, 8, 9})}}, "g");
  EXPECT_EQ(gx.shape(), (Shape{2, 2}));
  EXPECT_EQ(gx.to_doubles(), (std::vector<double>{9, 7, 9, 8}));
  // An embedding: a known table, token ids at run time; an id out of range fails the run
  // naming the node.
  TestModel e(13);
  e.input("ids", TensorProto::INT64, {2, 3});
  e.initializer("table", Tensor::from_vector<float>({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31}));
  e.node("Gather", {"table", "ids"}, {"emb"}, "wte");
  e.output("emb");
  const Graph eg = import(e);
  const Tensor emb =
      run1(eg, {{"ids", Tensor::from_vector<int64_t>({2, 3}, {3, 0, 1, -1, 2, 2})}}, "emb");
  EXPECT_EQ(emb.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(emb.to_doubles(), (std::vector<double>{30, 31, 0, 1, 10, 11, 30, 31, 20, 21, 20, 21}));
  EXPECT_TRUE(throws_error_with(
      [&] {
        run1(eg, {{"ids", Tensor::from_vector<int64_t>({2, 3}, {0, 0, 4, 0, 0, 0})}}, "emb");
      },
      {"wte", "index 4 at position [0, 2]", "outside [-4, 4)"}));
}

TEST(OnnxImport, BatchNormTrainingOutputs) {
  TestModel m(15);
  m.input("x", TensorProto::FLOAT, {2, 3, 4});
  for (const char* p : {"s", "b", "m", "v"})
    m.initializer(p, Tensor::full(DType::f32, {3}, std::string(p) == "v" ? 2.0 : 0.5));
  onnx::NodeProto* bn =
      m.node("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y", "rm", "rv"}, "bn");
  attr_int(bn, "training_mode", 1);
  attr_float(bn, "momentum", 0.5f);
  m.output("y");
  m.output("rm");
  m.output("rv");
  Graph g = import(m);
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_TRUE(std::get<BatchNormAttrs>(g.nodes()[0].attrs).training);
  Tensor x = random_tensor(DType::f32, {2, 3, 4}, 5);
  NamedTensors r = run_graph(g, {{"x", x}});
  for (int64_t c = 0; c < 3; ++c) {
    double mean = 0;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 4; ++i) mean += x.get((n * 3 + c) * 4 + i) / 8;
    EXPECT_NEAR(r.at("rm").get(c), 0.5 * 0.5 + mean * 0.5, 1e-6);
  }
  // Inference mode must not name the running statistics.
  bn->mutable_attribute(0)->set_i(0);
  EXPECT_TRUE(
      throws_error_with([&] { import(m); }, {"node 'bn' (BatchNormalization)", "training_mode=1"}));
}

TEST(OnnxImport, DropoutInferenceIsIdentityWithTrueMask) {
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {2, 2});
  m.node("Dropout", {"x"}, {"y", "mask"});
  m.output("y");
  m.output("mask", TensorProto::BOOL);
  Graph g = import(m);
  Tensor x = random_tensor(DType::f32, {2, 2}, 6);
  NamedTensors r = run_graph(g, {{"x", x}});
  EXPECT_TRUE(all_close(r.at("y"), x, 0, 0));
  EXPECT_EQ(r.at("mask").dtype(), DType::boolean);
  EXPECT_EQ(r.at("mask").to_doubles(), (std::vector<double>{1, 1, 1, 1}));
}

// A training export names every Dropout's mask though nothing reads it: no mask is made (a
// full tensor per node, hundreds of MB for ViT-B/16 at batch 64). A read mask is still made.
TEST(OnnxImport, DropoutMaskNothingReadsIsNotMade) {
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {2, 2});
  m.node("Dropout", {"x"}, {"y", "mask"});
  m.node("Dropout", {"y"}, {"z", "mask2"});
  m.node("Not", {"mask2"}, {"dropped"});
  m.output("z");
  m.output("dropped", TensorProto::BOOL);
  Graph g = import(m);
  EXPECT_FALSE(g.find_value("mask").has_value());
  Tensor x = random_tensor(DType::f32, {2, 2}, 6);
  NamedTensors r = run_graph(g, {{"x", x}});
  EXPECT_TRUE(all_close(r.at("z"), x, 0, 0));
  EXPECT_EQ(r.at("dropped").to_doubles(), (std::vector<double>{0, 0, 0, 0}));
}

// Before opset 14 naming a BatchNormalization's running statistics selects its training form,
// whether or not anything reads them.
TEST(OnnxImport, BatchNormOpset13NamedUnreadStatisticsStillTrain) {
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {2, 3, 4});
  for (const char* p : {"s", "b", "m", "v"})
    m.initializer(p, Tensor::full(DType::f32, {3}, std::string(p) == "v" ? 2.0 : 0.5));
  m.node("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y", "rm", "rv"}, "bn");
  m.output("y");
  Graph g = import(m);
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_TRUE(std::get<BatchNormAttrs>(g.nodes()[0].attrs).training);
}

}  // namespace
}  // namespace fusebox::testing
