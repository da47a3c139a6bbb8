// The CUDA backend's public entry points besides the executable: the answers about a graph that
// tools and reports ask for without running it, and the NCCL world of a data-parallel run.
// (Running a graph on CUDA goes through Executable::compile, runtime/executable.h.)
#pragma once

#include <memory>
#include <string>

#include "fusebox/core/communicator.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {

// What the backend will run a node of a prepared graph on, in words: the "planned" lowering
// of the fusion reports (`fusebox inspect --fusion`, `run|bench --report`): "cuDNN graph
// conv_fprop+bias+relu", "own kernel batch_norm+relu", "cuBLASLt gemm+bias+relu (epilogue)",
// "generated kernel (5 ops, 3 inputs)", "own kernel". The backend owns the answer because it
// owns the choice (dispatch.cpp and the kernels it calls); the passes only form the nodes.
std::string describe_lowering(const Node& n);

// The f32 math of the backend's convolutions and matmuls: TF32 tensor cores allowed or not.
// Sets FUSEBOX_ALLOW_TF32 and FUSEBOX_ALLOW_TF32_MATMUL (docs/settings.md) in this process's
// environment, over a value the user set, so that the settings, read again at the next use,
// and child processes agree; `--precision` (CLI) and fusebox.compile (Python) call it.
void set_tf32(bool allowed);

// GPU `device`'s name as the driver gives it ("NVIDIA H200"); an Error without that device.
std::string device_name(int device = 0);

}  // namespace fusebox::cuda

namespace fusebox::dist {

// NCCL (CUDA backend): a new unique id (made by rank 0, shared through the store), and the
// communicator of `rank` on `device` (this process's GPU: runtime's use_cuda_device) made
// from it. Errors name the rank (NCCL not loadable, another version, a refusal).
std::string nccl_unique_id();
std::shared_ptr<Communicator> nccl_communicator(const std::string& unique_id, int rank,
                                                int world_size, int device);

}  // namespace fusebox::dist
