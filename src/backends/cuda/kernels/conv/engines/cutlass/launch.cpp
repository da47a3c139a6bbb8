// cutlass_conv::record: the dispatch by op (launch.h).
#include "backends/cuda/kernels/conv/engines/cutlass/launch.h"

namespace fusebox::cuda::cutlass_conv {

std::optional<std::string> record(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                  const Operands& o, const BufferList& reads,
                                  const BufferRange& written, const BufferRange* partial) {
  switch (plan.op) {
    case ConvOp::fprop:
      if (plan.gemm) return record_gemm_fprop(ctx, plan, g, o, reads, written);
      return record_fprop(ctx, plan, g, o, reads, written);
    case ConvOp::dgrad:
      if (plan.gemm) return record_gemm_dgrad(ctx, plan, g, o, reads, written);
      return record_dgrad(ctx, plan, g, o, reads, written);
    case ConvOp::wgrad:
      if (partial == nullptr && plan.partial_bytes > 0)
        throw Error("CUTLASS wgrad", "no partial buffer for the chunk sums");
      if (plan.gemm) return record_gemm_wgrad(ctx, plan, g, o, reads, written, partial);
      return record_wgrad(ctx, plan, g, o, reads, written, *partial);
  }
  return std::string("unknown op");
}

}  // namespace fusebox::cuda::cutlass_conv
