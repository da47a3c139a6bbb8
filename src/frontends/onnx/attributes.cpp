#include "frontends/onnx/attributes.h"

#include <set>

#include "fusebox/core/error.h"

namespace fusebox::onnx_import {

using onnx::AttributeProto;

const char* attribute_type_name(int type) {
  switch (type) {
    case AttributeProto::FLOAT:
      return "FLOAT";
    case AttributeProto::INT:
      return "INT";
    case AttributeProto::STRING:
      return "STRING";
    case AttributeProto::TENSOR:
      return "TENSOR";
    case AttributeProto::GRAPH:
      return "GRAPH";
    case AttributeProto::SPARSE_TENSOR:
      return "SPARSE_TENSOR";
    case AttributeProto::TYPE_PROTO:
      return "TYPE_PROTO";
    case AttributeProto::FLOATS:
      return "FLOATS";
    case AttributeProto::INTS:
      return "INTS";
    case AttributeProto::STRINGS:
      return "STRINGS";
    case AttributeProto::TENSORS:
      return "TENSORS";
    case AttributeProto::GRAPHS:
      return "GRAPHS";
    case AttributeProto::SPARSE_TENSORS:
      return "SPARSE_TENSORS";
    case AttributeProto::TYPE_PROTOS:
      return "TYPE_PROTOS";
    default:
      return "UNDEFINED";
  }
}

Attributes::Attributes(const onnx::NodeProto& node, std::string where, std::string node_desc)
    : node_(node),
      where_(std::move(where)),
      node_desc_(std::move(node_desc)),
      used_(size_t(node.attribute_size()), false) {
  std::set<std::string> seen;
  for (const AttributeProto& a : node.attribute()) {
    FUSEBOX_CHECK(!a.name().empty(), where_, node_desc_, ": an attribute has no name");
    FUSEBOX_CHECK(seen.insert(a.name()).second, where_, node_desc_, ": attribute '", a.name(),
                  "' is given twice");
    // ref_attr_name only has a meaning inside a function body.
    FUSEBOX_CHECK(a.ref_attr_name().empty(), where_, node_desc_, ": attribute '", a.name(),
                  "' refers to a function attribute ('", a.ref_attr_name(),
                  "'), which is only valid inside a function");
  }
}

void Attributes::fail(const std::string& name, const std::string& message) const {
  throw Error(where_, cat(node_desc_, ": attribute '", name, "' ", message));
}

void Attributes::unsupported_value(const std::string& name, const std::string& value,
                                   const std::string& supported) const {
  throw Error(where_, cat("unsupported: ", node_desc_, ": attribute ", name, "=", value,
                          " is not supported (", supported, ")"));
}

bool Attributes::has(const std::string& name) const {
  for (const AttributeProto& a : node_.attribute())
    if (a.name() == name) return true;
  return false;
}

const AttributeProto* Attributes::lookup(const std::string& name,
                                         AttributeProto::AttributeType type) {
  for (int i = 0; i < node_.attribute_size(); ++i) {
    const AttributeProto& a = node_.attribute(i);
    if (a.name() != name) continue;
    used_[size_t(i)] = true;
    if (a.type() != type)
      fail(name, cat("has type ", attribute_type_name(a.type()), ", expected ",
                     attribute_type_name(type)));
    return &a;
  }
  return nullptr;
}

int64_t Attributes::get_int(const std::string& name, int64_t fallback) {
  const AttributeProto* a = lookup(name, AttributeProto::INT);
  return a ? a->i() : fallback;
}

std::optional<int64_t> Attributes::find_int(const std::string& name) {
  const AttributeProto* a = lookup(name, AttributeProto::INT);
  if (!a) return std::nullopt;
  return a->i();
}

bool Attributes::get_bool(const std::string& name, bool fallback) {
  const AttributeProto* a = lookup(name, AttributeProto::INT);
  if (!a) return fallback;
  if (a->i() != 0 && a->i() != 1) fail(name, cat("is ", a->i(), ", expected 0 or 1"));
  return a->i() == 1;
}

double Attributes::get_float(const std::string& name, double fallback) {
  const AttributeProto* a = lookup(name, AttributeProto::FLOAT);
  return a ? double(a->f()) : fallback;
}

std::string Attributes::get_string(const std::string& name, const std::string& fallback) {
  const AttributeProto* a = lookup(name, AttributeProto::STRING);
  return a ? a->s() : fallback;
}

std::vector<int64_t> Attributes::get_ints(const std::string& name, std::vector<int64_t> fallback) {
  const AttributeProto* a = lookup(name, AttributeProto::INTS);
  if (!a) return fallback;
  return {a->ints().begin(), a->ints().end()};
}

std::optional<std::vector<int64_t>> Attributes::find_ints(const std::string& name) {
  const AttributeProto* a = lookup(name, AttributeProto::INTS);
  if (!a) return std::nullopt;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::vector<double> Attributes::get_floats(const std::string& name) {
  const AttributeProto* a = lookup(name, AttributeProto::FLOATS);
  if (!a) return {};
  return {a->floats().begin(), a->floats().end()};
}

const onnx::TensorProto* Attributes::find_tensor(const std::string& name) {
  const AttributeProto* a = lookup(name, AttributeProto::TENSOR);
  return a ? &a->t() : nullptr;
}

int64_t Attributes::required_int(const std::string& name) {
  std::optional<int64_t> v = find_int(name);
  if (!v) fail(name, "is required but missing");
  return *v;
}

std::vector<int64_t> Attributes::required_ints(const std::string& name) {
  std::optional<std::vector<int64_t>> v = find_ints(name);
  if (!v) fail(name, "is required but missing");
  return *v;
}

void Attributes::ignore(const std::string& name) {
  for (int i = 0; i < node_.attribute_size(); ++i)
    if (node_.attribute(i).name() == name) used_[size_t(i)] = true;
}

void Attributes::finish() const {
  for (int i = 0; i < node_.attribute_size(); ++i) {
    if (!used_[size_t(i)])
      throw Error(where_, cat("unsupported: ", node_desc_, ": attribute '",
                              node_.attribute(i).name(), "' is not supported"));
  }
}

std::vector<std::string> Attributes::names() const {
  std::vector<std::string> out;
  for (const AttributeProto& a : node_.attribute()) out.push_back(a.name());
  return out;
}

}  // namespace fusebox::onnx_import
