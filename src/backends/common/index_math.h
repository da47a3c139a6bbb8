// Integer index arithmetic for host and device code of both backends. Includes only
// standard headers, so CUDA device code may include it.
#pragma once

#include <cstdint>

// Marks a function callable from host and device code when nvcc compiles it (the
// backends' shared geometry runs in CUDA kernels and in the CPU reference alike).
#ifdef __CUDACC__
#define FUSEBOX_HOST_DEVICE __host__ __device__
#else
#define FUSEBOX_HOST_DEVICE
#endif

namespace fusebox {

// floor(a / b) and ceil(a / b) for b > 0 and a of either sign (C++ division truncates
// toward zero, which is neither for negative a).
FUSEBOX_HOST_DEVICE constexpr int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
FUSEBOX_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -(-a / b);
}

// std::clamp is not callable from device code (it is not __device__).
FUSEBOX_HOST_DEVICE constexpr int64_t clamp_index(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

}  // namespace fusebox
