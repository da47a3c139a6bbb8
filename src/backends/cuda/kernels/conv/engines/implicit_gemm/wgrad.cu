// The implicit-GEMM backward-filter convolution's kernels (operands.cuh: Wgrad) and the
// deterministic sum of its K splits.
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/launch.cuh"
#include "backends/cuda/kernels/conv/split_sum.cuh"

namespace fusebox::cuda::igemm {

void launch_wgrad(Context& ctx, const Plan& plan, const BufferList& reads, const BufferRange& dw,
                  const BufferRange* partial) {
  if (plan.params.splits == 1) return launch_op<Wgrad>(ctx, plan, reads, {dw});
  launch_op<Wgrad>(ctx, plan, reads, {*partial});
  const int64_t count = plan.params.partial_stride;
  visit_device_float("implicit GEMM", plan.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double>) {
      throw Error("implicit GEMM", "f64 has no implicit-GEMM kernel");
    } else {
      record_sum_splits<T>(ctx, *partial, static_cast<const float*>(plan.params.partial),
                           int64_t(plan.params.splits), count, dw,
                           static_cast<T*>(plan.params.result));
    }
  });
}

}  // namespace fusebox::cuda::igemm
