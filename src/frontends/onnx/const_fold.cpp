// Import-time constant folding.
//
// A node whose inputs are all known is imported into a scratch graph whose only
// values are those inputs (as constants), using the op's ordinary importer, and the
// scratch graph is run on the CPU backend. The results become known tensors. This
// reuses every importer and kernel as they are, so a folded node computes exactly
// what the unfolded node would at run time.
#include "frontends/onnx/import_context.h"
#include "fusebox/runtime/executor.h"

namespace fusebox::onnx_import {

std::vector<Tensor> fold_node(const OpSpec& spec, const onnx::NodeProto& proto,
                              const std::string& where, const std::string& node_name, int opset,
                              const std::vector<NodeInput>& inputs) {
  Graph scratch("fold");
  std::vector<NodeInput> scratch_inputs = inputs;
  for (NodeInput& in : scratch_inputs) {
    if (!in.name.empty()) in.id = scratch.add_constant(in.name, *in.constant);
  }
  // Every present input already has a scratch id, so nothing is materialised later.
  NodeContext ctx(scratch, proto, where, node_name, opset, std::move(scratch_inputs),
                  [](const NodeInput& in) -> ValueId {
                    throw Error("onnx import", cat("internal: input '", in.name,
                                                   "' was not added to the folding graph"));
                  });
  spec.import(ctx);
  ctx.attrs().finish();

  std::vector<Tensor> results(ctx.outputs().size());
  std::vector<int> from_graph;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!ctx.wants_output(int(i))) continue;
    const NodeOutput& o = ctx.outputs()[i];
    if (o.constant.defined()) {
      results[i] = o.constant;
    } else if (o.id == kNoValue) {
      ctx.fail(cat("internal error: output ", i, " was not produced"));
    } else if (const Tensor* c = scratch.constant(o.id)) {
      results[i] = *c;
    } else {
      scratch.mark_output(o.id);
      from_graph.push_back(int(i));
    }
  }
  if (from_graph.empty()) return results;
  NamedTensors computed;
  try {
    computed = run_graph(scratch, {});
  } catch (const Error& e) {
    ctx.fail(cat("evaluating the node at import (its inputs are all known) failed: ", e.what()));
  }
  for (int i : from_graph) {
    results[size_t(i)] = computed.at(scratch.value(ctx.outputs()[size_t(i)].id).name);
  }
  return results;
}

}  // namespace fusebox::onnx_import
