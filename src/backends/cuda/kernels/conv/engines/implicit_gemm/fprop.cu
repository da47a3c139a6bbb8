// The implicit-GEMM forward convolution's kernels (operands.cuh: Fprop).
#include "backends/cuda/kernels/conv/engines/implicit_gemm/launch.cuh"

namespace fusebox::cuda::igemm {

void launch_fprop(Context& ctx, const Plan& plan, const BufferList& reads,
                  const BufferList& writes) {
  launch_op<Fprop>(ctx, plan, reads, writes);
}

}  // namespace fusebox::cuda::igemm
