#include "frontends/onnx/import_context.h"

#include <algorithm>

namespace fusebox::onnx_import {

NodeContext::NodeContext(Graph& graph, const onnx::NodeProto& proto, std::string where,
                         std::string node_name, int opset, std::vector<NodeInput> inputs,
                         Materialize materialize, const std::set<std::string>* read)
    : graph_(graph),
      proto_(proto),
      where_(std::move(where)),
      node_name_(std::move(node_name)),
      desc_(cat("node '", node_name_, "' (", proto.op_type(), ")")),
      opset_(opset),
      inputs_(std::move(inputs)),
      materialize_(std::move(materialize)),
      read_(read),
      attrs_(proto, where_, desc_),
      outputs_(size_t(proto.output_size())) {}

void NodeContext::fail(const std::string& message) const {
  throw Error(where_, cat(desc_, ": ", message));
}

void NodeContext::unsupported(const std::string& message) const {
  throw Error(where_, cat("unsupported: ", desc_, ": ", message));
}

bool NodeContext::has_input(int i) const {
  return i >= 0 && i < input_count() && !inputs_[size_t(i)].name.empty();
}

std::string NodeContext::input_desc(int i, const char* role) const {
  std::string name = i < input_count() ? inputs_[size_t(i)].name : std::string();
  return cat("input ", i, " (", role, name.empty() ? "" : cat(", '", name, "'"), ")");
}

const TensorType& NodeContext::input_type(int i) const {
  check(has_input(i), "input ", i, " is required but missing");
  return inputs_[size_t(i)].type;
}

ValueId NodeContext::input(int i) {
  check(has_input(i), "input ", i, " is required but missing");
  NodeInput& in = inputs_[size_t(i)];
  if (in.id == kNoValue) in.id = materialize_(in);
  return in.id;
}

ValueId NodeContext::optional_input(int i) {
  return has_input(i) ? input(i) : kNoValue;
}

const Tensor& NodeContext::const_input(int i, const char* role) const {
  check(has_input(i), input_desc(i, role), " is required but missing");
  const NodeInput& in = inputs_[size_t(i)];
  if (!in.constant) {
    unsupported(cat(input_desc(i, role),
                    " must be known at import (an initializer, a Constant, or computed from "
                    "them); a graph input can be frozen with OnnxImportOptions::constant_inputs"));
  }
  return *in.constant;
}

bool NodeContext::input_known(int i) const {
  return has_input(i) && inputs_[size_t(i)].constant != nullptr;
}

const Tensor* NodeContext::optional_const_input(int i, const char* role) const {
  return has_input(i) ? &const_input(i, role) : nullptr;
}

std::vector<int64_t> NodeContext::const_ints(int i, const char* role) const {
  const Tensor& t = const_input(i, role);
  check(t.rank() <= 1, input_desc(i, role), " must be 1-D, got shape ", shape_str(t.shape()));
  return const_ints_any_rank(i, role);
}

std::vector<int64_t> NodeContext::const_ints_any_rank(int i, const char* role) const {
  const Tensor& t = const_input(i, role);
  check(t.dtype() == DType::i64 || t.dtype() == DType::i32, input_desc(i, role),
        " must be int64 or int32, got ", dtype_name(t.dtype()));
  std::vector<int64_t> out(size_t(t.numel()));
  for (int64_t k = 0; k < t.numel(); ++k) {
    out[size_t(k)] = t.dtype() == DType::i64 ? t.data<int64_t>()[k] : t.data<int32_t>()[k];
  }
  return out;
}

double NodeContext::const_scalar(int i, const char* role) const {
  const Tensor& t = const_input(i, role);
  check(t.numel() == 1, input_desc(i, role), " must hold one value, got shape ",
        shape_str(t.shape()));
  return t.get(0);
}

bool NodeContext::names_output(int i) const {
  return i >= 0 && i < output_count() && !proto_.output(i).empty();
}

bool NodeContext::wants_output(int i) const {
  return names_output(i) && (read_ == nullptr || read_->count(proto_.output(i)) > 0);
}

std::vector<ValueId> NodeContext::emit(OpKind op, Attrs attrs, std::vector<ValueId> inputs,
                                       const std::string& suffix) {
  std::string name = suffix.empty() ? node_name_ : cat(node_name_, "/", suffix);
  return graph_.add_node(op, std::move(attrs), std::move(inputs), name);
}

ValueId NodeContext::constant(Tensor value, const std::string& suffix) {
  return graph_.add_constant(cat(node_name_, "/", suffix), std::move(value));
}

void NodeContext::set_output(int i, ValueId v) {
  check(i >= 0 && i < output_count(), "internal: output ", i, " does not exist");
  outputs_[size_t(i)] = NodeOutput{v, Tensor()};
}

void NodeContext::set_output(int i, Tensor known) {
  check(i >= 0 && i < output_count(), "internal: output ", i, " does not exist");
  outputs_[size_t(i)] = NodeOutput{kNoValue, std::move(known)};
}

}  // namespace fusebox::onnx_import
