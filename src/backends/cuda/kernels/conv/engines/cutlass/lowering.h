// How the cutlass, im2col and space_to_depth engines hand a problem to the CUTLASS Hopper
// kernels (kernels/conv/engines/cutlass/): the problem as it is, x's strided sub-lattice gathered
// dense, or the patches written out as a matrix; the kernels' checks of the problem and the
// epilogue; and recording it.
#pragma once

#include <optional>
#include <string>

#include "backends/cuda/kernels/conv/engine.h"
#include "backends/cuda/kernels/conv/engines/cutlass/plan.h"

namespace fusebox::cuda {

enum class CutlassLowering {
  direct,  // as it is
  // A strided 1x1 fprop or wgrad without padding reads only x's sub-lattice: gathered dense (a
  // quarter of x at stride 2), it is a pointwise problem, which runs on the persistent GEMM
  // instead of the im2col kernel (0.55x cuDNN on ResNet-50's stride-2 downsample fprop). A
  // wgrad only where the GEMM runs unsplit (cutlass_conv::direct_wgrad_tile: layer 4's
  // 0.55x); chunked through f32 slices, ResNet-50's three fell from 0.65-1.1x to 0.47-0.66x.
  gather,
  // Channels that are not a multiple of 8 (an RGB stem's 3), or 8: TMA cannot move such rows,
  // or 8 channels would fill an eighth of each 64-deep K step. The patches written out as a
  // matrix (engines/im2col/im2col.h) make the problem pointwise, a GEMM over taps*C columns.
  // (Where the space-to-depth lowering applies, that engine comes first in the policy.)
  im2col,
};

// The pointwise problem a gathered or im2col'd one becomes: rows = N*O pixels of `channels`.
ConvGeometry pointwise_geometry(const ConvGeometry& g, int64_t channels);

CutlassLowering cutlass_lowering(ConvOp op, const ConvGeometry& g, int sm_count,
                                 std::optional<cutlass_conv::Tile> tile);

// The CUTLASS tile a cutlass-family variant names ("128x64" -> cutlass128x64), nullopt for "".
// Throws where the variant is none (variant_refusal has checked it).
std::optional<cutlass_conv::Tile> cutlass_variant_tile(const std::string& variant);
std::optional<std::string> cutlass_variant_refusal(const std::string& variant);
constexpr const char* kCutlassVariants = "128x128, 128x64, 64x128";

// The operands as the kernels see them (null where the op has none).
struct CutlassTensors {
  const DeviceTensor *x, *w, *y, *bias, *residual, *written;
};

// Why the kernels cannot take problem `gw` (as a lowering made it) with the call's epilogue
// (cutlass_conv::cannot_implement, map_epilogue), or nullopt with the epilogue in *epilogue.
std::optional<std::string> cutlass_refusal(const ConvCall& call, const ConvGeometry& gw,
                                           bool aligned, cutlass_conv::Epilogue* epilogue);

// Why lowering `lowering` of problem g (the call's, or space_to_depth's wide one) cannot run:
// cutlass_refusal of the lowered problem, a dgrad bias under im2col, a zero-filled dgrad with a
// bias, a forced tile (the call's variant) the plan would not use; or nullopt.
std::optional<std::string> cutlass_lowering_refusal(const ConvCall& call, const ConvGeometry& g,
                                                    CutlassLowering lowering, bool aligned);

// Records problem g (the call's, or space_to_depth's wide one) on the CUTLASS kernels under
// its lowering and returns the plan's description, or the reason CUTLASS's own can_implement
// refused it (nothing recorded but what the lowering wrote: the caller's next engine writes
// the whole result).
struct CutlassRecorded {
  bool ran = false;
  std::string text;  // the plan, or why not
};
CutlassRecorded record_on_cutlass(Context& ctx, const ConvCall& call, const ConvGeometry& g,
                                  const CutlassTensors& t, bool aligned);

// What the engines on the CUTLASS kernels share: their variants (the CUTLASS tiles), the
// common refusals, and (cutlass, im2col) recording the call's own problem.
class CutlassFamilyEngine : public ConvEngine {
 public:
  bool implements(ConvOp) const override { return true; }
  std::string variants() const override { return kCutlassVariants; }
  std::optional<std::string> variant_refusal(const std::string& variant) const override {
    return cutlass_variant_refusal(variant);
  }

 protected:
  // The variant's or the implicit-GEMM family's refusal (kernel_operands.h), or nullopt.
  static std::optional<std::string> family_refusal(const ConvCall& call);
  // The lowering cutlass_lowering picks for the call (the forced tile considered).
  static CutlassLowering lowering_of(const ConvCall& call);
  // cutlass_lowering_refusal of the call's problem under `lowering`, with the operands'
  // alignment the recording will have.
  static std::optional<std::string> refusal_under(const ConvCall& call, CutlassLowering lowering);
  // Records the call's problem under its lowering (KernelOperands, record_on_cutlass).
  static ConvRecorded record_problem(Context& ctx, const ConvCall& call,
                                     const ConvEnginePlan& plan);
};

}  // namespace fusebox::cuda
