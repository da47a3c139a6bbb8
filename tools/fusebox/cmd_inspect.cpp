// fusebox inspect: import an ONNX model and describe it: the graph with shapes,
// nodes per op, constants, the multiply-adds of its convs and matmuls, and the CUDA
// backend's layout plan (which values it stores channels-last, where it converts).
// --fusion: the inference fusion plan instead (the inference pipeline, passes/pipeline.h: one
// line per group with its intended lowering on CUDA, then "fusion: G groups, F fused ops, U unfused
// ops"); no GPU needed. --dot FILE writes the fused graph as Graphviz.
#include <iomanip>
#include <iostream>

#include "common.h"
#include "fusebox/backends/cuda.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/ir/op_info.h"
#include "fusebox/passes/layout.h"
#include "fusebox/passes/pipeline.h"

namespace fusebox::cli {
namespace {

struct InspectArgs {
  std::string model;
  std::vector<std::string> shapes;
  bool fusion = false;
  std::string precision = "f32";
  std::string dot;
};

// Multiply-accumulates of one node: numel(out) * reduction length for the matmul family,
// numel(y) * (C/groups) * prod(R) for the conv family (conv's backward ops do the same
// arithmetic: y is their dy, w their filter or filter gradient). 0 for every other op.
int64_t macs(const Graph& g, const Node& n) {
  auto shape = [&](ValueId v) -> const Shape& { return g.value(v).type.shape; };
  const OpFamily family = op_info(n.op).family;
  if (family == OpFamily::conv) {
    const Shape& y = shape(n.op == OpKind::conv                 ? n.outputs[0]
                           : n.op == OpKind::conv_backward_data ? n.inputs[0]
                                                                : n.inputs[1]);
    const Shape& w = shape(n.op == OpKind::conv_backward_filter ? n.outputs[0] : n.inputs[1]);
    return numel(y) * numel(w) / w[0];
  }
  if (family == OpFamily::matmul) {
    const Shape& a = shape(n.inputs[0]);
    const bool trans_a = n.op == OpKind::gemm && std::get<GemmAttrs>(n.attrs).trans_a;
    return numel(shape(n.outputs[0])) * (trans_a ? a[0] : a.back());
  }
  return 0;
}

int inspect(const InspectArgs& args) {
  OnnxImportOptions opts;
  opts.input_shapes = parse_shape_specs(args.shapes);
  OnnxImportReport report;
  opts.report = &report;
  Graph g = import_onnx_file(args.model, opts);
  if (args.fusion || !args.dot.empty()) {
    PipelineLog log;
    const Graph fused = prepare_graph(g, {.kind = PipelineKind::inference,
                                          .precision = parse_precision(args.precision),
                                          .fusion = InferenceFusionOptions::from_env(),
                                          .log = &log});
    if (!args.dot.empty())
      write_file_atomic(args.dot, fusion_dot(fused, log.fusion, cuda::describe_lowering));
    if (args.fusion) {
      std::cout << "fusion plan of " << g.name() << " (" << g.nodes().size() << " nodes, "
                << args.precision << ", inference):\n"
                << describe_fusion(fused, log.fusion, cuda::describe_lowering);
      return 0;
    }
  }
  std::cout << g.dump();

  std::map<std::string, int64_t> per_op;
  int64_t total_macs = 0;
  for (const Node& n : g.nodes()) {
    ++per_op[op_name(n.op)];
    total_macs += macs(g, n);
  }
  std::cout << "\nONNX nodes: " << report.onnx_nodes << ", folded at import: " << report.folded;
  if (!report.folded_by_op.empty()) {
    std::cout << " (";
    const char* sep = "";
    for (const auto& [op, count] : report.folded_by_op)
      std::cout << sep << op << " " << count, sep = ", ";
    std::cout << ")";
  }
  std::cout << "\n";
  std::cout << "\nnodes per op (" << g.nodes().size() << " nodes):\n";
  for (const auto& [op, count] : per_op) std::cout << "  " << op << ": " << count << "\n";

  int64_t values = 0, bytes = 0;
  for (const auto& [v, t] : g.constants()) {
    values += t.numel();
    bytes += int64_t(t.nbytes());
  }
  std::cout << "constants: " << g.constants().size() << " tensors, " << with_commas(values)
            << " values (" << with_commas(bytes) << " bytes)\n";
  std::cout << "multiply-adds in conv/gemm/matmul: " << with_commas(total_macs) << " ("
            << std::fixed << std::setprecision(3) << double(total_macs) * 2e-9 << " GFLOP)\n";
  std::cout.unsetf(std::ios::floatfield);
  std::cout << "CUDA " << plan_layouts(g, layout_policy_from_env()).describe(g);
  return 0;
}

}  // namespace

Command add_inspect_command(CLI::App& parent) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* app = parent.add_subcommand(
      "inspect", "Print an ONNX model's graph with shapes, op counts, constants and FLOPs");
  app->add_option("model", args->model, "The model (.onnx)")->required()->type_name("MODEL.onnx");
  add_shape_option(*app, &args->shapes);
  app->add_flag("--fusion", args->fusion,
                "Print the inference fusion plan: one line per group of ops that will run as "
                "one (and how: a cuDNN graph or a fused kernel), then a summary line");
  app->add_option("--precision", args->precision,
                  "Precision the fusion plan is made for: f32 (default), tf32, bf16, f16")
      ->check(CLI::IsMember({"f32", "tf32", "bf16", "f16"}));
  app->add_option("--dot", args->dot, "Write the fused graph as Graphviz to FILE")
      ->type_name("FILE");
  return {app, [args] { return inspect(*args); }};
}

}  // namespace fusebox::cli
