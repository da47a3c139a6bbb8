// The interface between the ONNX model loader and the per-op importers.
//
// The loader (model_loader.cpp) walks the ONNX nodes in order. For each one it
// finds the op's OpSpec, builds a NodeContext and calls the spec's import
// function, which reads inputs and attributes through the context and emits
// fusebox nodes into ctx.graph(). The loader then binds the node's ONNX output
// names to whatever the importer set with set_output.
//
// Constant folding (const_fold.cpp) runs the same import function against a
// scratch graph whose inputs are all constants, executes it on the CPU backend
// and binds the outputs as known tensors. So every importer works unchanged for
// values known at import (Shape -> Slice -> Concat -> Reshape chains).
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "frontends/onnx/attributes.h"
#include "fusebox/ir/graph.h"

namespace fusebox::onnx_import {

// One input of the node being imported, as the loader resolved it.
struct NodeInput {
  std::string name;                  // ONNX value name; empty: an absent optional input
  TensorType type;                   // valid when name is not empty
  const Tensor* constant = nullptr;  // the contents, when known at import
  ValueId id = kNoValue;             // in the target graph, once materialised
};

// What an importer bound to one ONNX output: a graph value or a known tensor.
struct NodeOutput {
  ValueId id = kNoValue;
  Tensor constant;
};

class NodeContext {
 public:
  // Adds a known input to the graph (as a constant) and returns its id.
  using Materialize = std::function<ValueId(const NodeInput&)>;

  // `read`: the names some node or the graph's outputs read (nullptr: every name counts as read).
  NodeContext(Graph& graph, const onnx::NodeProto& proto, std::string where, std::string node_name,
              int opset, std::vector<NodeInput> inputs, Materialize materialize,
              const std::set<std::string>* read = nullptr);

  Graph& graph() { return graph_; }
  const onnx::NodeProto& proto() const { return proto_; }
  const std::string& op_type() const { return proto_.op_type(); }
  int opset() const { return opset_; }
  // The fusebox node name: the ONNX node's name, or "<op_type>_<index>".
  const std::string& name() const { return node_name_; }
  const std::string& where() const { return where_; }
  // "node 'conv1' (Conv)": how messages name the node.
  const std::string& desc() const { return desc_; }
  Attributes& attrs() { return attrs_; }

  // ---- inputs ----
  int input_count() const { return int(inputs_.size()); }
  bool has_input(int i) const;
  const TensorType& input_type(int i) const;  // the input must be present
  const Shape& input_shape(int i) const { return input_type(i).shape; }
  int64_t input_rank(int i) const { return int64_t(input_shape(i).size()); }
  // The input as a graph value (a known tensor enters the graph as a constant).
  ValueId input(int i);
  ValueId optional_input(int i);  // kNoValue when absent
  // An input whose contents decide shapes or attribute values (a Reshape's shape,
  // Slice's starts, ...): it must be known at import, else an "unsupported" Error
  // naming the input and its role.
  const Tensor& const_input(int i, const char* role) const;
  const Tensor* optional_const_input(int i, const char* role) const;  // nullptr when absent
  bool input_known(int i) const;                                      // present and known at import
  // A known integer (i64 or i32) input of rank 0 or 1, as a vector.
  std::vector<int64_t> const_ints(int i, const char* role) const;
  // The same for any rank (the values in row-major order).
  std::vector<int64_t> const_ints_any_rank(int i, const char* role) const;
  // A known one-element input as a double.
  double const_scalar(int i, const char* role) const;

  // ---- outputs ----
  int output_count() const { return proto_.output_size(); }
  // Present, named and read by a later node or as a graph output: an importer need not make an
  // output nothing reads (Dropout's mask in a training export: a full tensor per node).
  bool wants_output(int i) const;
  // Present and named, read or not (where naming an output changes what the node computes).
  bool names_output(int i) const;

  // Emits a fusebox node named name() (or "name()/suffix" for helper nodes).
  std::vector<ValueId> emit(OpKind op, Attrs attrs, std::vector<ValueId> inputs,
                            const std::string& suffix = {});
  ValueId emit1(OpKind op, Attrs attrs, std::vector<ValueId> inputs,
                const std::string& suffix = {}) {
    return emit(op, std::move(attrs), std::move(inputs), suffix).at(0);
  }
  // A constant helper value (e.g. a divisor) in the graph.
  ValueId constant(Tensor value, const std::string& suffix);

  void set_output(int i, ValueId v);
  void set_output(int i, Tensor known);
  const std::vector<NodeOutput>& outputs() const { return outputs_; }

  // ---- errors: "[where] node 'n' (Op): message" ----
  [[noreturn]] void fail(const std::string& message) const;
  // "[where] unsupported: node 'n' (Op): message"
  [[noreturn]] void unsupported(const std::string& message) const;
  template <class... Parts>
  void check(bool cond, Parts&&... parts) const {
    if (!cond) fail(cat(std::forward<Parts>(parts)...));
  }

 private:
  std::string input_desc(int i, const char* role) const;

  Graph& graph_;
  const onnx::NodeProto& proto_;
  std::string where_;
  std::string node_name_;
  std::string desc_;
  int opset_;
  std::vector<NodeInput> inputs_;
  Materialize materialize_;
  const std::set<std::string>* read_;
  Attributes attrs_;
  std::vector<NodeOutput> outputs_;
};

// An Error's message without its "[where] " prefix: for re-throwing under a new where.
inline std::string message_of(const Error& e) {
  const std::string what = e.what();
  const size_t prefix = e.where().size() + 3;  // "[" where "] "
  return what.size() >= prefix ? what.substr(prefix) : what;
}

// ---- the op table ----
using ImportFn = void (*)(NodeContext&);

struct OpSpec {
  const char* op_type;
  int since_opset;  // the op does not exist in earlier opsets
  int min_inputs;   // the first min_inputs inputs are required
  int max_inputs;   // kVariadic: any number
  int max_outputs;
  ImportFn import;
};
constexpr int kVariadic = 1 << 20;

// Per-family tables (import_ops_*.cpp).
std::span<const OpSpec> conv_pool_ops();
std::span<const OpSpec> norm_ops();
std::span<const OpSpec> math_ops();
std::span<const OpSpec> shape_ops();
std::span<const OpSpec> known_ops();
std::span<const OpSpec>
einsum_ops();  // import_ops_einsum.cpp  // evaluated at import only (import_ops_known.cpp)

// nullptr for an op type we do not import.
const OpSpec* find_op(const std::string& op_type);

// Runs `spec` on a scratch graph whose inputs are the known tensors in `inputs`
// and returns one tensor per output (undefined for outputs not wanted).
std::vector<Tensor> fold_node(const OpSpec& spec, const onnx::NodeProto& proto,
                              const std::string& where, const std::string& node_name, int opset,
                              const std::vector<NodeInput>& inputs);

}  // namespace fusebox::onnx_import
