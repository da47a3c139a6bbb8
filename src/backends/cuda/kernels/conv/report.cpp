#include "backends/cuda/kernels/conv/report.h"

#include <cstdio>
#include <mutex>

#include "fusebox/core/memory.h"

namespace fusebox {

namespace {

std::string fit(const std::string& text, size_t width) {
  if (text.size() <= width) return text + std::string(width - text.size(), ' ');
  return text.substr(0, width - 3) + "...";
}

}  // namespace

std::string format_conv_report(const ExecutableReport& report) {
  const std::vector<ConvDecision>& rows = report.convolutions;
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
  const ConvPlanStats& s = report.plan_cache;
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

namespace cuda {

namespace {

// The process's record.
struct DecisionLog {
  std::mutex mutex;
  ConvReportSink rows;
};

DecisionLog& decision_log() {
  static DecisionLog* log = new DecisionLog;  // never destroyed: used until exit
  return *log;
}

// The sink of the innermost ConvReportScope open on this thread.
thread_local ConvReportSink* t_sink = nullptr;

// Every counter of ConvPlanStats, for the scopes' differences.
constexpr uint64_t ConvPlanStats::*kPlanCounters[] = {
    &ConvPlanStats::problems,           &ConvPlanStats::memory_hits,
    &ConvPlanStats::heuristics_queries, &ConvPlanStats::plans_built,
    &ConvPlanStats::autotune_runs,      &ConvPlanStats::disk_hits,
    &ConvPlanStats::disk_misses,        &ConvPlanStats::disk_writes,
    &ConvPlanStats::disk_rejects,       &ConvPlanStats::refusals,
    &ConvPlanStats::native_graph_nodes, &ConvPlanStats::captured_calls};
static_assert(sizeof(kPlanCounters) / sizeof(kPlanCounters[0]) * sizeof(uint64_t) ==
                  sizeof(ConvPlanStats),
              "a ConvPlanStats counter is missing from kPlanCounters");

}  // namespace

void ConvReportSink::add(const ConvDecision& decision) {
  std::vector<ConvDecision>& rows = report_.convolutions;
  const auto [it, fresh] = index_.emplace(decision.node + '\n' + decision.problem, rows.size());
  if (!fresh) {
    ConvDecision& row = rows[it->second];
    const uint64_t calls = row.calls;
    const double tuned = row.tuned_ms;
    row = decision;
    row.calls = calls + 1;
    if (row.tuned_ms < 0) row.tuned_ms = tuned;
    return;
  }
  rows.push_back(decision);
  rows.back().calls = 1;
}

ConvReportScope::ConvReportScope(ConvReportSink& sink)
    : sink_(sink), outer_(t_sink), at_start_(conv_plan_stats()) {
  t_sink = &sink_;
}

ConvReportScope::~ConvReportScope() {
  const ConvPlanStats now = conv_plan_stats();
  // A counter below its start was reset (reset_conv_plan_stats) meanwhile: it counts since then.
  for (uint64_t ConvPlanStats::*counter : kPlanCounters) {
    const uint64_t start = now.*counter >= at_start_.*counter ? at_start_.*counter : 0;
    sink_.report_.plan_cache.*counter += now.*counter - start;
  }
  t_sink = outer_;
}

namespace {
thread_local int t_muted = 0;  // MutedConvDecisions alive on this thread
}  // namespace

MutedConvDecisions::MutedConvDecisions() {
  ++t_muted;
}
MutedConvDecisions::~MutedConvDecisions() {
  --t_muted;
}

void record_conv_decision(const ConvDecision& decision) {
  if (t_muted > 0) return;
  DecisionLog& log = decision_log();
  {
    std::lock_guard<std::mutex> lock(log.mutex);
    log.rows.add(decision);
  }
  if (t_sink) t_sink->add(decision);
}

std::vector<ConvDecision> conv_decisions() {
  DecisionLog& log = decision_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  return log.rows.report().convolutions;
}

void clear_conv_decisions() {
  DecisionLog& log = decision_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.rows = ConvReportSink{};
}

std::string format_conv_report() {
  return fusebox::format_conv_report({conv_decisions(), conv_plan_stats()});
}

}  // namespace cuda

}  // namespace fusebox
