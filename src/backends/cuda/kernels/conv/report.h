// What the convolutions did: each call's decision (path, plan, why) goes to the process's
// record (tests and benchmarks of the kernels read it) and to the report of the executable
// recording on this thread (fusebox/runtime/report.h: `fusebox run --report`); the plan
// caches' counters; the process-wide autotuning switch of `fusebox run --autotune`.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fusebox/runtime/report.h"

namespace fusebox::cuda {

using fusebox::ConvDecision;
using fusebox::ConvPlanStats;

// Adds a call to the row of (node, problem), creating it; a new decision for the same
// row replaces the old one. Both in the process's record and in the report of the
// ConvReportScope open on this thread, if any.
void record_conv_decision(const ConvDecision& decision);
std::vector<ConvDecision> conv_decisions();  // the process's record, in first-seen order
// While one lives, record_conv_decision on this thread records nothing: the calls a
// candidate's timing records (kernels/conv/conv.cpp) are not the node's.
class MutedConvDecisions {
 public:
  MutedConvDecisions();
  ~MutedConvDecisions();
  MutedConvDecisions(const MutedConvDecisions&) = delete;
  MutedConvDecisions& operator=(const MutedConvDecisions&) = delete;
};
void clear_conv_decisions();
// format_conv_report of the process's record and plan-cache counters.
std::string format_conv_report();

// Plan-cache counters since the process started (or the last reset).
ConvPlanStats conv_plan_stats();
void reset_conv_plan_stats();
// Drops every plan held in memory (the disk cache stays): the next use of a problem is
// served from disk, as in a new process. For tests and benchmarks.
void clear_conv_plan_memory_cache();

// `fusebox run --autotune`: overrides FUSEBOX_AUTOTUNE for this process (nullopt: the
// environment decides again).
void set_conv_autotune_override(std::optional<bool> autotune);

// One executable's report, filled while it records (Executable::report).
class ConvReportSink {
 public:
  void add(const ConvDecision& decision);  // as record_conv_decision
  const ExecutableReport& report() const { return report_; }

 private:
  friend class ConvReportScope;
  ExecutableReport report_;
  std::unordered_map<std::string, size_t> index_;  // node + '\n' + problem -> row
};

// While it lives, the decisions recorded on this thread also go to `sink`, and at its end
// the plan caches' counters of its span are added to the sink's. record_conv_decision takes
// no Context: the thread says which executable is recording. Scopes nest: the innermost one
// receives the decisions.
class ConvReportScope {
 public:
  explicit ConvReportScope(ConvReportSink& sink);
  ~ConvReportScope();
  ConvReportScope(const ConvReportScope&) = delete;
  ConvReportScope& operator=(const ConvReportScope&) = delete;

 private:
  ConvReportSink& sink_;
  ConvReportSink* outer_;  // the sink of the scope around this one
  ConvPlanStats at_start_;
};

}  // namespace fusebox::cuda
