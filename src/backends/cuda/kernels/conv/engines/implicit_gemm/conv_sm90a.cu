// The Hopper (sm_90a, wgmma) implicit-GEMM kernels: fprop and dgrad (filter transposed),
// bf16 and f16, tiles 128x128 and 128x64. Compiled for sm_90a alone (src/CMakeLists.txt: the
// fusebox_cuda_sm90a objects); plan.cpp chooses them only on a compute capability 9.0 device.
#include "backends/cuda/kernels/conv/engines/implicit_gemm/launch.h"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/mainloop_sm90.cuh"
#include "backends/cuda/runtime/check.h"

namespace fusebox::cuda::igemm {

namespace {

template <class Op, class T, int BN>
void launch_sm90_instance(Context& ctx, const Plan& plan, const BufferList& reads,
                          const BufferList& writes) {
  auto* kernel = &conv_kernel_sm90<Op, T, BN>;
  constexpr size_t smem = sm90_shared_bytes<T, BN>();
  FUSEBOX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  ctx.encoder.launch(kernel, dim3(plan.grid[0], plan.grid[1], plan.grid[2]), dim3(kSm90Threads),
                     smem, reads, writes, plan.params);
}

template <class Op, class T>
void launch_sm90_tiled(Context& ctx, const Plan& plan, const BufferList& reads,
                       const BufferList& writes) {
  if (plan.tile == TileShape::wg128x128)
    return launch_sm90_instance<Op, T, 128>(ctx, plan, reads, writes);
  return launch_sm90_instance<Op, T, 64>(ctx, plan, reads, writes);
}

template <class Op>
void launch_sm90_op(Context& ctx, const Plan& plan, const BufferList& reads,
                    const BufferList& writes) {
  if (plan.dtype == DType::bf16)
    return launch_sm90_tiled<Op, __nv_bfloat16>(ctx, plan, reads, writes);
  if (plan.dtype == DType::f16) return launch_sm90_tiled<Op, __half>(ctx, plan, reads, writes);
  throw Error("implicit GEMM", cat("no wgmma kernel for ", plan.describe()));
}

}  // namespace

void launch_sm90(Context& ctx, const Plan& plan, const BufferList& reads,
                 const BufferList& writes) {
  switch (plan.op) {
    case ConvOp::fprop:
      return launch_sm90_op<Fprop>(ctx, plan, reads, writes);
    case ConvOp::dgrad:
      return launch_sm90_op<DgradTransposed>(ctx, plan, reads, writes);
    default:
      throw Error("implicit GEMM", cat("no wgmma kernel for ", plan.describe()));
  }
}

}  // namespace fusebox::cuda::igemm
