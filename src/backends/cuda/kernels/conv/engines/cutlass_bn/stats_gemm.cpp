#include "backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm.h"

#include <cstdint>

#include "fusebox/core/error.h"

namespace fusebox::cuda::cutlass_bn {

std::optional<std::string> record_stats_gemm(Context& ctx, const StatsGemmCall& call,
                                             const BufferList& reads, const BufferList& writes) {
  if (call.m <= 0 || call.n <= 0 || call.k <= 0 || call.m > INT32_MAX || call.n > INT32_MAX ||
      call.k > INT32_MAX)
    return cat("extents m ", call.m, ", n ", call.n, ", k ", call.k, " out of the kernel's range");
  if (call.sums == nullptr || call.squares == nullptr)
    return std::string("no buffers for the partial sums");
  if (call.n % 8 != 0 || call.k % 8 != 0)
    return std::string("channel counts not multiples of 8 (16-byte rows)");
  if (call.check_bounds) {
    if (call.wide) return std::string("the bounds-checked form has the 128 x 64 tile only");
    return detail::record_stats_tile<128, 64, true>(ctx, call, reads, writes);
  }
  if (call.wide) return detail::record_stats_tile<128, 128, false>(ctx, call, reads, writes);
  return detail::record_stats_tile<128, 64, false>(ctx, call, reads, writes);
}

}  // namespace fusebox::cuda::cutlass_bn
