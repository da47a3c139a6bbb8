// rewrite_graph: copy inputs, then constants (some turned into inputs), then every node
// in order through Graph::add_node (so inference re-checks each one), mapping value ids
// as we go; finally the outputs.
#include "train/graph_rewrite.h"

namespace fusebox::train {

namespace {

// A name used by neither graph: `base`, else base_1, base_2, ...
std::string fresh_name(const Graph& src, const Graph& dst, const std::string& base) {
  auto taken = [&](const std::string& n) { return src.find_value(n) || dst.find_value(n); };
  if (!taken(base)) return base;
  for (int i = 1;; ++i) {
    std::string candidate = cat(base, "_", i);
    if (!taken(candidate)) return candidate;
  }
}

// The training form's outputs after y, named after the node.
constexpr const char* kTrainingOutputs[] = {"running_mean", "running_var", "saved_mean",
                                            "saved_inv_std"};

}  // namespace

RewrittenGraph rewrite_graph(const Graph& src, const RewriteOptions& opts) {
  const std::string where = "rewrite " + src.name();
  for (const std::string& name : opts.constants_to_inputs) {
    auto v = src.find_value(name);
    FUSEBOX_CHECK(v && src.is_constant(*v), where, "'", name, "' is not a constant of the graph");
  }

  RewrittenGraph out{Graph(src.name()), std::vector<ValueId>(src.values().size(), kNoValue)};
  Graph& dst = out.graph;
  std::vector<ValueId>& map = out.value_map;

  for (ValueId v : src.inputs()) {
    const Value& val = src.value(v);
    map[size_t(v)] = dst.add_input(val.name, val.type.dtype, val.type.shape);
  }
  for (const auto& [v, t] : src.constants()) {
    const std::string& name = src.value(v).name;
    map[size_t(v)] = opts.constants_to_inputs.count(name)
                         ? dst.add_input(name, t.dtype(), t.shape())
                         : dst.add_constant(name, t);
  }

  auto mapped = [&](ValueId v, const std::string& reader) {
    ValueId m = map[size_t(v)];
    FUSEBOX_CHECK(m != kNoValue, where, reader, " reads '", src.value(v).name,
                  "', a batch_norm training output that the inference form does not have");
    return m;
  };

  std::vector<NodeId> order = opts.node_order;
  if (order.empty()) {
    for (const Node& n : src.nodes()) order.push_back(n.id);
  }
  FUSEBOX_CHECK(order.size() == src.nodes().size(), where, "node_order holds ", order.size(),
                " nodes, the graph ", src.nodes().size());
  for (NodeId id : order) {
    const Node& n = src.node(id);
    std::vector<ValueId> inputs;
    for (ValueId v : n.inputs)
      inputs.push_back(v == kNoValue ? kNoValue : mapped(v, node_label(n)));
    Attrs attrs = n.attrs;
    std::vector<std::string> names;
    for (ValueId v : n.outputs) names.push_back(src.value(v).name);

    if (n.op == OpKind::batch_norm && opts.batch_norm != BatchNormForm::keep) {
      auto& bn = std::get<BatchNormAttrs>(attrs);
      const bool training = opts.batch_norm != BatchNormForm::inference;
      if (training && !bn.training) {
        for (const char* suffix : kTrainingOutputs)
          names.push_back(fresh_name(src, dst, cat(n.name, ":", suffix)));
      } else if (!training && bn.training) {
        names.resize(1);
      }
      bn.training = training;
      bn.sync = opts.batch_norm == BatchNormForm::synchronized_training;
    }

    std::vector<ValueId> outs =
        dst.add_node(n.op, std::move(attrs), std::move(inputs), n.name, names);
    // A source node with more outputs than its rewrite (training -> inference) leaves the
    // extra ones unmapped; one with fewer (inference -> training) maps what it had.
    for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i)
      map[size_t(n.outputs[i])] = outs[i];
  }
  for (ValueId v : src.outputs()) dst.mark_output(mapped(v, "graph output"));
  return out;
}

}  // namespace fusebox::train
