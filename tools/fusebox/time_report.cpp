// The time part of `fusebox run|bench --report`: where a step's device time goes, from
// Executable::profile (each node timed on its own, in the step's order). The slowest
// nodes with what ran (a convolution's path and cuDNN plan or our kernel's tile, a
// generated kernel), then the time by op kind, then the sum beside the step's own time.
#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

#include "common.h"
#include "fusebox/ir/op_info.h"
#include "fusebox/runtime/report.h"

namespace fusebox::cli {

namespace {

// What ran for node `n`: the convolution's recorded decision, else the kind of kernel.
std::string what_ran(const Node& n, const std::vector<ConvDecision>& decisions, Device device) {
  if (device != Device::cuda) return "";
  if (n.op == OpKind::fused_pointwise) return "generated kernel";
  if (n.op == OpKind::attention) return "fused attention";
  const char* op = n.op == OpKind::conv                   ? "conv_fprop"
                   : n.op == OpKind::conv_backward_data   ? "conv_dgrad"
                   : n.op == OpKind::conv_backward_filter ? "conv_wgrad"
                                                          : nullptr;
  if (op == nullptr) return "";
  for (const ConvDecision& d : decisions) {
    if (d.node != node_label(n) || d.op != op) continue;
    return d.plan.empty() ? d.path : d.path + ", " + d.plan;
  }
  return "not recorded";
}

}  // namespace

TimeReport time_report(const Graph& g, const std::vector<NodeTime>& times, Device device,
                       const std::vector<ConvDecision>& decisions) {
  TimeReport r;
  // profile() times the nodes in the graph's order.
  FUSEBOX_CHECK(times.size() == g.nodes().size(), "--report", "the profile has ", times.size(),
                " nodes, the graph ", g.nodes().size());
  for (size_t i = 0; i < times.size(); ++i) {
    r.total_ms += times[i].ms;
    r.rows.push_back({times[i].node, op_info(times[i].op).name, times[i].ms,
                      what_ran(g.nodes()[i], decisions, device)});
  }
  return r;
}

std::string format_time_report(const TimeReport& r, double step_ms, size_t top) {
  std::ostringstream os;
  if (r.rows.empty()) return "no node was timed\n";
  std::vector<const TimeRow*> order;
  for (const TimeRow& row : r.rows) order.push_back(&row);
  std::stable_sort(order.begin(), order.end(),
                   [](const TimeRow* a, const TimeRow* b) { return a->ms > b->ms; });
  const auto share = [&](double ms) { return r.total_ms > 0 ? 100 * ms / r.total_ms : 0.0; };
  os << "time by node (each timed on its own; the " << std::min(top, order.size()) << " slowest of "
     << order.size() << "):\n";
  os << "        ms      %  op                  node  [what ran]\n";
  for (size_t i = 0; i < order.size() && i < top; ++i) {
    const TimeRow& row = *order[i];
    std::string op = row.op;
    op.resize(std::max<size_t>(op.size(), 18), ' ');
    os << std::setw(10) << fixed(row.ms, 4) << std::setw(7) << fixed(share(row.ms), 1) << "  " << op
       << "  " << row.node << (row.ran.empty() ? "" : "  [" + row.ran + "]") << "\n";
  }
  std::map<std::string, std::pair<size_t, double>> by_op;
  for (const TimeRow& row : r.rows) {
    by_op[row.op].first += 1;
    by_op[row.op].second += row.ms;
  }
  std::vector<std::pair<std::string, std::pair<size_t, double>>> ops(by_op.begin(), by_op.end());
  std::stable_sort(ops.begin(), ops.end(),
                   [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  os << "time by op:\n";
  for (const auto& [op, v] : ops) {
    std::string name = op;
    name.resize(std::max<size_t>(name.size(), 18), ' ');
    os << "  " << name << std::setw(5) << v.first << " nodes " << std::setw(9) << fixed(v.second, 3)
       << " ms " << std::setw(5) << fixed(share(v.second), 1) << "%\n";
  }
  os << "sum of node times " << fixed(r.total_ms, 3) << " ms";
  if (step_ms > 0)
    os << " (the step itself: " << fixed(step_ms, 3)
       << " ms; independent nodes overlap in a step, copies of inputs and outputs are not in "
          "the sum)";
  os << "\n";
  return os.str();
}

Json time_report_json(const TimeReport& r) {
  Json rows = Json::array();
  for (const TimeRow& row : r.rows)
    rows.push(Json::object({{"node", row.node}, {"op", row.op}, {"ms", row.ms}, {"ran", row.ran}}));
  return Json::object({{"sum_ms", r.total_ms}, {"nodes", std::move(rows)}});
}

}  // namespace fusebox::cli
