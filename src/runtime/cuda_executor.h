// The CUDA half of run_graph (see include/fusebox/runtime/executor.h).
#pragma once

#include "fusebox/runtime/executor.h"

namespace fusebox {

// Runs `g` on GPU 0; `feeds` were checked by check_feeds.
NamedTensors run_graph_cuda(const Graph& g, const NamedTensors& feeds, const RunOptions& opts);

// Shared by both executors (executor.cpp).
// How many nodes read each value; graph outputs count as never released.
std::vector<int> count_reads(const Graph& g);
// Every input fed with the declared dtype and shape, nothing else fed; else an Error.
void check_feeds(const Graph& g, const NamedTensors& feeds, const std::string& where);

}  // namespace fusebox
