// The 1x1 backward-data convolutions as CUTLASS ping-pong GEMMs (gemm_instance.cuh): bf16 and
// f16, tiles 128x128 and 128x64.
#include "backends/cuda/kernels/conv/engines/cutlass/gemm_instance.cuh"

namespace fusebox::cuda::cutlass_conv {

std::optional<std::string> record_gemm_dgrad(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                             const Operands& o, const BufferList& reads,
                                             const BufferRange& written) {
  using Row = cutlass::layout::RowMajor;  // w [K][C]: B (K x C) with C contiguous
  return record_gemm<Row>(ctx, plan, g, o.y, o, reads, written);
}

}  // namespace fusebox::cuda::cutlass_conv
