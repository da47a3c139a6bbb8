// The 1x1 forward convolutions as CUTLASS ping-pong GEMMs (gemm_instance.cuh): bf16 and f16,
// tiles 128x128 and 128x64.
#include "backends/cuda/kernels/conv/engines/cutlass/gemm_instance.cuh"

namespace fusebox::cuda::cutlass_conv {

std::optional<std::string> record_gemm_fprop(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                             const Operands& o, const BufferList& reads,
                                             const BufferRange& written) {
  using Col = cutlass::layout::ColumnMajor;  // w [K][C]: B (C x K) with C contiguous
  return record_gemm<Col>(ctx, plan, g, o.x, o, reads, written);
}

}  // namespace fusebox::cuda::cutlass_conv
