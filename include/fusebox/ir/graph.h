// The graph: values (typed, shaped) and nodes (an op, typed attributes, input and
// output values). Nodes are kept in a valid execution order: a node is added only
// after the values it reads exist, so Graph::nodes() is a topological order.
//
// Shape and dtype inference runs when a node is added; a mistake throws an Error
// that names the node, its op and the shapes involved.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fusebox/core/tensor.h"
#include "fusebox/ir/ops.h"

namespace fusebox {

using ValueId = int32_t;
using NodeId = int32_t;
constexpr ValueId kNoValue = -1;

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  bool operator==(const TensorType&) const = default;
};

struct Value {
  ValueId id = kNoValue;
  std::string name;
  TensorType type;
  NodeId producer = -1;  // -1: a graph input or a constant
};

struct Node {
  NodeId id = -1;
  std::string name;
  OpKind op = OpKind::identity;
  Attrs attrs;
  std::vector<ValueId> inputs;  // kNoValue marks an absent optional input
  std::vector<ValueId> outputs;
};

// "conv 'layer1.0.conv1'": how errors name a node.
std::string node_label(const Node& n);

class Graph {
 public:
  explicit Graph(std::string name = "graph") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }

  ValueId add_input(const std::string& name, DType dtype, Shape shape);
  // A value with known contents (weights, ONNX initializers and Constant nodes).
  ValueId add_constant(const std::string& name, Tensor value);
  // Adds a node after inferring its outputs' types; returns the output ids.
  // `name` may be empty: a unique one is made. Output names likewise
  // ("<node>:<i>") unless given.
  std::vector<ValueId> add_node(OpKind op, Attrs attrs, std::vector<ValueId> inputs,
                                std::string name = {}, std::vector<std::string> output_names = {});
  void mark_output(ValueId v);
  // The graph has no outputs any more (its values stay): a training step's graph replaces a
  // model's outputs by its loss.
  void unmark_outputs() { outputs_.clear(); }
  // Renames a value (names must stay unique).
  void rename_value(ValueId v, const std::string& name);

  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Value& value(ValueId v) const;
  const Node& node(NodeId n) const;
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const std::map<ValueId, Tensor>& constants() const { return constants_; }
  bool is_constant(ValueId v) const { return constants_.count(v) != 0; }
  const Tensor* constant(ValueId v) const;
  std::optional<ValueId> find_value(const std::string& name) const;

  // Re-checks every invariant (ids, order, types re-inferred, unique names,
  // outputs produced); throws an Error naming the first problem.
  void verify() const;
  // Readable text: one line per input, constant summary, node and output.
  std::string dump() const;

 private:
  ValueId new_value(const std::string& name, TensorType type, NodeId producer);
  std::string unique_name(const std::string& base);

  std::string name_;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  std::map<ValueId, Tensor> constants_;
  std::map<std::string, ValueId> value_names_;
  std::map<std::string, int> node_names_;
};

// Shape and dtype inference for one node (src/ir/infer.cpp). `inputs` holds the
// input types in order, std::nullopt for absent optional inputs. Throws an Error
// naming the node on any mismatch.
//
// It also normalises the node's attributes, so that backends never handle
// defaults or negative axes: conv/pool stride, dilation and pad vectors are
// filled to the spatial rank; every axis (norm, softmax, concat, flatten,
// reduce, squeeze, unsqueeze, slice) becomes non-negative; reduce and squeeze
// axes are listed explicitly and sorted; an empty transpose perm is spelt out;
// slice axes and steps are filled and its starts/ends made absolute and clamped
// (ONNX rules: with step > 0, 0 <= start <= end-or-less <= dim; with step < 0,
// start in [0, dim-1] and end in [-1, dim-1], where -1 means 'before index 0'),
// reshape's shape holds the final extents (no 0 or -1).
std::vector<TensorType> infer_and_normalize(Node& node,
                                            std::span<const std::optional<TensorType>> inputs);

}  // namespace fusebox
