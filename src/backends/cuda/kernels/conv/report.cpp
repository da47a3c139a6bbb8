#include "backends/cuda/kernels/conv/report.h"

#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "fusebox/core/memory.h"

namespace fusebox::cuda {

namespace {

struct DecisionLog {
  std::mutex mutex;
  std::vector<ConvDecision> rows;
  std::unordered_map<std::string, size_t> index;  // node + '\n' + problem -> row
};

DecisionLog& decision_log() {
  static DecisionLog* log = new DecisionLog;  // never destroyed: used until exit
  return *log;
}

std::string fit(const std::string& text, size_t width) {
  if (text.size() <= width) return text + std::string(width - text.size(), ' ');
  return text.substr(0, width - 3) + "...";
}

}  // namespace

void record_conv_decision(const ConvDecision& decision) {
  DecisionLog& log = decision_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  const auto [it, fresh] =
      log.index.emplace(decision.node + '\n' + decision.problem, log.rows.size());
  if (!fresh) {
    ConvDecision& row = log.rows[it->second];
    const uint64_t calls = row.calls;
    const double tuned = row.tuned_ms;
    row = decision;
    row.calls = calls + 1;
    if (row.tuned_ms < 0) row.tuned_ms = tuned;
    return;
  }
  log.rows.push_back(decision);
  log.rows.back().calls = 1;
}

std::vector<ConvDecision> conv_decisions() {
  DecisionLog& log = decision_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  return log.rows;
}

void clear_conv_decisions() {
  DecisionLog& log = decision_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.rows.clear();
  log.index.clear();
}

std::string format_conv_report() {
  const std::vector<ConvDecision> rows = conv_decisions();
  if (rows.empty()) return "";
  std::string out = "convolutions (path, plan, why):\n";
  out += fit("node", 32) + " " + fit("op", 10) + " " + fit("path", 20) + " " + fit("plan", 34) +
         " " + fit("workspace", 10) + " " + fit("tuned ms", 9) + " problem / reason\n";
  size_t on_cudnn = 0;
  for (const ConvDecision& r : rows) {
    on_cudnn += r.path.rfind("cudnn", 0) == 0;
    char tuned[32] = "-";
    if (r.tuned_ms >= 0) std::snprintf(tuned, sizeof tuned, "%.4f", r.tuned_ms);
    out += fit(r.node, 32) + " " + fit(r.op, 10) + " " + fit(r.path, 20) + " " +
           fit(r.plan.empty() ? "-" : r.plan, 34) + " " +
           fit(r.workspace_bytes ? format_bytes(r.workspace_bytes) : "0", 10) + " " +
           fit(tuned, 9) + " " + r.problem;
    if (!r.reason.empty()) out += "  [" + r.reason + "]";
    out += "\n";
  }
  const ConvPlanStats s = conv_plan_stats();
  char summary[320];
  std::snprintf(summary, sizeof summary,
                "%zu convolution rows: %zu on cuDNN, %zu on the direct kernel; plan cache: "
                "%llu memory hits, %llu heuristics queries, %llu autotuned, %llu disk hits, "
                "%llu disk writes\n",
                rows.size(), on_cudnn, rows.size() - on_cudnn, (unsigned long long)s.memory_hits,
                (unsigned long long)s.heuristics_queries, (unsigned long long)s.autotune_runs,
                (unsigned long long)s.disk_hits, (unsigned long long)s.disk_writes);
  return out + summary;
}

}  // namespace fusebox::cuda
