// GraphRewriter (graph_rewriter.h).
#include "passes/rewrite/graph_rewriter.h"

#include <utility>

namespace fusebox {

GraphRewriter::GraphRewriter(const Graph& source)
    : src_(source), out_(source.name()), map_(source.values().size(), kNoValue) {
  for (ValueId v : src_.inputs()) {
    const Value& val = src_.value(v);
    map_[size_t(v)] = out_.add_input(val.name, val.type.dtype, val.type.shape);
  }
}

ValueId GraphRewriter::mapped(ValueId source_value) {
  if (source_value == kNoValue) return kNoValue;
  ValueId& m = map_[size_t(source_value)];
  if (m != kNoValue) return m;
  const Tensor* t = src_.constant(source_value);
  FUSEBOX_CHECK(t != nullptr, "rewrite " + src_.name(), "internal: value '",
                src_.value(source_value).name, "' is read before it is written");
  m = out_.add_constant(src_.value(source_value).name, *t);
  return m;
}

std::vector<ValueId> GraphRewriter::emit(const Node& source_node, OpKind op, Attrs attrs,
                                         std::vector<ValueId> inputs,
                                         const std::vector<std::string>& names) {
  std::vector<ValueId> outs =
      out_.add_node(op, std::move(attrs), std::move(inputs), source_node.name, names);
  for (size_t i = 0; i < outs.size() && i < source_node.outputs.size(); ++i)
    map_[size_t(source_node.outputs[i])] = outs[i];
  return outs;
}

std::vector<ValueId> GraphRewriter::copy(const Node& n) {
  std::vector<ValueId> inputs;
  for (ValueId v : n.inputs) inputs.push_back(mapped(v));
  return emit(n, n.op, n.attrs, std::move(inputs), output_names(n));
}

std::vector<std::string> GraphRewriter::output_names(const Node& n) const {
  std::vector<std::string> names;
  for (ValueId v : n.outputs) names.push_back(src_.value(v).name);
  return names;
}

std::string GraphRewriter::fresh_name(const std::string& base) const {
  auto taken = [&](const std::string& n) { return src_.find_value(n) || out_.find_value(n); };
  if (!taken(base)) return base;
  for (int i = 1;; ++i) {
    std::string candidate = cat(base, "_", i);
    if (!taken(candidate)) return candidate;
  }
}

Graph GraphRewriter::finish(const std::function<ValueId(ValueId)>& output) {
  for (ValueId v : src_.outputs()) out_.mark_output(output ? output(v) : mapped(v));
  return std::move(out_);
}

}  // namespace fusebox
