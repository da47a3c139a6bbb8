// The inference pipeline of the fusion passes and its report (passes/fusion.h):
// prepare_inference_graph, the FusionLog, describe_fusion and fusion_dot.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "fusebox/passes/fuse_pointwise.h"
#include "fusebox/passes/fusion.h"

namespace fusebox {

void FusionLog::add(const std::string& node, const std::vector<std::string>& ops) {
  for (FusionGroup& g : groups_) {
    if (g.node != node) continue;
    for (const std::string& op : ops)
      if (std::find(g.ops.begin(), g.ops.end(), op) == g.ops.end()) g.ops.push_back(op);
    return;
  }
  groups_.push_back({node, ops});
}

const FusionGroup* FusionLog::find(const std::string& node) const {
  for (const FusionGroup& g : groups_)
    if (g.node == node) return &g;
  return nullptr;
}

InferenceFusionOptions InferenceFusionOptions::from_env() {
  const char* text = std::getenv("FUSEBOX_FUSION");
  if (text == nullptr || std::string(text).empty() || std::string(text) == "1") return {};
  FUSEBOX_CHECK(std::string(text) == "0", "settings", "FUSEBOX_FUSION='", text,
                "' must be 1 (the inference fusions, default) or 0 (none)");
  return none();
}

Graph prepare_inference_graph(const Graph& model, Precision precision,
                              const InferenceFusionOptions& options, FusionLog* log) {
  Graph g = model;
  // Folding first, on the model's own (f32) weights: the folded ones are rounded once.
  if (options.fold_batch_norm) fold_batch_norms(g, log);
  if (options.conv_epilogue) form_linears(g, log);
  g = apply_mixed_precision(g, precision, nullptr, {.fold_constants = true});
  if (options.conv_epilogue) {
    fuse_conv_epilogues(g, log);
    fuse_gemm_epilogues(g, log);
  }
  // Before the pointwise chains, which would take the scale and the casts around the softmax.
  if (options.attention) fuse_attention(g, log);
  if (options.batch_norm) {
    fuse_batch_norm_residual(g, log);
    fuse_batch_norm_relu(g, log);
  }
  if (options.pointwise) fuse_pointwise_chains(g, log);
  g.verify();
  return g;
}

namespace {

bool has_input(const Node& n, size_t i) {
  return i < n.inputs.size() && n.inputs[i] != kNoValue;
}

std::string join_ops(const std::vector<std::string>& ops, const char* sep) {
  std::string s;
  for (const std::string& op : ops) s += (s.empty() ? "" : sep) + op;
  return s;
}

}  // namespace

std::string planned_lowering(const Graph& g, const Node& n) {
  (void)g;
  std::vector<std::string> parts;
  switch (n.op) {
    case OpKind::conv: {
      const auto& a = std::get<ConvAttrs>(n.attrs);
      parts.push_back("conv_fprop");
      if (has_input(n, 2)) parts.push_back("bias");
      if (a.activation) parts.push_back(activation_name(a.activation.kind));
      if (has_input(n, 3)) parts.push_back("residual");
      if (a.residual_activation) parts.push_back(activation_name(a.residual_activation.kind));
      return parts.size() > 1 ? "cuDNN graph " + join_ops(parts, "+") : "cuDNN conv_fprop";
    }
    case OpKind::batch_norm: {
      parts.push_back("batch_norm");
      if (has_input(n, 5)) parts.push_back("residual");
      if (std::get<BatchNormAttrs>(n.attrs).relu) parts.push_back("relu");
      return "own kernel " + join_ops(parts, "+");
    }
    case OpKind::gemm: {
      const auto& a = std::get<GemmAttrs>(n.attrs);
      parts.push_back("gemm");
      if (has_input(n, 2) && a.beta != 0.0) parts.push_back("bias");
      if (a.activation) parts.push_back(activation_name(a.activation.kind));
      return "cuBLASLt " + join_ops(parts, "+") +
             (a.activation ? (a.activation.kind == Activation::relu ||
                                      a.activation.kind == Activation::gelu_tanh
                                  ? " (epilogue)"
                                  : " + activation kernel")
                           : "");
    }
    case OpKind::fused_pointwise:
      return cat("generated kernel (", std::get<PointwiseProgram>(n.attrs).instrs.size(), " ops, ",
                 n.inputs.size(), " inputs)");
    case OpKind::attention:
      return "cuDNN fused attention (SDPA), else the project's attention kernel";
    default:
      return "own kernel";
  }
}

std::string fusion_summary(const Graph& g, const FusionLog& log) {
  size_t groups = 0, fused_ops = 0, unfused = 0;
  for (const Node& n : g.nodes()) {
    const FusionGroup* group = log.find(n.name);
    groups += group != nullptr;
    fused_ops += group != nullptr ? group->ops.size() : 0;
    unfused += group == nullptr;
  }
  return cat("fusion: ", groups, " groups, ", fused_ops, " fused ops, ", unfused, " unfused ops\n");
}

std::string describe_fusion(const Graph& g, const FusionLog& log) {
  std::ostringstream os;
  size_t index = 0;
  for (const Node& n : g.nodes()) {
    const FusionGroup* group = log.find(n.name);
    if (group == nullptr) continue;
    os << "group " << ++index << ": " << join_ops(group->ops, " + ") << " -> "
       << planned_lowering(g, n) << "\n";
  }
  return os.str() + fusion_summary(g, log);
}

std::string fusion_dot(const Graph& g, const FusionLog& log) {
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\\\"") : std::string(1, c);  // "\\n" breaks lines
    return q + "\"";
  };
  std::ostringstream os;
  os << "digraph " << quoted(g.name()) << " {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n";
  for (ValueId v : g.inputs())
    os << "  v" << v << " [shape=ellipse, label=" << quoted(g.value(v).name) << "];\n";
  for (const Node& n : g.nodes()) {
    const FusionGroup* group = log.find(n.name);
    std::string label = cat(op_name(n.op), "\\n", n.name);
    if (group) label = join_ops(group->ops, "\\n") + "\\n-> " + planned_lowering(g, n);
    os << "  n" << n.id << " [label=" << quoted(label)
       << (group ? ", style=filled, fillcolor=\"#cfe8ff\"" : "") << "];\n";
  }
  for (const Node& n : g.nodes()) {
    for (ValueId v : n.inputs) {
      if (v == kNoValue || g.is_constant(v)) continue;
      const NodeId p = g.value(v).producer;
      os << "  " << (p >= 0 ? cat("n", p) : cat("v", v)) << " -> n" << n.id << ";\n";
    }
  }
  for (ValueId v : g.outputs()) {
    const NodeId p = g.value(v).producer;
    os << "  out" << v << " [shape=ellipse, label=" << quoted(g.value(v).name) << "];\n  "
       << (p >= 0 ? cat("n", p) : cat("v", v)) << " -> out" << v << ";\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace fusebox
