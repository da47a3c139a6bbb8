// Convolutions through cuDNN's graph API (cudnn-frontend v1), behind a fusebox-typed
// interface: no cuDNN type appears here. cudnn/plans.cpp implements it (caches, lowering
// choice, recording) on top of cudnn/plan.h, which cudnn/conv_graph.cpp implements: the one
// translation unit that includes cudnn_frontend.h.
//
//   ConvProblem p = make_conv_problem(node, inputs, output, settings, device);
//   CudnnConvOutcome r = cudnn_conv_record(ctx, p, {x, w, y, bias, residual}, settings);
//   if (!r.ran) ... the next engine (kernels/conv/engines.cpp); r.reason says why (cuDNN's message)
//   if (r.ran) ... conv_epilogue runs what r.fused leaves (its bias, its epilogue)
//
// Plans. The problem's key (conv_problem_key) finds the plan in an in-memory LRU
// (FUSEBOX_CONV_PLAN_CACHE entries), else in the disk cache (DiskPlanCache, subdir "conv"
// of FUSEBOX_CACHE_DIR or the user's cache dir: the serialized cudnn-frontend graph), else
// it is built: heuristics mode A then FALLBACK, numerical notes filtered (never
// DOWN_CONVERT_INPUTS; no TENSOR_CORE for f32 when FUSEBOX_ALLOW_TF32=0; no
// NONDETERMINISTIC when FUSEBOX_DETERMINISTIC=1), then the heuristics' first plan that
// builds, or with autotuning the distinct candidates of modes A, FALLBACK and B timed on
// the real tensors and the fastest kept. A refusal (no plan supports the graph) is cached
// the same way, so the fallback decision costs one look-up the next time.
//
// Lowerings. A strided 1x1 fprop may also run as a stride-1 1x1 over a strided view of x
// (ConvLowering, FUSEBOX_CONV_SUBSAMPLE_1X1): each lowering has its own key and entries;
// the outcome names the one that ran.
//
// Execution. The plan's workspace comes from ctx.allocator before the recording and is
// held as a temporary. Where the plan supports cuDNN's native CUDA-graph API (and the
// encoder records graphs: not FUSEBOX_CUDA_GRAPHS=0), cuDNN populates a graph that the
// encoder adds (add_child_graph); else the execute call is recorded by stream capture
// (capture_library_call). A freshly built plan runs once on the stream first (kernels
// loaded outside any capture; a plan that cannot run is found before the recording).
//
// Autotuning runs its timing directly on the encoder's stream, outside any capture,
// while recording (before the node is added): it reads the inputs' current bytes (their
// producers may not have run yet: only the timing matters) and writes the output and its
// own workspaces, which no earlier recorded work can be reading (a fresh output).
#pragma once

#include <optional>
#include <string>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "backends/cuda/runtime/plan_cache.h"
#include "backends/cuda/runtime/settings.h"

namespace fusebox::cuda {

// The tensors of a problem in its roles (see kernels/conv/problem.h): x/w/y, bias and the
// epilogue's residual or nullptr.
struct ConvOperands {
  const DeviceTensor* x = nullptr;
  const DeviceTensor* w = nullptr;
  const DeviceTensor* y = nullptr;
  const DeviceTensor* bias = nullptr;
  const DeviceTensor* residual = nullptr;
};

struct CudnnConvOutcome {
  bool ran = false;                     // the convolution is recorded on ctx.encoder
  ConvFusion fused = ConvFusion::none;  // ... with this much of its epilogue in the graph
  bool first_use = false;               // this process had not seen the problem before
  std::string plan;                     // the engine's name
  ConvLowering lowering = ConvLowering::standard;  // how the problem was given to cuDNN
  std::string reason;  // why not (ran == false): cuDNN's message; when it ran less fused than
                       // the problem asked, why the more fused graphs were refused
  size_t workspace_bytes = 0;
  double tuned_ms = -1;  // the chosen plan's autotuned time (-1: not tuned)
  bool slower = false;   // not recorded: its tuned time was above beat_ms
};

// beat_ms (autotuning, kernels/conv/selection.h): the time of the project's fastest engine for
// the problem; the tuned plan is recorded only when it is at most that fast, else the outcome
// has ran == false, slower == true and the plan's name and time.
CudnnConvOutcome cudnn_conv_record(Context& ctx, const ConvProblem& p, const ConvOperands& t,
                                   const ConvSettings& settings,
                                   std::optional<double> beat_ms = std::nullopt);

// The version string of the cudnn-frontend headers compiled in ("1.23.0").
std::string cudnn_frontend_version();

// What a disk cache of decisions about cuDNN's plans is valid for: the device's name and
// compute capability, cuDNN's and cudnn-frontend's versions.
PlanCacheIdentity cudnn_cache_identity(int device);

}  // namespace fusebox::cuda
