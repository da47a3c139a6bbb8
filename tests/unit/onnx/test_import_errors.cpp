// The importer's error paths: malformed files, unsupported ops / attributes / opsets /
// dtypes, missing or mistyped attributes, and inputs that must be known at import.
// Every message must name the file, the node, its op_type and the attribute at fault.
#include <cstdio>
#include <fstream>
#include <random>

#include "fusebox/io/tensor_file.h"
#include "onnx_test_util.h"

namespace fusebox::testing {
namespace {

using onnx::TensorProto;

// x [1, 2, 4, 4] -> Conv (w, b initializers) -> Relu -> y: a small valid model.
TestModel small_conv_model() {
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {1, 2, 4, 4});
  m.initializer("w", random_tensor(DType::f32, {3, 2, 3, 3}, 1));
  m.initializer("b", random_tensor(DType::f32, {3}, 2));
  onnx::NodeProto* conv = m.node("Conv", {"x", "w", "b"}, {"c"}, "conv1");
  attr_ints(conv, "pads", {1, 1, 1, 1});
  attr_ints(conv, "kernel_shape", {3, 3});
  m.node("Relu", {"c"}, {"y"}, "relu1");
  m.output("y");
  // Metadata is serialised after the graph: cutting the file between entries leaves a
  // complete model, so the truncation test sees both outcomes.
  for (const char* key : {"author", "license"}) {
    onnx::StringStringEntryProto* e = m.proto().add_metadata_props();
    e->set_key(key);
    e->set_value("fusebox tests");
  }
  return m;
}

TEST(OnnxImportErrors, MissingFile) {
  EXPECT_TRUE(throws_error_with([] { import_onnx_file("/nonexistent/dir/m.onnx"); },
                                {"[onnx import: /nonexistent/dir/m.onnx]", "cannot read"}));
}

TEST(OnnxImportErrors, EmptyFile) {
  const std::string path = ::testing::TempDir() + "/fusebox_empty.onnx";
  { std::ofstream f(path, std::ios::binary | std::ios::trunc); }
  EXPECT_TRUE(
      throws_error_with([&] { import_onnx_file(path); }, {"[onnx import: " + path + "]", "empty"}));
  std::remove(path.c_str());
}

TEST(OnnxImportErrors, RandomBytes) {
  std::mt19937_64 rng(7);
  int parse_failures = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(size_t(1 + rng() % 2048), '\0');
    for (char& c : bytes) c = char(rng());
    try {
      import_onnx_bytes(bytes, "random.onnx");
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "onnx import: random.onnx");
      if (std::string(e.what()).find("protobuf parse failed") != std::string::npos)
        ++parse_failures;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << trial << ": non-fusebox exception: " << e.what();
    }
  }
  EXPECT_GT(parse_failures, 100);
}

// Every truncation of a valid model either imports or throws fusebox::Error.
TEST(OnnxImportErrors, TruncatedModels) {
  const std::string full = small_conv_model().bytes();
  ASSERT_NO_THROW(import_onnx_bytes(full, "full.onnx"));
  int imported = 0, refused = 0;
  for (size_t len = 0; len < full.size(); ++len) {
    try {
      import_onnx_bytes(full.substr(0, len), "cut.onnx");
      ++imported;
    } catch (const Error& e) {
      ++refused;
      EXPECT_EQ(e.where(), "onnx import: cut.onnx") << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "length " << len << ": non-fusebox exception: " << e.what();
    }
  }
  EXPECT_GT(refused, int(full.size()) / 2);
  EXPECT_GE(imported, 2);  // cut right before or between the metadata entries
  std::printf("truncations of a %zu-byte model: %d imported, %d refused\n", full.size(), imported,
              refused);
}

TEST(OnnxImportErrors, NotAModel) {
  EXPECT_EQ(error_message([] { import_onnx_bytes("\xff\xff\xff\xff", "m.onnx"); }),
            "[onnx import: m.onnx] not a valid ONNX model (protobuf parse failed)");
  onnx::ModelProto empty_model;
  empty_model.set_ir_version(8);
  EXPECT_TRUE(throws_error_with(
      [&] { import_onnx_bytes(empty_model.SerializeAsString(), "m.onnx"); }, {"no graph"}));
}

// The tester's 151-byte model: x[1, 1] -> Expand to [2^44 + 1, 2^20] -> Transpose. The
// expanded f32 tensor is 2^66 + 2^22 bytes, which wraps 2^64 to 4 MiB: once a buffer of the
// remainder was allocated and the transpose read past it (a crash, or memory written into the
// output file). Refused where the Expand is, naming it, its shape and the limit; so are every
// shape-producing op's outputs (Graph::add_node checks them all) and a graph input's shape.
TEST(OnnxImportErrors, ShapesPastTheTensorLimitAreRefusedAtTheirNode) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {1, 1});
  m.initializer("shape", Tensor::from_vector<int64_t>({2}, {(int64_t(1) << 44) + 1, 1 << 20}));
  m.node("Expand", {"x", "shape"}, {"big"}, "expand");
  attr_ints(m.node("Transpose", {"big"}, {"y"}, "t"), "perm", {1, 0});
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); },
                                {"node 'expand' (Expand)", "f32[17592186044417, 1048576]",
                                 "more than the 1.0 TiB one tensor may hold"}));

  TestModel tile;
  tile.input("x", TensorProto::FLOAT, {1 << 16, 1 << 16});
  tile.initializer("repeats", Tensor::from_vector<int64_t>({2}, {int64_t(1) << 20, 1 << 20}));
  tile.node("Tile", {"x", "repeats"}, {"y"}, "tile");
  tile.output("y");
  EXPECT_TRUE(
      throws_error_with([&] { import(tile); }, {"node 'tile' (Tile)", "one tensor may hold"}));

  TestModel input;
  input.input("x", TensorProto::FLOAT, {int64_t(1) << 32, int64_t(1) << 32});
  input.node("Relu", {"x"}, {"y"}, "r");
  input.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(input); }, {"graph input 'x'", "1.0 TiB"}));
}

TEST(OnnxImportErrors, UnsupportedOp) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2});
  m.node("Foo", {"x"}, {"y"}, "f1");
  m.output("y");
  try {
    import(m);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[onnx import: m.onnx] unsupported: node 'f1' (Foo): operator 'Foo' (domain "
              "ai.onnx) is not supported");
    EXPECT_TRUE(onnx_error_is_unsupported(e));
  }
}

TEST(OnnxImportErrors, NonDefaultDomain) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2});
  m.node("Relu", {"x"}, {"y"}, "r")->set_domain("com.microsoft");
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); },
                                {"unsupported: node 'r' (Relu)", "domain 'com.microsoft'"}));
}

TEST(OnnxImportErrors, UnsupportedAttributeValue) {
  TestModel m(12);
  m.input("x", TensorProto::FLOAT, {1, 1, 4, 4});
  onnx::NodeProto* mp = m.node("MaxPool", {"x"}, {"y", "i"}, "mp1");
  attr_ints(mp, "kernel_shape", {2, 2});
  attr_int(mp, "storage_order", 1);
  m.output("y");
  try {
    import(m);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[onnx import: m.onnx] unsupported: node 'mp1' (MaxPool): attribute "
              "storage_order=1 is not supported (only 0)");
    EXPECT_TRUE(onnx_error_is_unsupported(e));
  }
}

TEST(OnnxImportErrors, UnknownAttribute) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2});
  attr_float(m.node("Relu", {"x"}, {"y"}, "r"), "slope", 0.5f);
  m.output("y");
  EXPECT_TRUE(throws_error_with(
      [&] { import(m); }, {"unsupported: node 'r' (Relu): attribute 'slope' is not supported"}));
}

TEST(OnnxImportErrors, MissingRequiredAttribute) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2});
  m.node("Concat", {"x", "x"}, {"y"}, "cat");
  m.output("y");
  const std::string text = error_message([&] { import(m); });
  EXPECT_EQ(text,
            "[onnx import: m.onnx] node 'cat' (Concat): attribute 'axis' is required but "
            "missing");

  TestModel p(12);
  p.input("x", TensorProto::FLOAT, {1, 1, 4, 4});
  p.node("MaxPool", {"x"}, {"y"}, "pool");
  p.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(p); },
                                {"node 'pool' (MaxPool)", "'kernel_shape' is required"}));
}

TEST(OnnxImportErrors, WrongAttributeType) {
  TestModel m = small_conv_model();
  attr_float(m.proto().mutable_graph()->mutable_node(0), "strides", 2.0f);
  EXPECT_TRUE(throws_error_with([&] { import(m); }, {"node 'conv1' (Conv)",
                                                     "attribute 'strides' has type FLOAT, "
                                                     "expected INTS"}));
}

TEST(OnnxImportErrors, AttributeLengthMismatch) {
  TestModel m = small_conv_model();
  attr_ints(m.proto().mutable_graph()->mutable_node(0), "strides", {2, 2, 2});
  EXPECT_TRUE(
      throws_error_with([&] { import(m); }, {"node 'conv1' (Conv)", "'strides' has 3 values"}));
  TestModel k = small_conv_model();
  k.proto().mutable_graph()->mutable_node(0)->mutable_attribute(1)->set_ints(0, 5);
  EXPECT_TRUE(
      throws_error_with([&] { import(k); }, {"node 'conv1' (Conv)", "kernel_shape", "[5, 3]"}));
}

TEST(OnnxImportErrors, OpsetOutOfRange) {
  // y = op(x) in a model of `opset`.
  auto one_node = [](int64_t opset, const char* op) {
    TestModel m(opset);
    m.input("x", TensorProto::FLOAT, {2});
    m.node(op, {"x"}, {"y"});
    m.output("y");
    return m;
  };
  for (int64_t opset : {0, 23}) {
    const TestModel m = one_node(opset, "Relu");
    try {
      import(m);
      FAIL() << "opset " << opset << " imported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cat("unsupported: opset ", opset)), std::string::npos)
          << e.what();
      EXPECT_TRUE(onnx_error_is_unsupported(e));
    }
  }
  // Before opset 11 only the ops unchanged since the model's opset: Relu (since 6) imports
  // from opset 9; Pad (its pads an attribute before 11) is refused by name, and Relu at 5.
  EXPECT_NO_THROW(import(one_node(9, "Relu")));
  EXPECT_TRUE(throws_error_with([&] { import(one_node(10, "Pad")); },
                                {"unsupported: ", "(Pad)", "opset 10", "from opset 11"}));
  EXPECT_TRUE(throws_error_with([&] { import(one_node(5, "Relu")); },
                                {"unsupported: ", "(Relu)", "opset 5", "from opset 6"}));
  TestModel none = one_node(17, "Relu");
  none.proto().clear_opset_import();
  EXPECT_TRUE(throws_error_with([&] { import(none); }, {"no opset of the default domain"}));
  onnx::OperatorSetIdProto* other = none.proto().add_opset_import();
  other->set_domain("ai.onnx.preview.training");
  other->set_version(1);
  EXPECT_TRUE(throws_error_with(
      [&] { import(none); }, {"unsupported: ", "only other domains (ai.onnx.preview.training 1)"}));
}

TEST(OnnxImportErrors, OpNewerThanOpset) {
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {2, 4});
  m.initializer("s", Tensor::full(DType::f32, {4}, 1));
  m.node("LayerNormalization", {"x", "s"}, {"y"}, "ln");
  m.output("y");
  EXPECT_TRUE(throws_error_with(
      [&] { import(m); },
      {"node 'ln' (LayerNormalization)", "does not exist in opset 13", "added in opset 17"}));
}

TEST(OnnxImportErrors, NonConstantReshapeShape) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2, 6});
  m.input("shape", TensorProto::INT64, {2});
  m.node("Reshape", {"x", "shape"}, {"y"}, "r");
  m.output("y");
  try {
    import(m);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unsupported: node 'r' (Reshape): input 1 (shape, 'shape') must be known "
                       "at import"),
              std::string::npos)
        << msg;
  }
  // Freezing the input makes it a constant.
  OnnxImportOptions opts;
  opts.constant_inputs["shape"] = Tensor::from_vector<int64_t>({2}, {3, -1});
  Graph g = import(m, opts);
  EXPECT_EQ(g.inputs().size(), 1u);
  EXPECT_EQ(g.value(value_id(g, "y")).type.shape, (Shape{3, 4}));
  // A frozen input must match the declared type.
  opts.constant_inputs["shape"] = Tensor::from_vector<int32_t>({2}, {3, -1});
  EXPECT_TRUE(throws_error_with([&] { import(m, opts); }, {"'shape'", "INT64"}));
  opts.constant_inputs = {{"nope", Tensor::scalar(DType::i64, 1)}};
  EXPECT_TRUE(throws_error_with([&] { import(m, opts); }, {"'nope'", "not a graph input"}));
}

TEST(OnnxImportErrors, UnknownInputAndDuplicateOutput) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2});
  m.node("Relu", {"nope"}, {"y"}, "r");
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); },
                                {"node 'r' (Relu)", "input 0 'nope' is not a graph input"}));
  TestModel d;
  d.input("x", TensorProto::FLOAT, {2});
  d.node("Relu", {"x"}, {"y"}, "r1");
  d.node("Neg", {"x"}, {"y"}, "r2");
  d.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(d); },
                                {"node 'r2' (Neg)", "duplicate output name 'y'", "node 'r1'"}));
  TestModel i;
  i.input("x", TensorProto::FLOAT, {2});
  i.node("Relu", {"x"}, {"x"}, "r");
  i.output("x");
  EXPECT_TRUE(throws_error_with([&] { import(i); }, {"duplicate output name 'x'", "graph input"}));
}

TEST(OnnxImportErrors, WrongInputCountAndMissingOutput) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2});
  m.node("Relu", {"x", "x"}, {"y"}, "r");
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); }, {"node 'r' (Relu)", "takes 1 to 1 inputs"}));
  TestModel o;
  o.input("x", TensorProto::FLOAT, {2});
  o.node("Relu", {"x"}, {"y"}, "r");
  o.output("z");
  EXPECT_TRUE(throws_error_with([&] { import(o); }, {"graph output 'z' is not produced"}));
}

TEST(OnnxImportErrors, SymbolicDims) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {-1, 3});
  m.node("Relu", {"x"}, {"y"}, "r");
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); }, {"graph input 'x'", "symbolic dim 'N' at dim 0",
                                                     "--shape", "input_shapes"}));
  OnnxImportOptions opts;
  opts.input_shapes["x"] = {5, 3};
  Graph g = import(m, opts);
  EXPECT_EQ(g.value(value_id(g, "y")).type.shape, (Shape{5, 3}));
  opts.input_shapes["x"] = {5, 4};
  EXPECT_TRUE(throws_error_with([&] { import(m, opts); }, {"fixes dim 1 to 3"}));
  opts.input_shapes["x"] = {5};
  EXPECT_TRUE(throws_error_with([&] { import(m, opts); }, {"declares rank 2"}));
}

TEST(OnnxImportErrors, UnsupportedDtypes) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2});
  attr_int(m.node("Cast", {"x"}, {"y"}, "c"), "to", TensorProto::UINT8);
  m.output("y");
  EXPECT_TRUE(
      throws_error_with([&] { import(m); }, {"unsupported: node 'c' (Cast): attribute to=UINT8"}));
  TestModel u;
  u.input("x", TensorProto::UINT8, {2});
  u.node("Relu", {"x"}, {"y"}, "r");
  u.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(u); },
                                {"unsupported: graph input 'x' has element type UINT8"}));
  TestModel big;
  big.input("x", TensorProto::FLOAT, {int64_t(1) << 40, int64_t(1) << 40});
  big.node("Size", {"x"}, {"n"});
  big.output("n", TensorProto::INT64);
  EXPECT_TRUE(throws_error_with([&] { import(big); }, {"graph input 'x'", "one tensor may hold"}));
}

TEST(OnnxImportErrors, ErrorsFromShapeInferenceNameTheNode) {
  TestModel m;
  m.input("a", TensorProto::FLOAT, {2, 3});
  m.input("b", TensorProto::FLOAT, {4, 5});
  m.node("MatMul", {"a", "b"}, {"y"}, "mm");
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); }, {"[onnx import: m.onnx] node 'mm' (MatMul)"}));
}

TEST(OnnxImportErrors, ConvTransposeOutputTooLarge) {
  TestModel m(13);
  m.input("x", TensorProto::FLOAT, {1, 1, 3, 3});
  m.initializer("w", Tensor::full(DType::f32, {1, 1, 3, 3}, 1));
  onnx::NodeProto* n = m.node("ConvTranspose", {"x", "w"}, {"y"}, "ct");
  attr_ints(n, "strides", {2, 2});
  attr_ints(n, "output_shape", {9, 7});  // natural extent 7: two zero rows need stride 3
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); },
                                {"unsupported: node 'ct' (ConvTranspose)", "zero rows"}));
}

TEST(OnnxImportErrors, HugeConstantOfShapeIsRefused) {
  TestModel m;
  m.initializer("s", Tensor::from_vector<int64_t>({3}, {1 << 20, 1 << 20, 1 << 20}));
  m.node("ConstantOfShape", {"s"}, {"y"}, "big");
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); }, {"node 'big' (ConstantOfShape)", "bytes"}));
}

// Trilu's known mask is bounded the same way (the input itself is a run-time value).
TEST(OnnxImportErrors, HugeTriluMaskIsRefused) {
  TestModel m(14);
  m.input("x", TensorProto::FLOAT, {1 << 17, 1 << 17});  // 64 GiB: a graph input may be
  m.node("Trilu", {"x"}, {"y"}, "tri");
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); }, {"node 'tri' (Trilu)", "mask would pass"}));
}

TEST(OnnxImportErrors, SparseInitializer) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {2});
  onnx::SparseTensorProto* s = m.proto().mutable_graph()->add_sparse_initializer();
  s->mutable_values()->set_name("sp");
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  EXPECT_TRUE(throws_error_with([&] { import(m); }, {"unsupported: sparse initializers"}));
}

}  // namespace
}  // namespace fusebox::testing
