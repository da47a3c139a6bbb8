// The statistics GEMM's 128 x 64 instance with CUTLASS's per-element bounds test (for comparison).
#include "backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm_instance.cuh"

namespace fusebox::cuda::cutlass_bn::detail {

template std::optional<std::string> record_stats_tile<128, 64, true>(Context&, const StatsGemmCall&,
                                                                     const BufferList&,
                                                                     const BufferList&);

}  // namespace fusebox::cuda::cutlass_bn::detail
