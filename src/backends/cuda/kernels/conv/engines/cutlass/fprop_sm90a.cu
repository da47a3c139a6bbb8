// The CUTLASS Hopper forward convolutions: bf16 and f16, tiles 128x128 and 128x64, a plain
// epilogue or the fused one (instance.cuh).
#include "backends/cuda/kernels/conv/engines/cutlass/instance.cuh"

namespace fusebox::cuda::cutlass_conv {

namespace {

template <class T, int TM, int TN, bool kPlain>
std::optional<std::string> run(Context& ctx, const Plan& plan, const ConvGeometry& g,
                               const Operands& o, const BufferList& reads,
                               const BufferRange& written) {
  using I = Instance<cutlass::conv::Operator::kFprop, T, T, TM, TN, kPlain>;
  const auto args = I::arguments(g, o.x, o.w, plan.epilogue.residual ? o.residual : nullptr,
                                 o.result, o.bias, plan.epilogue);
  return record_unless_refused<I>(ctx, args, reads, written);
}

}  // namespace

std::optional<std::string> record_fprop(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                        const Operands& o, const BufferList& reads,
                                        const BufferRange& written) {
  return dispatch<Tile::t128x128, Tile::t128x64>(plan, [&]<class T, int TM, int TN>() {
    if (plan.epilogue.plain()) return run<T, TM, TN, true>(ctx, plan, g, o, reads, written);
    return run<T, TM, TN, false>(ctx, plan, g, o, reads, written);
  });
}

}  // namespace fusebox::cuda::cutlass_conv
