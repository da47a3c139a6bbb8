// The phase_dgrad engine: the 3x3 stride-2 backward-data convolution of
// kernels/conv/engines/phase_dgrad/ (compute capability 9.0), without an epilogue: the default
// policy runs it wherever it applies.
#include "backends/cuda/kernels/conv/engines/engine_list.h"
#include "backends/cuda/kernels/conv/engines/phase_dgrad/phase_dgrad.h"
#include "backends/cuda/kernels/conv/kernel_operands.h"

namespace fusebox::cuda {
namespace {

class PhaseDgradEngine final : public ConvEngine {
 public:
  const char* name() const override { return "phase_dgrad"; }
  bool implements(ConvOp op) const override { return op == ConvOp::dgrad; }

  std::optional<std::string> cannot_implement(const ConvCall& call) const override {
    if (auto why = variant_refusal(call.variant)) return why;
    if (auto why = implicit_gemm_family_refusal(call)) return why;
    if (call.has_epilogue()) return std::string("a bias (the kernel writes dx alone)");
    return phase_dgrad::cannot_implement(
        call.geometry, call.dtype(), call.device.compute_capability, kernel_operands_aligned(call));
  }

  ConvRecorded record(Context& ctx, const ConvCall& call,
                      const ConvEnginePlan& plan) const override {
    KernelOperands k(ctx, call);
    const phase_dgrad::Plan p =
        phase_dgrad::make_plan(call.geometry, call.dtype(), ctx.device.properties().sm_count);
    phase_dgrad::record(ctx, p, call.geometry, k.y->data(), k.w->data(), k.written->data(),
                        {k.y->range(), k.w->range()}, k.written->range());
    k.finish(ctx);
    return {.ran = true, .fused = plan.fused, .plan = p.describe()};
  }
};

}  // namespace

const ConvEngine& phase_dgrad_engine() {
  static const PhaseDgradEngine engine;
  return engine;
}

}  // namespace fusebox::cuda
