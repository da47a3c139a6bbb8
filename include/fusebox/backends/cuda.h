// The CUDA backend's answers about a graph that tools and reports ask for without running
// it. (Running a graph on CUDA goes through Executable::compile, runtime/executable.h.)
#pragma once

#include <string>

#include "fusebox/ir/graph.h"

namespace fusebox::cuda {

// What the backend will run a node of a prepared graph on, in words: the "planned" lowering
// of the fusion reports (`fusebox inspect --fusion`, `run|bench --report`): "cuDNN graph
// conv_fprop+bias+relu", "own kernel batch_norm+relu", "cuBLASLt gemm+bias+relu (epilogue)",
// "generated kernel (5 ops, 3 inputs)", "own kernel". The backend owns the answer because it
// owns the choice (dispatch.cpp and the kernels it calls); the passes only form the nodes.
std::string describe_lowering(const Node& n);

}  // namespace fusebox::cuda
