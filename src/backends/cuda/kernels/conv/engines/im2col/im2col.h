// im2col and col2im for 16-bit channels-last convolutions whose channel count keeps them off
// the tensor-core kernels' 16-byte rows (an RGB stem's C = 3): the patches written out as a
// matrix turn the convolution into a pointwise one, a plain GEMM (kernels/conv/engines/cutlass/).
//
//   col [N*O0*O1*O2][width]: row (n, o) holds x's patch under output o, column
//   ((r0*R1 + r1)*R2 + r2)*C + c the tap's channel c (zero where the tap is padding);
//   columns past taps*C are zeros, width a multiple of 8 (16-byte rows).
//
//   fprop  y  = col(x) w_wide^T         (pointwise fprop, w padded to width columns)
//   wgrad  dw = dy^T col(x)             (pointwise wgrad, its first taps*C columns)
//   dgrad  dx = col2im(dy w_wide)       (pointwise dgrad, then each dx element sums the
//                                        columns of the taps that read it)
// Strided few-channel convolutions with enough wide channels (the stem) take the
// space-to-depth lowering instead (space_to_depth.h: a third of the bytes); im2col serves the
// rest (3x3 on 3 channels, 1x1 strided on 5).
#pragma once

#include <cstdint>

#include "backends/common/conv_geometry.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda {

// Columns of g's patch matrix: taps * C rounded up to 8.
int64_t im2col_width(const ConvGeometry& g);

// col = im2col(x); x dense NDHWC [N, D0, D1, D2, C], col dense [N*O, width]; bf16 or f16.
void record_im2col(Context& ctx, const ConvGeometry& g, const DeviceTensor& x,
                   const DeviceTensor& col);
// dx = col2im(dcol): dx[n, d, c] = sum over the taps r reaching d of dcol[(n, o)][r*C + c],
// o the output position whose window puts tap r on d; dcol dense [N*O, width], dx dense
// NDHWC; sums in f32, rounded once.
void record_col2im(Context& ctx, const ConvGeometry& g, const DeviceTensor& dcol,
                   const DeviceTensor& dx);

}  // namespace fusebox::cuda
