// The statistics GEMM's 128 x 64 instance.
#include "backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm_instance.cuh"

namespace fusebox::cuda::cutlass_bn::detail {

template std::optional<std::string> record_stats_tile<128, 64, false>(Context&,
                                                                      const StatsGemmCall&,
                                                                      const BufferList&,
                                                                      const BufferList&);

}  // namespace fusebox::cuda::cutlass_bn::detail
