// The kernel parameters of the implicit-GEMM convolutions: plain data that the host fills
// (plan.cpp, testable without a GPU) and the kernels take by value. Includes only standard
// and backends/common headers, so device code includes it.
//
// Tensors are dense channels-last: x [N, D0, D1, D2, C], y [N, O0, O1, O2, K] and the
// filter KRSC [K, R0, R1, R2, C/g] (kernels/conv/engines/implicit_gemm/implicit_gemm.cpp copies
// other layouts first). 1-D and 2-D problems have leading spatial extents of 1, as ConvGeometry.
#pragma once

#include <cstdint>

#include "backends/common/activation.h"
#include "backends/common/fast_divmod.h"

namespace fusebox::cuda::igemm {

// Strided dgrad runs one GEMM per stride phase (see operands.cuh); a phase's taps are the
// filter positions whose contributions land on it.
constexpr int kMaxPhases = 8;
constexpr int kMaxTaps = 128;

// One filter tap of a dgrad phase: its position in the filter (flat r0 r1 r2) and the
// output offset q it reads for phase-grid position j: o = j + q (exact; o outside [0, O)
// reads zero).
struct Tap {
  int32_t r = 0;
  int32_t q[3] = {0, 0, 0};
};

// One stride phase of dgrad: the dx positions d = phase + stride * j, j in [0, J).
struct Phase {
  int32_t phase[3] = {0, 0, 0};
  int32_t extent[3] = {1, 1, 1};  // J
  FastDivmod div_extent1, div_extent2;
  int32_t m = 0;          // N * J0 * J1 * J2: the phase's GEMM M
  int32_t k = 0;          // taps * K/g: its GEMM K
  int32_t first_tap = 0;  // into Params::taps
  int32_t taps = 0;
};

struct Params {
  // Geometry.
  int32_t batch = 0, in_channels = 0, out_channels = 0, groups = 1;
  int32_t in_per_group = 0, out_per_group = 0;  // C/g, K/g
  int32_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, filter[3] = {1, 1, 1};
  int32_t stride[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, dilation[3] = {1, 1, 1};
  int32_t taps = 1;  // R0 * R1 * R2
  FastDivmod div_in_per_group, div_out_per_group, div_filter1, div_filter2, div_out1, div_out2;

  // The GEMM of one group (fprop, wgrad) or of the largest phase (dgrad).
  int32_t m = 0, n = 0, k = 0;
  int32_t tiles_m = 0, tiles_n = 0;  // grid.x = tiles_m * tiles_n
  int32_t phases = 1;                // dgrad: grid.z = groups * phases
  int32_t splits = 1;                // wgrad: grid.y; each split sums k_tiles_per_split tiles
  int32_t k_tiles_per_split = 0;

  // Operands (roles as ConvProblem: x, w, y of the forward; the op reads two, writes one).
  const void* x = nullptr;
  const void* w = nullptr;
  const void* y = nullptr;
  void* result = nullptr;          // y (fprop), dx (dgrad), dw (wgrad)
  float* partial = nullptr;        // wgrad with splits > 1: [splits][K][taps * C/g] f32
  int64_t partial_stride = 0;      // elements of one split's sums (K * taps * C/g)
  const void* bias = nullptr;      // [K] (fprop) or [C] (dgrad), or null
  const void* residual = nullptr;  // fprop: y's shape and layout, or null
  ActivationFn activation, residual_activation;

  Phase phase[kMaxPhases];
  Tap tap[kMaxTaps];
};

static_assert(sizeof(Params) < 4000, "kernel parameters must stay under CUDA's 4 KiB");

}  // namespace fusebox::cuda::igemm
