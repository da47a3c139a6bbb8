// Autotuning's cache (kernels/conv/engines.cpp decides): which engine won a problem.
//
// Under FUSEBOX_AUTOTUNE (FUSEBOX_CONV_BACKEND and FUSEBOX_CONV_ENGINE unset), a problem cuDNN
// can run is decided once: every other engine that takes it (but the direct kernel, the
// oracle), in its fused form and, where it cannot fuse the node's epilogue, its unfused form
// (the engine, then the epilogue kernel), is recorded on a scratch encoder and timed as a graph
// replay on the device stream (time_own_conv); cuDNN's candidates are timed by its own
// autotuning (cudnn/conv_graph.cpp), and its best plan is recorded only when it beats the
// fastest of ours (cudnn_conv_record's `beat_ms`). The winner and both times are kept in memory
// and on disk (DiskPlanCache, subdirectory "conv-select" of the cache directory), so a later
// process replays the decision without timing again.
//
// The comparison: ours with everything it records (layout copies, im2col, split sums, its
// fused epilogue or the epilogue kernel) against cuDNN's plan alone (a part of the epilogue its
// graph did not fuse runs as one more kernel, not timed): a close call goes to cuDNN.
#pragma once

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/kernels/conv/problem.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda {

struct ConvSelection {
  bool own = false;        // our engine won
  double own_ms = -1;      // its time
  double cudnn_ms = -1;    // cuDNN's autotuned best (-1: cuDNN had no plan that ran)
  std::string own_plan;    // our plan's description
  std::string cudnn_plan;  // cuDNN's engine
  // Our fastest engine (engines.h) and its form. Empty in decisions stored before engines had
  // names (payload version 1): "the project's kernel" then meant the default policy's first
  // engine but cuDNN's, which replays them.
  std::string own_engine;
  bool own_unfused = false;  // the engine without the epilogue, then the epilogue kernel
  // "autotuned: cutlass 0.0299 ms (cutlass128x128...) < cuDNN 0.0402 ms (eng0...)"
  std::string describe() const;
};

// A decision's disk payload (selection.cpp describes it), and reading one: nullopt with `why`
// where the bytes are not a payload this build reads (another version included).
std::string encode_conv_selection(const ConvSelection& s);
std::optional<ConvSelection> decode_conv_selection(const std::vector<uint8_t>& bytes,
                                                   std::string& why);

// The decision stored for the problem (memory, else disk), or nullopt.
std::optional<ConvSelection> find_conv_selection(const ConvProblem& p);
void store_conv_selection(const ConvProblem& p, const ConvSelection& s);
// Forgets the in-memory decisions (tests).
void clear_conv_selections();

// Times `record` (which records our kernel for the node on the context it is given and
// returns its plan) as a replayed graph of 8 calls: the mean of enough replays for ~2 ms,
// after one warm-up, per call; where the warm-up's calls took over twice `bound_ms` each
// (the fastest engine so far), their mean: that engine cannot win. nullopt when the encoder
// launches directly (FUSEBOX_CUDA_GRAPHS=0: there is no graph to replay). `plan` receives the
// description.
std::optional<double> time_own_conv(Context& ctx,
                                    const std::function<std::string(Context&)>& record,
                                    std::string& plan,
                                    double bound_ms = std::numeric_limits<double>::infinity());

}  // namespace fusebox::cuda
