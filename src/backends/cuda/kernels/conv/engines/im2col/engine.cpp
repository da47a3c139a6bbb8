// The im2col engine: convolutions over channels TMA cannot move as they are (not a multiple of
// 8, or fewer than 16: an RGB stem's 3) with the patches written out as a matrix (im2col.h),
// a pointwise problem the CUTLASS Hopper kernels take. Variant: the CUTLASS tile.
#include "backends/cuda/kernels/conv/engines/cutlass/lowering.h"
#include "backends/cuda/kernels/conv/engines/engine_list.h"

namespace fusebox::cuda {
namespace {

class Im2colEngine final : public CutlassFamilyEngine {
 public:
  const char* name() const override { return "im2col"; }

  std::optional<std::string> cannot_implement(const ConvCall& call) const override {
    if (auto why = family_refusal(call)) return why;
    const CutlassLowering lowering = lowering_of(call);
    if (lowering != CutlassLowering::im2col)
      return std::string(
          "not a problem for the patch matrix (channels TMA moves as they are, groups, a 1x1 "
          "without stride, or a matrix of 2^30 elements or more)");
    return refusal_under(call, lowering);
  }

  ConvRecorded record(Context& ctx, const ConvCall& call,
                      const ConvEnginePlan& plan) const override {
    return record_problem(ctx, call, plan);
  }
};

}  // namespace

const ConvEngine& im2col_engine() {
  static const Im2colEngine engine;
  return engine;
}

}  // namespace fusebox::cuda
