// The patch_wgrad engine: the 7x7 weight gradient over at most 4 channels (an RGB stem) of
// kernels/conv/engines/patch_wgrad/ (compute capability 9.0): the default policy runs it wherever
// it applies.
#include "backends/cuda/kernels/conv/engines/engine_list.h"
#include "backends/cuda/kernels/conv/engines/patch_wgrad/patch_wgrad.h"
#include "backends/cuda/kernels/conv/kernel_operands.h"

namespace fusebox::cuda {
namespace {

class PatchWgradEngine final : public ConvEngine {
 public:
  const char* name() const override { return "patch_wgrad"; }
  bool implements(ConvOp op) const override { return op == ConvOp::wgrad; }

  std::optional<std::string> cannot_implement(const ConvCall& call) const override {
    if (auto why = variant_refusal(call.variant)) return why;
    if (auto why = implicit_gemm_family_refusal(call)) return why;
    return patch_wgrad::cannot_implement(
        call.geometry, call.dtype(), call.device.compute_capability, kernel_operands_aligned(call));
  }

  ConvRecorded record(Context& ctx, const ConvCall& call,
                      const ConvEnginePlan& plan) const override {
    KernelOperands k(ctx, call);
    const patch_wgrad::Plan p =
        patch_wgrad::make_plan(call.geometry, call.dtype(), ctx.device.properties().sm_count);
    const DeviceTensor partial =
        temporary_tensor(ctx, DType::f32, {int64_t(p.partial_bytes / sizeof(float))});
    patch_wgrad::record(ctx, p, call.geometry,
                        {k.x->data(), k.y->data(), k.written->data(), partial.as<float>()},
                        {k.x->range(), k.y->range()}, k.written->range(), partial.range());
    k.finish(ctx);
    return {.ran = true, .fused = plan.fused, .plan = p.describe()};
  }
};

}  // namespace

const ConvEngine& patch_wgrad_engine() {
  static const PatchWgradEngine engine;
  return engine;
}

}  // namespace fusebox::cuda
