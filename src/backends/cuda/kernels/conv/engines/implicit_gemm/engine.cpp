// The implicit_gemm engine: the project's tensor-core main loops
// (kernels/conv/engines/implicit_gemm/: mma.sync on any sm_80+ GPU, wgmma on compute
// capability 9.0) for fprop, dgrad and wgrad of 1 to 3 spatial dims, stride, dilation, asymmetric
// padding and groups, in f32 (TF32 or exact), f16 and bf16, the whole epilogue fused. Variant: the
// CTA tile (implicit_gemm/plan.h), an Error where it is not compiled for the problem.
#include <optional>
#include <vector>

#include "backends/cuda/kernels/conv/engines/engine_list.h"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/launch.h"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/plan.h"
#include "backends/cuda/kernels/conv/kernel_operands.h"
#include "backends/cuda/kernels/conv/operand_layout.h"

namespace fusebox::cuda {
namespace {

class ImplicitGemmEngine final : public ConvEngine {
 public:
  const char* name() const override { return "implicit_gemm"; }
  bool implements(ConvOp) const override { return true; }
  std::string variants() const override {
    return "128x128, 128x64, 64x128, 64x64, wg128x128, wg128x64";
  }
  std::optional<std::string> variant_refusal(const std::string& variant) const override {
    if (variant.empty() || igemm::parse_tile(variant)) return std::nullopt;
    return ConvEngine::variant_refusal(variant);
  }

  std::optional<std::string> cannot_implement(const ConvCall& call) const override {
    if (auto why = variant_refusal(call.variant)) return why;
    if (auto why = implicit_gemm_family_refusal(call)) return why;
    if (call.variant.empty()) return std::nullopt;
    const igemm::Plan plan =
        igemm::make_plan(call.op(), call.geometry, call.dtype(),
                         options(call, kernel_operands_aligned(call)), call.device.sm_count);
    if (igemm::tile_name(plan.tile) != call.variant)
      return cat("tile ", call.variant, " is not compiled for this problem (the heuristic's: ",
                 igemm::tile_name(plan.tile), ")");
    return std::nullopt;
  }

  ConvRecorded record(Context& ctx, const ConvCall& call,
                      const ConvEnginePlan& fusion) const override {
    const ConvOp op = call.op();
    const ConvGeometry& g = call.geometry;
    const ConvEpilogueOperands& e = call.epilogue;
    KernelOperands k(ctx, call);
    igemm::Plan plan = igemm::make_plan(op, g, call.dtype(), options(call, k.aligned),
                                        ctx.device.properties().sm_count);
    const DeviceTensor* w = k.w;
    std::optional<DeviceTensor> permuted;
    if (op == ConvOp::dgrad && igemm::is_wgmma(plan.tile)) {
      // The wgmma dgrad reads the filter per group as [C/g][taps][K/g] (K-major): a copy of
      // the KRSC filter through a permuted view.
      const int64_t kg = g.out_per_group(), cg = g.in_per_group(), taps = g.filter_size();
      const DeviceTensor view =
          w->view(w->offset, {g.groups, cg, taps, kg}, {kg * taps * cg, 1, cg, taps * cg});
      permuted = temporary_tensor(ctx, w->dtype, {g.groups, cg, taps, kg});
      copy_strided(ctx, view, *permuted);
      w = &*permuted;
    }
    igemm::Params& p = plan.params;
    p.x = k.x ? k.x->data() : nullptr;
    p.w = w ? w->data() : nullptr;
    p.y = k.y ? k.y->data() : nullptr;
    p.result = k.written->data();
    p.bias = k.bias ? k.bias->data() : nullptr;
    p.residual = k.residual ? k.residual->data() : nullptr;
    p.activation = activation_fn(e.activation);
    p.residual_activation = activation_fn(e.residual_activation);

    BufferList reads;
    for (const DeviceTensor* t : {k.x, w, k.y, k.bias, k.residual})
      if (t != nullptr) reads.push_back(t->range());
    switch (op) {
      case ConvOp::fprop:
      case ConvOp::dgrad:
        if (igemm::is_wgmma(plan.tile))
          igemm::launch_sm90(ctx, plan, reads, {k.written->range()});
        else if (op == ConvOp::fprop)
          igemm::launch_fprop(ctx, plan, reads, {k.written->range()});
        else
          igemm::launch_dgrad(ctx, plan, reads, {k.written->range()});
        break;
      case ConvOp::wgrad: {
        std::optional<DeviceTensor> partial;
        if (plan.partial_bytes > 0) {
          partial =
              temporary_tensor(ctx, DType::f32, {int64_t(plan.partial_bytes / sizeof(float))});
          p.partial = partial->as<float>();
        }
        std::optional<BufferRange> partial_range;
        if (partial) partial_range = partial->range();
        igemm::launch_wgrad(ctx, plan, reads, k.written->range(),
                            partial_range ? &*partial_range : nullptr);
        break;
      }
    }
    k.finish(ctx);
    return {.ran = true, .fused = fusion.fused, .plan = plan.describe()};
  }

 private:
  // allow_tf32 (f32 on TF32 tensor cores, else exact), the forced tile, the operands'
  // alignment, wgmma on compute capability 9.0.
  static igemm::PlanOptions options(const ConvCall& call, bool aligned) {
    igemm::PlanOptions o;
    o.allow_tf32 = call.settings->allow_tf32;
    if (!call.variant.empty()) o.tile = igemm::parse_tile(call.variant);
    o.aligned = aligned;
    o.wgmma = call.device.compute_capability == 90;
    return o;
  }
};

}  // namespace

const ConvEngine& implicit_gemm_engine() {
  static const ImplicitGemmEngine engine;
  return engine;
}

}  // namespace fusebox::cuda
