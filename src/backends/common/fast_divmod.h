// Division by a run-time constant without a divide instruction (Granlund and Montgomery):
// q = (umulhi(n, mul) + n) >> shift, exact for 0 <= n < 2^31 and 1 <= d < 2^31. The host
// computes mul and shift once; kernels that split flat indices into coordinates in their
// inner loops (the implicit-GEMM convolutions) divide with two integer instructions instead
// of a ~20-instruction software division. Includes only standard headers (device code
// includes it).
#pragma once

#include <cstdint>

#include "backends/common/index_math.h"  // FUSEBOX_HOST_DEVICE

namespace fusebox {

struct FastDivmod {
  int32_t divisor = 1;
  uint32_t mul = 1;  // for divisor 1: umulhi(n, 1) = 0, so q = n
  uint32_t shift = 0;

  FastDivmod() = default;
  // d in [1, 2^31).
  explicit FastDivmod(int32_t d) : divisor(d) {
    while ((int64_t(1) << shift) < int64_t(d)) ++shift;  // shift = ceil(log2 d)
    mul =
        uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(d))) / uint64_t(d) + 1);
  }

  FUSEBOX_HOST_DEVICE int32_t div(int32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(uint32_t(n), mul);
#else
    const uint32_t hi = uint32_t((uint64_t(uint32_t(n)) * mul) >> 32);
#endif
    return int32_t((hi + uint32_t(n)) >> shift);
  }
  // q = n / d and the remainder n - q * d.
  FUSEBOX_HOST_DEVICE int32_t divmod(int32_t n, int32_t& remainder) const {
    const int32_t q = div(n);
    remainder = n - q * divisor;
    return q;
  }
};

}  // namespace fusebox
