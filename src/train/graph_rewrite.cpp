// rewrite_graph: copy inputs, then constants (some turned into inputs), then every node
// in order through Graph::add_node (so inference re-checks each one), mapping value ids
// as we go (passes/rewrite/graph_rewriter.h); finally the outputs.
#include "train/graph_rewrite.h"

#include "passes/rewrite/graph_rewriter.h"

namespace fusebox::train {

namespace {

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

  for (const auto& [name, t] : opts.constant_values) {
    auto v = src.find_value(name);
    FUSEBOX_CHECK(v && src.is_constant(*v), where, "'", name, "' is not a constant of the graph");
    const Tensor& had = *src.constant(*v);
    FUSEBOX_CHECK(t.dtype() == had.dtype() && t.shape() == had.shape(), where, "constant '", name,
                  "' is ", dtype_name(had.dtype()), shape_str(had.shape()), ", its new value ",
                  dtype_name(t.dtype()), shape_str(t.shape()));
  }

  GraphRewriter r(src);
  Graph& dst = r.graph();
  for (const auto& [v, t] : src.constants()) {
    const std::string& name = src.value(v).name;
    if (opts.constants_to_inputs.count(name)) {
      r.map(v, dst.add_input(name, t.dtype(), t.shape()));
    } else if (auto it = opts.constant_values.find(name); it != opts.constant_values.end()) {
      r.map(v, dst.add_constant(name, it->second));
    } else {
      r.mapped(v);  // every constant copied, in value-id order
    }
  }

  auto mapped = [&](ValueId v, const std::string& reader) {
    FUSEBOX_CHECK(r.lookup(v) != kNoValue, where, reader, " reads '", src.value(v).name,
                  "', a batch_norm training output that the inference form does not have");
    return r.lookup(v);
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
    std::vector<std::string> names = r.output_names(n);

    if (n.op == OpKind::batch_norm && opts.batch_norm != BatchNormForm::keep) {
      auto& bn = std::get<BatchNormAttrs>(attrs);
      const bool training = opts.batch_norm != BatchNormForm::inference;
      if (training && !bn.training) {
        for (const char* suffix : kTrainingOutputs)
          names.push_back(r.fresh_name(cat(n.name, ":", suffix)));
      } else if (!training && bn.training) {
        names.resize(1);
      }
      bn.training = training;
      bn.sync = opts.batch_norm == BatchNormForm::synchronized_training;
    }
    // A source node with more outputs than its rewrite (training -> inference) leaves the
    // extra ones unmapped; one with fewer (inference -> training) maps what it had.
    r.emit(n, n.op, std::move(attrs), std::move(inputs), names);
  }
  std::vector<ValueId> value_map = r.value_map();  // complete: every constant is mapped
  return {r.finish([&](ValueId v) { return mapped(v, "graph output"); }), std::move(value_map)};
}

}  // namespace fusebox::train
