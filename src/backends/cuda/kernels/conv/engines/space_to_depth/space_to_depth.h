// Space-to-depth for 16-bit channels-last convolutions over few channels (an RGB stem's 7x7
// stride 2 on C = 3): the stride phases and the last dim's taps moved into the channels turn
// the problem into a stride-1 one over C' channels that the CUTLASS kernels take, reading a
// tensor a third the size of im2col's patch matrix.
//
// Along each dim tap r = s*u + a (a < s the phase, u < R' = ceil(R / s) the tap of the phase
// lattice), so output o reads x[s*(o + u) + a - p]: a stride-1 convolution over the phase
// lattice q = o + u with no padding, whose channels are (a, c). The last dim's R' taps are
// folded into the channels too (its filter extent becomes 1), so a wide channel j is
//
//   j = (((u2 * s0 + a0) * s1 + a1) * s2 + a2) * C + c,  C' = R'2 * s0 s1 s2 * C rounded to 8
//
//   xs[n][q0][q1][q2][j] = x[n][s0 q0 + a0 - p0][s1 q1 + a1 - p1][s2 (q2 + u2) + a2 - p2][c]
//   ws[k][u0][u1][0][j]  = w[k][s0 u0 + a0][s1 u1 + a1][s2 u2 + a2][c]   (0 past R)
//
// with q0, q1 < O + R' - 1 and q2 < O2. Then y = conv(xs, ws) (filter R'0 x R'1 x 1, stride 1,
// no padding); dx = fold(dgrad(dy, ws)), each x element summing the R'2 (q2, u2) that read it;
// dw = fold(wgrad(xs, dy)), one ws element per w element. The stem: xs [64][115][112][48],
// 79 MB, against im2col's 802816 x 152 (244 MB), and a filter of 4 taps of 48 channels.
#pragma once

#include <cstdint>
#include <optional>

#include "backends/common/conv_geometry.h"
#include "backends/common/index_math.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda {

// One tensor's map between its plain form [batch][T0][T1][T2][C] and its wide form
// [batch][Q0][Q1][Q2][C'] (the activations: x / dx and xs; the filter: w / dw and ws, whose
// pads are 0). 32-bit: space_to_depth_lowering checks the extents fit.
struct PhaseMap {
  int batch = 0;          // N for the activations, K for the filter
  int channels = 0;       // C
  int wide_channels = 0;  // C'
  int unfold = 1;         // R'2: the last dim's taps folded into the channels
  int source[3] = {1, 1, 1};
  int wide[3] = {1, 1, 1};
  int stride[3] = {1, 1, 1};
  int pad[3] = {0, 0, 0};

  FUSEBOX_HOST_DEVICE int used_channels() const {
    return unfold * stride[0] * stride[1] * stride[2] * channels;
  }
};

// Wide channel j's digits, j = (((u * s0 + a0) * s1 + a1) * s2 + a2) * C + c: decoded by
// division once, then stepped to j + 1 without (the kernels walk a vector's channels so).
struct PhaseDigits {
  int c, a[3], u;  // u: the folded tap of the last dim

  FUSEBOX_HOST_DEVICE PhaseDigits(const PhaseMap& m, int j) {
    c = j % m.channels;
    u = j / m.channels;
    for (int d = 2; d >= 0; --d) a[d] = u % m.stride[d], u /= m.stride[d];
  }
  // To channel j + 1; true where that starts a new group (u, a), whose C channels are the
  // next plain position's.
  FUSEBOX_HOST_DEVICE bool next(const PhaseMap& m) {
    if (++c < m.channels) return false;
    c = 0;
    if (++a[2] == m.stride[2]) {
      a[2] = 0;
      if (++a[1] == m.stride[1]) {
        a[1] = 0;
        if (++a[0] == m.stride[0]) a[0] = 0, ++u;
      }
    }
    return true;
  }
  // The plain position channel c of wide position q comes from (outside [0, T): zero).
  FUSEBOX_HOST_DEVICE int source(const PhaseMap& m, const int q[3], int d) const {
    return m.stride[d] * (q[d] + (d == 2 ? u : 0)) + a[d] - m.pad[d];
  }
};

// The plain position t (possibly outside [0, T): zero there) and channel c that wide channel
// j < used_channels() of wide position q holds.
FUSEBOX_HOST_DEVICE inline void phase_source(const PhaseMap& m, const int q[3], int j, int t[3],
                                             int* c) {
  const PhaseDigits digits(m, j);
  *c = digits.c;
  for (int d = 0; d < 3; ++d) t[d] = digits.source(m, q, d);
}

// The problem the CUTLASS kernels see and the two maps.
struct SpaceToDepth {
  ConvGeometry problem;  // filter R'0 x R'1 x 1 over C' channels, stride 1, no padding
  PhaseMap activations, filter;
};

// The lowering of g, or nullopt where it does not apply: groups, dilation, negative pads,
// fewer than 32 wide channels (half a 64-deep K step: im2col's one patch matrix wastes less),
// extents past 32 bits.
std::optional<SpaceToDepth> space_to_depth_lowering(const ConvGeometry& g);

// wide = the wide form of plain (zero in the padding and the channels past used_channels()).
void record_space_to_depth(Context& ctx, const PhaseMap& m, const DeviceTensor& plain,
                           const DeviceTensor& wide);
// plain = the fold of wide: each plain element the sum (in f32, rounded once) of the wide
// elements that hold it.
void record_depth_to_space(Context& ctx, const PhaseMap& m, const DeviceTensor& wide,
                           const DeviceTensor& plain);

}  // namespace fusebox::cuda
