// The CUDA half of run_graph (see include/fusebox/runtime/executor.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusebox/runtime/executor.h"

namespace fusebox {

// Runs `g` on GPU 0; `feeds` were checked by check_feeds. A graph run again (the same
// contents, see cuda_executor.cpp) replays its compiled step instead of recording it anew.
NamedTensors run_graph_cuda(const Graph& g, const NamedTensors& feeds, const RunOptions& opts);

// The compiled steps the CUDA executor keeps (at most FUSEBOX_CUDA_STEP_CACHE, default 4;
// 0 keeps none and records every run).
struct CudaStepCacheStats {
  uint64_t hits = 0;         // runs that replayed a compiled step
  uint64_t misses = 0;       // runs that recorded (and compiled, when they could)
  uint64_t compiled = 0;     // steps compiled and kept
  uint64_t uncacheable = 0;  // runs whose recording cannot be replayed (see cuda_executor.cpp)
  uint64_t evictions = 0;
  size_t size = 0;
  size_t capacity = 0;
};
CudaStepCacheStats cuda_step_cache_stats();
// Drops every compiled step: their device memory returns to the allocator once their last
// launch has completed. The statistics stay.
void release_cuda_step_cache();

// Whether a run of `b` may replay the step compiled from `a`: every value, node (with its
// attributes), input and output the same, and the same constant tensors (by identity).
// Needs no GPU.
bool same_graph(const Graph& a, const Graph& b);

// Shared by both executors (executor.cpp).
// How many nodes read each value; graph outputs count as never released.
std::vector<int> count_reads(const Graph& g);
// Every input fed with the declared dtype and shape, nothing else fed; else an Error.
void check_feeds(const Graph& g, const NamedTensors& feeds, const std::string& where);

}  // namespace fusebox
