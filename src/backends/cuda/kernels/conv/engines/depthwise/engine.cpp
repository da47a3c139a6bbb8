// The depthwise engine: the NHWC depthwise kernels (depthwise.h) for groups == C == K, the
// whole epilogue fused.
#include "backends/cuda/kernels/conv/engines/depthwise/depthwise.h"
#include "backends/cuda/kernels/conv/engines/depthwise/plan.h"
#include "backends/cuda/kernels/conv/engines/engine_list.h"
#include "backends/cuda/kernels/conv/operand_layout.h"

namespace fusebox::cuda {
namespace {

class DepthwiseEngine final : public ConvEngine {
 public:
  const char* name() const override { return "depthwise"; }
  bool implements(ConvOp) const override { return true; }

  std::optional<std::string> cannot_implement(const ConvCall& call) const override {
    if (auto why = variant_refusal(call.variant)) return why;
    const DType t = call.dtype();
    if (auto why = depthwise::cannot_implement(call.op(), call.geometry, t)) return why;
    for (const DeviceTensor* i : call.in)
      if (i != nullptr && i->dtype != t) return std::string("mixed dtypes");
    // Operands already channels-last are read in place: they must be 16-byte aligned (copies
    // are).
    for (const DeviceTensor* i : call.in)
      if (i != nullptr && (i->is_channels_last() || i->rank() == 1) && !aligned16(i))
        return std::string("an operand not 16-byte aligned");
    if (call.out[0].is_channels_last() && !aligned16(&call.out[0]))
      return std::string("the output not 16-byte aligned");
    return std::nullopt;
  }

  ConvRecorded record(Context& ctx, const ConvCall& call,
                      const ConvEnginePlan& plan) const override {
    return {.ran = true,
            .fused = plan.fused,
            .plan = run_depthwise(ctx, *call.node, call.op(), call.in, call.out, call.epilogue)};
  }
};

}  // namespace

const ConvEngine& depthwise_engine() {
  static const DepthwiseEngine engine;
  return engine;
}

}  // namespace fusebox::cuda
