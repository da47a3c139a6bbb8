// Helpers for the ONNX importer/exporter tests: a small ModelProto builder and a
// runner for the ONNX backend node tests (model.onnx + test_data_set_0/*.pb).
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "fusebox/frontends/onnx.h"
#include "testing.h"

namespace fusebox::testing {

// Builds an ONNX model in memory: TestModel m(17); m.input("x", onnx::TensorProto::FLOAT,
// {1, 3}); auto* n = m.node("Relu", {"x"}, {"y"}); m.output("y"); m.bytes().
class TestModel {
 public:
  explicit TestModel(int64_t opset = 17);

  // dims: -1 makes a symbolic dim named "N".
  void input(const std::string& name, int elem_type, const std::vector<int64_t>& dims);
  void output(const std::string& name, int elem_type = onnx::TensorProto::FLOAT);
  void initializer(const std::string& name, const Tensor& t);
  onnx::NodeProto* node(const std::string& op_type, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs, const std::string& name = "");
  std::string bytes() const;

  onnx::ModelProto& proto() { return model_; }

 private:
  onnx::ModelProto model_;
};

void attr_int(onnx::NodeProto* n, const std::string& name, int64_t v);
void attr_ints(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v);
void attr_float(onnx::NodeProto* n, const std::string& name, float v);
void attr_string(onnx::NodeProto* n, const std::string& name, const std::string& v);
void attr_tensor(onnx::NodeProto* n, const std::string& name, const Tensor& t);

// The id of the value called `name` in `g`; throws an Error when there is none.
ValueId value_id(const Graph& g, const std::string& name);

// Directory of the ONNX node tests (Debian's libonnx-testdata).
std::string onnx_node_test_dir(const std::string& test_name);
bool onnx_node_tests_available();

// Imports and runs one ONNX node test on the CPU; compares every output with
// rtol/atol. With `freeze_params`, every graph input but the first (the shapes, pads,
// axes, bounds that the import needs as known tensors) is frozen to the test data.
::testing::AssertionResult run_onnx_node_test(const std::string& test_name,
                                              bool freeze_params = false, double rtol = 1e-4,
                                              double atol = 1e-5);

// Expects `body` to throw a fusebox::Error whose message contains every one of `parts`.
template <class F>
::testing::AssertionResult throws_error_with(F&& body, const std::vector<std::string>& parts) {
  try {
    body();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks '" << p << "': " << msg;
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-fusebox exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// Imports a TestModel ("m.onnx" in errors) and runs a graph, returning one named output.
inline Graph import(const TestModel& m, const OnnxImportOptions& opts = {}) {
  return import_onnx_bytes(m.bytes(), "m.onnx", opts);
}
inline Tensor run1(const Graph& g, const NamedTensors& feeds, const std::string& output) {
  NamedTensors r = run_graph(g, feeds);
  auto it = r.find(output);
  EXPECT_NE(it, r.end()) << "no output " << output;
  return it == r.end() ? Tensor() : it->second;
}

}  // namespace fusebox::testing
