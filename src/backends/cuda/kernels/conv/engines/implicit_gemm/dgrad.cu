// The implicit-GEMM backward-data convolution's kernels (operands.cuh: Dgrad, one GEMM per
// stride phase in one grid).
#include "backends/cuda/kernels/conv/engines/implicit_gemm/launch.cuh"

namespace fusebox::cuda::igemm {

void launch_dgrad(Context& ctx, const Plan& plan, const BufferList& reads,
                  const BufferList& writes) {
  launch_op<Dgrad>(ctx, plan, reads, writes);
}

}  // namespace fusebox::cuda::igemm
