// The cudnn engine: cuDNN's graph API through cudnn/conv.h (cudnn-frontend stays under
// src/backends/cuda/cudnn/). It fuses as much of the epilogue as a plan takes (cudnn/plans.cpp
// tries the most fused graph first), autotunes its own candidates under FUSEBOX_AUTOTUNE, and
// declines while recording where no plan builds or runs. Variant: the heuristics' candidate
// index (as FUSEBOX_CONV_PLAN_INDEX; runtime/settings.cpp puts it into the problem).
#include <cctype>

#include "backends/cuda/cudnn/conv.h"
#include "backends/cuda/kernels/conv/engines/engine_list.h"

namespace fusebox::cuda {
namespace {

class CudnnEngine final : public ConvEngine {
 public:
  const char* name() const override { return "cudnn"; }
  bool implements(ConvOp) const override { return true; }
  std::string variants() const override { return "a plan index: 0, 1, ..."; }
  std::optional<std::string> variant_refusal(const std::string& variant) const override {
    for (char c : variant)
      if (!std::isdigit(static_cast<unsigned char>(c)))
        return cat("cudnn's variant is a plan index (0, 1, ...), not '", variant, "'");
    return std::nullopt;
  }

  std::optional<std::string> cannot_implement(const ConvCall& call) const override {
    if (auto why = variant_refusal(call.variant)) return why;
    return cudnn_cannot_implement(*call.problem);
  }

  // What it fuses is its plans' choice, made while recording.
  ConvEnginePlan plan(const ConvCall& call) const override { return {call.variant}; }

  ConvRecorded record(Context& ctx, const ConvCall& call, const ConvEnginePlan&) const override {
    ConvOperands t;
    const Inputs in = call.in;
    const DeviceTensor* bias = in.size() > 2 ? in[2] : nullptr;
    switch (call.op()) {
      case ConvOp::fprop:
        t = {in[0], in[1], &call.out[0], bias, in.size() > 3 ? in[3] : nullptr};
        break;
      case ConvOp::dgrad:
        t = {&call.out[0], in[1], in[0], bias};
        break;
      case ConvOp::wgrad:
        t = {in[0], &call.out[0], in[1], nullptr};
        break;
    }
    const CudnnConvOutcome r =
        cudnn_conv_record(ctx, *call.problem, t, *call.settings, call.beat_ms);
    ConvRecorded out;
    out.ran = r.ran;
    out.fused = r.fused;
    out.plan = r.lowering == ConvLowering::standard
                   ? r.plan
                   : cat(r.plan, " (", conv_lowering_name(r.lowering), ")");
    out.reason = r.reason;
    out.workspace_bytes = r.workspace_bytes;
    out.tuned_ms = r.tuned_ms;
    out.slower = r.slower;
    out.first_use = r.first_use;
    return out;
  }
};

}  // namespace

const ConvEngine& cudnn_engine() {
  static const CudnnEngine engine;
  return engine;
}

}  // namespace fusebox::cuda
