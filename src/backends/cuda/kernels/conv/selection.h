// Autotuning between cuDNN and the project's convolution kernels (kernels/conv/conv.cpp).
//
// Under FUSEBOX_AUTOTUNE (FUSEBOX_CONV_BACKEND unset), a problem both can run is decided once:
// our kernel (the implicit GEMM, or the depthwise kernels) is recorded on a scratch encoder
// and timed as a graph replay on the device stream; cuDNN's candidates are timed by its own
// autotuning (cudnn/conv_graph.cpp), and its best plan is recorded only when it beats ours
// (cudnn_conv_record's `beat_ms`). The winner and both times are kept in memory and on disk
// (DiskPlanCache, subdirectory "conv-select" of the cache directory), so a later process
// replays the decision without timing either side again.
//
// The comparison: ours with everything it records (layout copies, im2col, split sums, its
// fused epilogue) against cuDNN's plan alone (a part of the epilogue its graph did not fuse
// runs as one more kernel, not timed): a close call goes to cuDNN.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "backends/cuda/kernels/conv/problem.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda {

struct ConvSelection {
  bool own = false;        // our kernel won
  double own_ms = -1;      // its time
  double cudnn_ms = -1;    // cuDNN's autotuned best (-1: cuDNN had no plan that ran)
  std::string own_plan;    // our plan's description
  std::string cudnn_plan;  // cuDNN's engine
  // "autotuned: own 0.0299 ms (cutlass128x128...) < cuDNN 0.0402 ms (eng0...)"
  std::string describe() const;
};

// The decision stored for the problem (memory, else disk), or nullopt.
std::optional<ConvSelection> find_conv_selection(const ConvProblem& p);
void store_conv_selection(const ConvProblem& p, const ConvSelection& s);
// Forgets the in-memory decisions (tests).
void clear_conv_selections();

// Times `record` (which records our kernel for the node on the context it is given and
// returns its plan) as a replayed graph of 8 calls: the mean of enough replays for ~2 ms,
// after one warm-up, per call. nullopt when the encoder launches directly (FUSEBOX_CUDA_GRAPHS=0: there is no
// graph to replay). `plan` receives the description.
std::optional<double> time_own_conv(Context& ctx,
                                    const std::function<std::string(Context&)>& record,
                                    std::string& plan);

}  // namespace fusebox::cuda
