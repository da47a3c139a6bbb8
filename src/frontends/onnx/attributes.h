// Typed access to one ONNX node's attributes.
//
// Every getter checks the attribute's declared type and throws an Error naming the
// file, the node, its op_type and the attribute. Each attribute read (or explicitly
// ignored) is remembered, so that finish() can refuse attributes the importer does
// not know: silently ignoring one could change the model's meaning.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fusebox::onnx_import {

class Attributes {
 public:
  // `where` is the error location ("onnx import: m.onnx"), `node` how messages name
  // the node ("node 'conv1' (Conv)"). Rejects duplicated and unnamed attributes.
  Attributes(const onnx::NodeProto& node, std::string where, std::string node_desc);

  bool has(const std::string& name) const;

  // Optional attributes: the value, or `fallback` when absent.
  int64_t get_int(const std::string& name, int64_t fallback);
  double get_float(const std::string& name, double fallback);
  std::string get_string(const std::string& name, const std::string& fallback);
  std::vector<int64_t> get_ints(const std::string& name, std::vector<int64_t> fallback = {});
  std::vector<double> get_floats(const std::string& name);
  std::optional<int64_t> find_int(const std::string& name);
  std::optional<std::vector<int64_t>> find_ints(const std::string& name);
  const onnx::TensorProto* find_tensor(const std::string& name);

  // Required attributes: a missing one is an Error.
  int64_t required_int(const std::string& name);
  std::vector<int64_t> required_ints(const std::string& name);

  // A boolean stored as INT: only 0 and 1 are accepted.
  bool get_bool(const std::string& name, bool fallback);

  // Marks an attribute as understood without reading it (e.g. a checked-only hint).
  void ignore(const std::string& name);
  // Throws "unsupported: ..." for the first attribute that was never read.
  void finish() const;

  // Names of the attributes present, in order: for messages.
  std::vector<std::string> names() const;

  // "[where] node 'n' (Op): attribute 'a' ..." errors.
  [[noreturn]] void fail(const std::string& name, const std::string& message) const;
  // "unsupported: node 'mp1' (MaxPool): attribute storage_order=1 is not supported (only 0)"
  [[noreturn]] void unsupported_value(const std::string& name, const std::string& value,
                                      const std::string& supported) const;

 private:
  const onnx::AttributeProto* lookup(const std::string& name,
                                     onnx::AttributeProto_AttributeType type);
  const onnx::NodeProto& node_;
  std::string where_;
  std::string node_desc_;
  std::vector<bool> used_;
};

// The enum name of an attribute type for messages: "INTS", "FLOAT", ...
const char* attribute_type_name(int type);

}  // namespace fusebox::onnx_import
