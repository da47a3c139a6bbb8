// What the convolutions of this process did, for `fusebox run --report`, tests and
// benchmarks: one row per convolution node and problem (path, plan, why), the plan caches'
// counters, and the process-wide autotuning switch of `fusebox run --autotune`.
//
// Only standard and public headers here: the CLI includes this file without the backend's
// include path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fusebox::cuda {

struct ConvDecision {
  std::string node;     // node label: "conv 'layer1.0.conv1'"
  std::string op;       // conv_fprop, conv_dgrad, conv_wgrad
  std::string problem;  // ConvProblem::describe()
  std::string path;     // "cudnn", "cudnn + bias kernel", "own"
  std::string plan;     // cuDNN engine name ("" for own)
  std::string reason;   // why the direct kernel ran ("" for cudnn)
  size_t workspace_bytes = 0;
  double tuned_ms = -1;  // the autotuned plan's time; < 0: not tuned in this process
  uint64_t calls = 0;    // executions recorded with this decision
};

// Adds a call to the row of (node, problem), creating it; a new decision for the same
// row replaces the old one.
void record_conv_decision(const ConvDecision& decision);
std::vector<ConvDecision> conv_decisions();  // in first-seen order
void clear_conv_decisions();
// The rows as a fixed-width table with a summary line; "" when no convolution ran.
std::string format_conv_report();

// Plan-cache counters since the process started (or the last reset).
struct ConvPlanStats {
  uint64_t problems = 0;            // distinct problems looked up (memory misses)
  uint64_t memory_hits = 0;         // served by the in-memory plan cache
  uint64_t heuristics_queries = 0;  // cuDNN heuristics queries (create_execution_plans)
  uint64_t plans_built = 0;         // graphs built from heuristics (not from disk)
  uint64_t autotune_runs = 0;       // problems autotuned
  uint64_t disk_hits = 0;           // plans or refusals loaded from the disk cache
  uint64_t disk_misses = 0;
  uint64_t disk_writes = 0;
  uint64_t disk_rejects = 0;        // entries found but unusable (deserialize failed); rebuilt
  uint64_t refusals = 0;            // problems cuDNN had no plan for
  uint64_t native_graph_nodes = 0;  // executions added through cuDNN's CUDA-graph API
  uint64_t captured_calls = 0;      // executions recorded by stream capture
};
ConvPlanStats conv_plan_stats();
void reset_conv_plan_stats();
// Drops every plan held in memory (the disk cache stays): the next use of a problem is
// served from disk, as in a new process. For tests and benchmarks.
void clear_conv_plan_memory_cache();

// `fusebox run --autotune`: overrides FUSEBOX_AUTOTUNE for this process (nullopt: the
// environment decides again).
void set_conv_autotune_override(std::optional<bool> autotune);

}  // namespace fusebox::cuda
