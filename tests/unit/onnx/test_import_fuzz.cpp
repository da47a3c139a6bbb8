// Mutation fuzzing of the importer on the ops of the real-model work (issue 15): a valid
// one-node model per op, then seeded random mutations of its attributes (values of every
// kind, lengths, unknown names), its graph input shapes (rank 0-5, empty and large dims), its
// initializers (dims that disagree with the data, truncated raw bytes) and its inputs
// (dropped, repeated, renamed). Each mutant either imports (the graph verified) or throws a
// fusebox::Error from the importer ("onnx import: m.onnx"): never another exception, a crash
// or a hang. The seeds import unmutated first, so a mutant's refusal is the mutation's doing.
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "onnx_test_util.h"

namespace fusebox::testing {
namespace {

using onnx::TensorProto;

struct Seed {
  const char* op;
  std::function<TestModel()> make;
};

Tensor ints(const Shape& shape, const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>(shape, v);
}
Tensor floats(const Shape& shape, uint64_t seed) {
  return random_tensor(DType::f32, shape, seed);
}

// One node reading graph input x (float, `dims`) and the listed initializers.
TestModel unary(const char* op, const std::vector<int64_t>& dims,
                const std::function<void(onnx::NodeProto*)>& attrs = {}) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, dims);
  onnx::NodeProto* n = m.node(op, {"x"}, {"y"}, "n");
  if (attrs) attrs(n);
  m.output("y");
  return m;
}

std::vector<Seed> seeds() {
  std::vector<Seed> s;
  s.push_back({"HardSigmoid", [] {
                 return unary("HardSigmoid", {2, 3}, [](auto* n) {
                   attr_float(n, "alpha", 0.3f);
                   attr_float(n, "beta", 0.4f);
                 });
               }});
  s.push_back({"HardSwish", [] { return unary("HardSwish", {2, 3}); }});
  s.push_back({"Softplus", [] { return unary("Softplus", {4}); }});
  s.push_back({"Elu", [] {
                 return unary("Elu", {2, 2}, [](auto* n) { attr_float(n, "alpha", 0.5f); });
               }});
  s.push_back({"Sin", [] { return unary("Sin", {3}); }});
  s.push_back({"Cos", [] { return unary("Cos", {3}); }});
  s.push_back({"Shape", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {2, 3, 4});
                 onnx::NodeProto* n = m.node("Shape", {"x"}, {"y"}, "n");
                 attr_int(n, "start", 1);
                 attr_int(n, "end", -1);
                 m.output("y", TensorProto::INT64);
                 return m;
               }});
  for (const char* op : {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceMin"})
    s.push_back({op, [op] {
                   return unary(op, {2, 3, 4}, [](auto* n) {
                     attr_ints(n, "axes", {1});
                     attr_int(n, "keepdims", 0);
                   });
                 }});
  s.push_back({"PRelu", [] {
                 TestModel m = unary("PRelu", {2, 3, 4});
                 m.proto().mutable_graph()->mutable_node(0)->add_input("slope");
                 m.initializer("slope", floats({3, 1}, 5));
                 return m;
               }});
  s.push_back({"Einsum", [] {
                 TestModel m;
                 m.input("a", TensorProto::FLOAT, {2, 3});
                 m.input("b", TensorProto::FLOAT, {3, 4});
                 attr_string(m.node("Einsum", {"a", "b"}, {"y"}, "n"), "equation", "ij,jk->ik");
                 m.output("y");
                 return m;
               }});
  s.push_back({"InstanceNormalization", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {2, 3, 4, 4});
                 m.initializer("scale", floats({3}, 6));
                 m.initializer("bias", floats({3}, 7));
                 attr_float(m.node("InstanceNormalization", {"x", "scale", "bias"}, {"y"}, "n"),
                            "epsilon", 1e-5f);
                 m.output("y");
                 return m;
               }});
  s.push_back({"Split", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {6, 4});
                 m.initializer("split", ints({2}, {2, 4}));
                 attr_int(m.node("Split", {"x", "split"}, {"y0", "y1"}, "n"), "axis", 0);
                 m.output("y0");
                 m.output("y1");
                 return m;
               }});
  s.push_back({"Tile", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {2, 3});
                 m.initializer("repeats", ints({2}, {2, 2}));
                 m.node("Tile", {"x", "repeats"}, {"y"}, "n");
                 m.output("y");
                 return m;
               }});
  s.push_back({"Expand", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {3, 1});
                 m.initializer("shape", ints({3}, {2, 3, 4}));
                 m.node("Expand", {"x", "shape"}, {"y"}, "n");
                 m.output("y");
                 return m;
               }});
  s.push_back({"Gather", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {5, 4});
                 m.initializer("idx", ints({2}, {4, 1}));
                 attr_int(m.node("Gather", {"x", "idx"}, {"y"}, "n"), "axis", 0);
                 m.output("y");
                 return m;
               }});
  s.push_back({"Range", [] {
                 TestModel m;
                 m.initializer("start", Tensor::scalar(DType::i64, 1));
                 m.initializer("limit", Tensor::scalar(DType::i64, 9));
                 m.initializer("delta", Tensor::scalar(DType::i64, 2));
                 m.input("x", TensorProto::INT64, {4});
                 m.node("Range", {"start", "limit", "delta"}, {"r"}, "range");
                 m.node("Add", {"x", "r"}, {"y"}, "n");
                 m.output("y", TensorProto::INT64);
                 return m;
               }});
  s.push_back({"ConstantOfShape", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {2, 3});
                 m.initializer("shape", ints({2}, {2, 3}));
                 attr_tensor(m.node("ConstantOfShape", {"shape"}, {"c"}, "cos"), "value",
                             Tensor::full(DType::f32, {1}, 2.0));
                 m.node("Mul", {"x", "c"}, {"y"}, "n");
                 m.output("y");
                 return m;
               }});
  s.push_back({"Where", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {4});
                 m.initializer("a", ints({4}, {1, 5, 2, 7}));
                 m.initializer("b", ints({4}, {3, 3, 3, 3}));
                 m.node("Less", {"a", "b"}, {"lt"}, "less");
                 m.node("Not", {"lt"}, {"ge"}, "not");
                 m.node("Where", {"ge", "a", "b"}, {"w"}, "where");
                 m.node("Mod", {"w", "b"}, {"md"}, "mod");
                 attr_int(m.node("Cast", {"md"}, {"mf"}, "cast"), "to", TensorProto::FLOAT);
                 m.node("Add", {"x", "mf"}, {"y"}, "n");
                 m.output("y");
                 return m;
               }});
  s.push_back({"ScatterND", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {4, 4});
                 m.initializer("data", floats({4, 4}, 8));
                 m.initializer("indices", ints({2, 1}, {0, 2}));
                 m.initializer("updates", floats({2, 4}, 9));
                 m.node("ScatterND", {"data", "indices", "updates"}, {"s"}, "scatter");
                 m.node("Add", {"x", "s"}, {"y"}, "n");
                 m.output("y");
                 return m;
               }});
  s.push_back(
      {"ScatterElements", [] {
         TestModel m(18);
         m.input("x", TensorProto::FLOAT, {3, 4});
         m.initializer("indices", ints({2, 2}, {0, 2, -1, 1}));
         m.initializer("updates", floats({2, 2}, 9));
         onnx::NodeProto* n = m.node("ScatterElements", {"x", "indices", "updates"}, {"y"}, "n");
         attr_int(n, "axis", 1);
         attr_string(n, "reduction", "add");
         m.output("y");
         return m;
       }});
  s.push_back({"TopK", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {3, 5});
                 m.initializer("k", ints({1}, {2}));
                 attr_int(m.node("TopK", {"x", "k"}, {"v", "i"}, "n"), "axis", -1);
                 m.output("v");
                 m.output("i");
                 return m;
               }});
  s.push_back(
      {"Resize", [] {
         TestModel m;
         m.input("x", TensorProto::FLOAT, {1, 2, 3, 3});
         m.initializer("roi", Tensor::empty(DType::f32, {0}));
         m.initializer("scales", Tensor::from_vector<float>({4}, {1, 1, 2, 2}));
         attr_string(m.node("Resize", {"x", "roi", "scales"}, {"y"}, "n"), "mode", "nearest");
         m.output("y");
         return m;
       }});
  s.push_back({"SoftmaxCrossEntropyLoss", [] {
                 TestModel m;
                 m.input("x", TensorProto::FLOAT, {3, 5});
                 m.initializer("labels", ints({3}, {0, 4, 2}));
                 attr_string(m.node("SoftmaxCrossEntropyLoss", {"x", "labels"}, {"y"}, "n"),
                             "reduction", "mean");
                 m.output("y");
                 return m;
               }});
  return s;
}

// One random mutation of `m` (`rng` decides what and how).
void mutate(TestModel& m, std::mt19937_64& rng) {
  auto pick = [&](int64_t n) { return int64_t(rng() % uint64_t(std::max<int64_t>(n, 1))); };
  onnx::GraphProto* g = m.proto().mutable_graph();
  const int64_t int_values[] = {
      -3, -1, 0, 1, 2, 7, int64_t(1) << 40, std::numeric_limits<int64_t>::min()};
  const float float_values[] = {std::nanf(""), std::numeric_limits<float>::infinity(), -1.0f, 0.0f,
                                1e30f};
  const char* strings[] = {"", "garbage", "linear", "nearest", "cubic", "sum", "none", "ij->ji"};
  switch (pick(6)) {
    case 0: {  // an attribute's value
      onnx::NodeProto* n = g->mutable_node(int(pick(g->node_size())));
      if (n->attribute_size() == 0) break;
      onnx::AttributeProto* a = n->mutable_attribute(int(pick(n->attribute_size())));
      switch (a->type()) {
        case onnx::AttributeProto::INT:
          a->set_i(int_values[pick(std::size(int_values))]);
          break;
        case onnx::AttributeProto::INTS:
          a->clear_ints();
          for (int64_t k = pick(5); k > 0; --k)
            a->add_ints(int_values[pick(std::size(int_values))]);
          break;
        case onnx::AttributeProto::FLOAT:
          a->set_f(float_values[pick(std::size(float_values))]);
          break;
        case onnx::AttributeProto::STRING:
          a->set_s(strings[pick(std::size(strings))]);
          break;
        default:  // a tensor attribute: a type the importer does not expect
          a->set_type(onnx::AttributeProto::INT);
          a->set_i(3);
      }
      break;
    }
    case 1: {  // an attribute the op does not have, or a known one of the wrong kind
      onnx::NodeProto* n = g->mutable_node(int(pick(g->node_size())));
      if (pick(2) == 0)
        attr_int(n, "no_such_attribute", 1);
      else
        attr_string(n, "axis", "zero");
      break;
    }
    case 2: {  // a graph input's shape
      if (g->input_size() == 0) break;
      onnx::TensorShapeProto* shape = g->mutable_input(int(pick(g->input_size())))
                                          ->mutable_type()
                                          ->mutable_tensor_type()
                                          ->mutable_shape();
      shape->clear_dim();
      const int64_t dims[] = {0, 1, 2, 3, 5, 1 << 20};
      for (int64_t r = pick(6); r > 0; --r)
        shape->add_dim()->set_dim_value(dims[pick(std::size(dims))]);
      break;
    }
    case 3: {  // an initializer's dims or bytes
      if (g->initializer_size() == 0) break;
      onnx::TensorProto* t = g->mutable_initializer(int(pick(g->initializer_size())));
      if (pick(2) == 0 && t->dims_size() > 0) {
        t->set_dims(int(pick(t->dims_size())), int_values[pick(std::size(int_values))]);
      } else if (!t->raw_data().empty()) {
        t->mutable_raw_data()->resize(size_t(pick(int64_t(t->raw_data().size()))));
      } else {
        t->set_data_type(int(pick(17)));
      }
      break;
    }
    case 4: {  // a node's inputs: one dropped, repeated or renamed
      onnx::NodeProto* n = g->mutable_node(int(pick(g->node_size())));
      if (n->input_size() == 0) break;
      const int i = int(pick(n->input_size()));
      switch (pick(3)) {
        case 0:
          n->mutable_input()->DeleteSubrange(i, 1);
          break;
        case 1:
          n->add_input(n->input(i));
          break;
        default:
          n->set_input(i, "");
      }
      break;
    }
    default: {  // a node's outputs: one more, or the first renamed to an input's name
      onnx::NodeProto* n = g->mutable_node(int(pick(g->node_size())));
      if (pick(2) == 0)
        n->add_output("extra");
      else if (n->input_size() > 0)
        n->set_output(0, n->input(0));
    }
  }
}

TEST(OnnxImportFuzz, MutatedModelsOfTheNewOpsImportOrSayWhy) {
  std::mt19937_64 rng(20261125);
  int imported = 0, refused = 0;
  for (const Seed& seed : seeds()) {
    SCOPED_TRACE(seed.op);
    ASSERT_NO_THROW(import(seed.make())) << "the unmutated seed must import";
    for (int trial = 0; trial < 60; ++trial) {
      TestModel m = seed.make();
      for (int64_t k = 1 + int64_t(rng() % 3); k > 0; --k) mutate(m, rng);
      try {
        import(m);
        ++imported;
      } catch (const Error& e) {
        ++refused;
        EXPECT_EQ(e.where(), "onnx import: m.onnx") << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "trial " << trial << ": non-fusebox exception: " << e.what() << "\n"
                      << m.proto().DebugString();
      }
    }
  }
  std::printf("[onnx fuzz] %d mutants imported, %d refused with an Error\n", imported, refused);
  EXPECT_GT(refused, imported / 4);
}

}  // namespace
}  // namespace fusebox::testing
