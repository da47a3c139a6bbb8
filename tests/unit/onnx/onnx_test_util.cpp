#include "onnx_test_util.h"

#include <filesystem>
#include <set>

#include "fusebox/io/tensor_file.h"
#include "io/tensor_proto.h"

namespace fusebox::testing {

namespace fs = std::filesystem;

TestModel::TestModel(int64_t opset) {
  model_.set_ir_version(8);
  model_.set_producer_name("fusebox-tests");
  onnx::OperatorSetIdProto* o = model_.add_opset_import();
  o->set_domain("");
  o->set_version(opset);
  model_.mutable_graph()->set_name("test");
}

void TestModel::input(const std::string& name, int elem_type, const std::vector<int64_t>& dims) {
  onnx::ValueInfoProto* v = model_.mutable_graph()->add_input();
  v->set_name(name);
  onnx::TypeProto::Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem_type);
  onnx::TensorShapeProto* s = t->mutable_shape();
  for (int64_t d : dims) {
    if (d < 0)
      s->add_dim()->set_dim_param("N");
    else
      s->add_dim()->set_dim_value(d);
  }
}

void TestModel::output(const std::string& name, int elem_type) {
  onnx::ValueInfoProto* v = model_.mutable_graph()->add_output();
  v->set_name(name);
  v->mutable_type()->mutable_tensor_type()->set_elem_type(elem_type);
}

void TestModel::initializer(const std::string& name, const Tensor& t) {
  tensor_to_proto(t, name, model_.mutable_graph()->add_initializer());
}

onnx::NodeProto* TestModel::node(const std::string& op_type, const std::vector<std::string>& inputs,
                                 const std::vector<std::string>& outputs, const std::string& name) {
  onnx::NodeProto* n = model_.mutable_graph()->add_node();
  n->set_op_type(op_type);
  n->set_name(name);
  for (const std::string& s : inputs) n->add_input(s);
  for (const std::string& s : outputs) n->add_output(s);
  return n;
}

std::string TestModel::bytes() const {
  std::string out;
  EXPECT_TRUE(model_.SerializeToString(&out));
  return out;
}

namespace {
onnx::AttributeProto* new_attr(onnx::NodeProto* n, const std::string& name,
                               onnx::AttributeProto::AttributeType type) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(type);
  return a;
}
}  // namespace

void attr_int(onnx::NodeProto* n, const std::string& name, int64_t v) {
  new_attr(n, name, onnx::AttributeProto::INT)->set_i(v);
}
void attr_ints(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  onnx::AttributeProto* a = new_attr(n, name, onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
void attr_float(onnx::NodeProto* n, const std::string& name, float v) {
  new_attr(n, name, onnx::AttributeProto::FLOAT)->set_f(v);
}
void attr_string(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  new_attr(n, name, onnx::AttributeProto::STRING)->set_s(v);
}
void attr_tensor(onnx::NodeProto* n, const std::string& name, const Tensor& t) {
  tensor_to_proto(t, "", new_attr(n, name, onnx::AttributeProto::TENSOR)->mutable_t());
}

ValueId value_id(const Graph& g, const std::string& name) {
  std::optional<ValueId> v = g.find_value(name);
  if (!v) throw Error("test", cat("graph ", g.name(), " has no value '", name, "'"));
  return *v;
}

std::string onnx_node_test_dir(const std::string& test_name) {
  return "/usr/include/onnx/backend/test/data/node/" + test_name;
}

bool onnx_node_tests_available() {
  return fs::exists(onnx_node_test_dir("test_relu"));
}

::testing::AssertionResult run_onnx_node_test(const std::string& test_name, bool freeze_params,
                                              double rtol, double atol) {
  const std::string dir = onnx_node_test_dir(test_name);
  onnx::ModelProto model;
  if (!model.ParseFromString(read_file(dir + "/model.onnx")))
    return ::testing::AssertionFailure() << test_name << ": model.onnx does not parse";
  std::set<std::string> initializers;
  for (const auto& t : model.graph().initializer()) initializers.insert(t.name());
  std::vector<std::string> input_names, output_names;
  for (const auto& v : model.graph().input())
    if (!initializers.count(v.name())) input_names.push_back(v.name());
  for (const auto& v : model.graph().output()) output_names.push_back(v.name());

  const std::string data = dir + "/test_data_set_0/";
  NamedTensors feeds;
  OnnxImportOptions opts;
  std::vector<Tensor> inputs, expected;
  try {
    for (size_t i = 0; i < input_names.size(); ++i)
      inputs.push_back(read_tensor_pb(cat(data, "input_", i, ".pb")));
    for (size_t i = 0; i < output_names.size(); ++i)
      expected.push_back(read_tensor_pb(cat(data, "output_", i, ".pb")));
  } catch (const Error& e) {
    return ::testing::AssertionFailure() << test_name << ": test data: " << e.what();
  }
  for (size_t i = 0; i < input_names.size(); ++i) {
    const Tensor& t = inputs[i];
    if (freeze_params && i > 0)
      opts.constant_inputs[input_names[i]] = t;
    else
      feeds[input_names[i]] = t;
  }
  Graph g;
  try {
    g = import_onnx_file(dir + "/model.onnx", opts);
  } catch (const Error& e) {
    return ::testing::AssertionFailure() << test_name << ": import failed: " << e.what();
  }
  NamedTensors results;
  try {
    results = run_graph(g, feeds);
  } catch (const Error& e) {
    return ::testing::AssertionFailure() << test_name << ": run failed: " << e.what();
  }
  for (size_t i = 0; i < output_names.size(); ++i) {
    auto it = results.find(output_names[i]);
    if (it == results.end())
      return ::testing::AssertionFailure()
             << test_name << ": no output '" << output_names[i] << "'";
    ::testing::AssertionResult r = all_close(it->second, expected[i], rtol, atol);
    if (!r)
      return ::testing::AssertionFailure()
             << test_name << ": output '" << output_names[i] << "': " << r.message();
  }
  return ::testing::AssertionSuccess();
}

}  // namespace fusebox::testing
