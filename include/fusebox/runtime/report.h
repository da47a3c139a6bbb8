// What an executable's recordings decided on the GPU (Executable::report), for
// `fusebox run|bench --report`, tests and benchmarks: one row per convolution node and
// problem (the path, the plan, why), and the convolution plan caches' counters.
//
//   auto exe = Executable::compile(model, {.device = Device::cuda});
//   std::cout << format_conv_report(exe->report());
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusebox {

struct ConvDecision {
  std::string node;     // node label: "conv 'layer1.0.conv1'"
  std::string op;       // conv_fprop, conv_dgrad, conv_wgrad
  std::string problem;  // the problem's description (shapes, strides, dtypes, layouts)
  std::string path;     // "cudnn", "cudnn + bias kernel", "own"
  std::string plan;     // cuDNN engine name ("" for own)
  std::string reason;   // why the direct kernel ran ("" for cudnn)
  size_t workspace_bytes = 0;
  double tuned_ms = -1;  // the autotuned plan's time; < 0: not tuned in this process
  uint64_t calls = 0;    // executions recorded with this decision
};

// Plan-cache counters.
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

// What one executable's recordings decided: its compile's recording of the step, and any
// recording after it (profile(); every run when launching directly, FUSEBOX_CUDA_GRAPHS=0).
// Empty on the CPU.
struct ExecutableReport {
  // One row per (node, problem) in first-seen order; a later decision for the same row
  // replaces the earlier one, `calls` counting them all.
  std::vector<ConvDecision> convolutions;
  // The plan caches' counters over those recordings (the caches are the process's: lookups
  // of other threads at the same time count too).
  ConvPlanStats plan_cache;
};

// The convolution rows as a fixed-width table with a summary line; "" when no convolution ran.
std::string format_conv_report(const ExecutableReport& report);

}  // namespace fusebox
