// The seam between the convolution plan caches (cudnn/plans.cpp: memory and disk caches,
// the lowering choice, recording) and cuDNN itself (cudnn/conv_graph.cpp, the one translation
// unit that includes cudnn_frontend.h, ~30 s to compile). A built plan is an opaque
// CudnnGraph here: a cudnn-frontend graph with its chosen engine config.
//
// Tensor uids are fixed, so that a plan read back from disk takes the same variant pack:
// x = 1, w = 2, y = 3, bias = 4, residual = 5 (roles as in kernels/conv/problem.h), whatever
// the op.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cudnn/conv.h"

namespace fusebox::cuda {

constexpr int64_t kCudnnUidX = 1, kCudnnUidW = 2, kCudnnUidY = 3, kCudnnUidBias = 4,
                  kCudnnUidResidual = 5;

struct CudnnGraph;  // defined in cudnn/conv_graph.cpp
using VariantPack = std::unordered_map<int64_t, void*>;

// A problem's cached outcome: a built plan or the reason cuDNN cannot run it.
struct PlanEntry {
  std::shared_ptr<CudnnGraph> graph;    // null: refused
  std::string reason;                   // why refused; for a plan, why it is not more fused
  std::string plan_name;                // the engine config's name ("eng62_k2=0_...")
  ConvFusion fused = ConvFusion::none;  // the graph's share of the epilogue
  bool native_graph = false;            // SUPPORTS_CUDA_GRAPH_NATIVE_API (and the check agrees)
  bool native_checked = false;          // native population compared with a capture once
  bool warmed_up = false;               // has run once outside a capture
  int64_t workspace = 0;
  double tuned_ms = -1;
};
using EntryPtr = std::shared_ptr<PlanEntry>;

// A refusal from cuDNN (the graph is unsupported, no plan builds or runs): worth caching.
struct CudnnRefused : std::exception {
  explicit CudnnRefused(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string message;
};

// `text` on one line (newlines to spaces, trailing blanks dropped).
std::string one_line(std::string text);

// The variant pack of the problem's tensors in a graph with `fused` of the epilogue, by uid.
VariantPack variant_pack(const ConvOperands& t, ConvFusion fused);

// Builds the plan of one graph variant (`fused`: how much of the epilogue): heuristics,
// numerical notes filtered, then the heuristics' first buildable plan or, with
// settings.autotune, the fastest candidate timed on `t` (one progress line on stderr);
// `beat_ms`: the project's kernel's time, which a candidate must come near to be timed in full.
// Throws CudnnRefused; a CUDA failure is a fusebox::Error.
EntryPtr build_cudnn_plan(Context& ctx, const ConvProblem& p, const ConvOperands& t,
                          ConvFusion fused, const ConvSettings& settings, ConvPlanStats& stats,
                          std::optional<double> beat_ms);

// The graph's serialized bytes (cudnn-frontend's Graph::serialize); false when it cannot
// be serialized. Never throws.
bool serialize_cudnn_plan(CudnnGraph& g, std::vector<uint8_t>& blob);
// The graph of serialized bytes, its workspace size and native-graph support; nullptr
// with `why` set when the bytes do not deserialize. Never throws.
std::shared_ptr<CudnnGraph> deserialize_cudnn_plan(cudnnHandle_t handle,
                                                   const std::vector<uint8_t>& blob,
                                                   int64_t& workspace, bool& native_graph,
                                                   std::string& why);

// Runs the plan on the handle's stream. Throws CudnnRefused when cuDNN reports a failure.
void execute_cudnn_plan(CudnnGraph& g, cudnnHandle_t handle, VariantPack& pack, void* workspace);
// Lets cuDNN populate `graph` with the plan's work (its native CUDA-graph API).
bool populate_cudnn_graph(CudnnGraph& g, cudnnHandle_t handle, VariantPack& pack, void* workspace,
                          cudaGraph_t graph);

}  // namespace fusebox::cuda
