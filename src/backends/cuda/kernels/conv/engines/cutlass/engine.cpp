// The cutlass engine: the CUTLASS Hopper kernels (kernels/conv/engines/cutlass/) on the problem
// as it is, or on x's strided sub-lattice gathered dense (CutlassLowering::gather). Variant:
// the tile (128x128, 128x64, 64x128). Channels TMA cannot move are the im2col engine's.
#include "backends/cuda/kernels/conv/engines/cutlass/lowering.h"
#include "backends/cuda/kernels/conv/engines/engine_list.h"

namespace fusebox::cuda {
namespace {

class CutlassEngine final : public CutlassFamilyEngine {
 public:
  const char* name() const override { return "cutlass"; }

  std::optional<std::string> cannot_implement(const ConvCall& call) const override {
    if (auto why = family_refusal(call)) return why;
    const CutlassLowering lowering = lowering_of(call);
    if (lowering == CutlassLowering::im2col)
      return cat(call.geometry.in_channels,
                 " channels (not a multiple of 8, or fewer than 16): the im2col engine's");
    return refusal_under(call, lowering);
  }

  ConvRecorded record(Context& ctx, const ConvCall& call,
                      const ConvEnginePlan& plan) const override {
    return record_problem(ctx, call, plan);
  }
};

}  // namespace

const ConvEngine& cutlass_engine() {
  static const CutlassEngine engine;
  return engine;
}

}  // namespace fusebox::cuda
