// The adapter protocol of the convolution engines (CUTLASS 3 style): every way the backend can
// run a convolution (cuDNN, the CUTLASS Hopper kernels and their lowerings, the project's own
// kernels) is one ConvEngine under kernels/conv/engines/<name>/, and kernels/conv/engines.cpp
// holds the ordered list and the default policy over them.
//
//   const ConvEngine& e = find_conv_engine("implicit_gemm");       // engines.h
//   if (auto why = e.cannot_implement(call)) ... another engine    // host checks only
//   ConvEnginePlan plan = e.plan(call);
//   ConvRecorded r = e.record(ctx, call, plan);   // r.ran == false: it declined while recording
//   conv_epilogue(...) for what r.fused leaves of the node's epilogue (kernels/conv/conv.cpp)
//
// cannot_implement is exact: an engine that accepts a call records it, except where a library
// refuses only when asked (cuDNN building no plan, CUTLASS's own can_implement): then record
// returns ran == false and the policy goes on down the list (a forced engine: an Error).
// The kernel-level plans (each engine's plan.h, tested on the CPU) are made inside record:
// they depend on the layout copies made there (a copy's alignment, the staged output).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "backends/cuda/runtime/settings.h"

namespace fusebox::cuda {

// What the engines' refusals and plans need of the device.
struct ConvDeviceFacts {
  int compute_capability = 0;  // 90: the sm_90a kernels run
  int sm_count = 0;
};

// One convolution as every engine gets it (CUTLASS 3's Arguments): the problem in its two
// views, the node's tensors, the part of the node's epilogue asked of the engine, the device.
struct ConvCall {
  const Node* node = nullptr;
  const ConvProblem* problem = nullptr;  // cuDNN's view: dtypes, strides, alignment, cache key
  ConvGeometry geometry;                 // the kernels' view (conv_geometry_of)
  Inputs in;                             // the node's inputs as the kernels.h entry gets them
  Outputs out;                           // out[0]: the result
  // What the engine computes after the convolution: the node's whole epilogue (the fused
  // form: bias, activation, residual, residual activation; a dgrad's bias), or nothing (the
  // unfused form: kernels/conv/conv.cpp's epilogue kernel runs it after).
  ConvEpilogueOperands epilogue;
  ConvDeviceFacts device;
  const ConvSettings* settings = nullptr;
  std::string variant;            // FUSEBOX_CONV_ENGINE's variant; "": the engine's own choice
  std::optional<double> beat_ms;  // autotuning: a self-tuning engine (cuDNN) records only a
                                  // plan at most this fast

  ConvOp op() const { return problem->op; }
  DType dtype() const { return out[0].dtype; }
  const std::string& label() const { return problem->label; }
  bool has_epilogue() const;  // epilogue asks for anything
};

// The node's whole epilogue (the fused form's ConvCall::epilogue): a conv's bias, activation,
// residual and residual activation, a conv_backward_data's bias, nothing for a weight gradient.
ConvEpilogueOperands node_epilogue(const Node& n, Inputs in);

// What is left of the node's epilogue after recorded work that computed `fused` of it.
ConvEpilogueOperands remaining_epilogue(const Node& n, Inputs in, ConvFusion fused);
// Records it as one pass over y (conv_epilogue; a strided bias copied first).
void record_epilogue(Context& ctx, const Node& n, ConvEpilogueOperands e, const DeviceTensor& y);
// Its parts as the report names them ("bias+relu+residual+relu"); "" for none.
std::string epilogue_text(const ConvEpilogueOperands& e);

// What an engine will do for a call, decided on the host before anything is recorded.
struct ConvEnginePlan {
  std::string variant;  // the forced variant, or "" (the engine's heuristic, made in record)
  // How much of the node's epilogue the recorded work computes: ConvFusion::epilogue for the
  // fused form of engines that fuse all of it, bias for the direct kernel, none for the
  // unfused form. cuDNN decides while recording (ConvRecorded::fused).
  ConvFusion fused = ConvFusion::none;
};

// What recording did.
struct ConvRecorded {
  bool ran = false;                     // recorded on ctx.encoder
  ConvFusion fused = ConvFusion::none;  // as ConvEnginePlan::fused, cuDNN's as it ran
  std::string plan;                     // the plan as it ran ("igemm bf16 ...", "eng0", ...)
  std::string reason;                   // ran == false: why; else a note (cuDNN: why less fused)
  size_t workspace_bytes = 0;           // cuDNN's
  double tuned_ms = -1;                 // cuDNN's autotuned time (-1: not tuned)
  bool slower = false;                  // beat_ms: not recorded, its tuned time was above it
  bool first_use = false;               // cuDNN had not seen the problem in this process
};

class ConvEngine {
 public:
  virtual ~ConvEngine() = default;
  // The name FUSEBOX_CONV_ENGINE and the report use ("implicit_gemm").
  virtual const char* name() const = 0;
  // The ops it has kernels for; for the others the engine is not a candidate at all.
  virtual bool implements(ConvOp op) const = 0;
  // Why `variant` is none of the engine's (nullopt: it is; "" always is).
  virtual std::optional<std::string> variant_refusal(const std::string& variant) const;
  // The variants, for messages ("128x128, 128x64"; "" where it takes none).
  virtual std::string variants() const { return ""; }
  // Why the engine cannot run the call (its op, problem, operands, epilogue, variant, device),
  // or nullopt. Host checks; nothing is recorded.
  virtual std::optional<std::string> cannot_implement(const ConvCall& call) const = 0;
  virtual ConvEnginePlan plan(const ConvCall& call) const;
  // Records the convolution and plan.fused's part of the epilogue on ctx.encoder.
  virtual ConvRecorded record(Context& ctx, const ConvCall& call,
                              const ConvEnginePlan& plan) const = 0;
  // "implicit_gemm:128x64, epilogue fused"
  virtual std::string describe(const ConvEnginePlan& plan) const;
};

}  // namespace fusebox::cuda
