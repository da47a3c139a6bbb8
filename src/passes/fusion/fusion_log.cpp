// The record of the fusion passes and its reports (passes/fusion.h): the FusionLog, the
// InferenceFusionOptions of FUSEBOX_FUSION, describe_fusion and fusion_dot.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

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
  InferenceFusionOptions options;
  if (text != nullptr && !std::string(text).empty() && std::string(text) != "1") {
    FUSEBOX_CHECK(std::string(text) == "0", "settings", "FUSEBOX_FUSION='", text,
                  "' must be 1 (the inference fusions, default) or 0 (none)");
    options = none();
  }
  const char* stats = std::getenv("FUSEBOX_CONV_NORM_STATISTICS");
  if (stats != nullptr && !std::string(stats).empty()) {
    FUSEBOX_CHECK(std::string(stats) == "0" || std::string(stats) == "1", "settings",
                  "FUSEBOX_CONV_NORM_STATISTICS='", stats,
                  "' must be 1 (batch-norm statistics from 1x1 convolutions in GPU training "
                  "steps) or 0 (the norms' own pass, the default)");
    options.norm_statistics = std::string(stats) == "1";
  }
  return options;
}

namespace {

std::string join_ops(const std::vector<std::string>& ops, const char* sep) {
  std::string s;
  for (const std::string& op : ops) s += (s.empty() ? "" : sep) + op;
  return s;
}

}  // namespace

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

std::string describe_fusion(const Graph& g, const FusionLog& log,
                            const LoweringDescriber& lowering) {
  std::ostringstream os;
  size_t index = 0;
  for (const Node& n : g.nodes()) {
    const FusionGroup* group = log.find(n.name);
    if (group == nullptr) continue;
    os << "group " << ++index << ": " << join_ops(group->ops, " + ") << " -> " << lowering(n)
       << "\n";
  }
  return os.str() + fusion_summary(g, log);
}

std::string fusion_dot(const Graph& g, const FusionLog& log, const LoweringDescriber& lowering) {
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
    if (group) label = join_ops(group->ops, "\\n") + "\\n-> " + lowering(n);
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
