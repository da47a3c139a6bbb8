// Planning the depthwise convolutions (engines/depthwise/: groups == C == K, one filter per
// channel, NHWC): whether the kernels take a problem and which loop runs it. Host code without
// CUDA types, so the refusals and the kernel choice are tested without a GPU.
//
//   if (auto why = depthwise::cannot_implement(op, g, dtype)) ... another engine
//   auto rows = depthwise::rows_kernel_shape(g, op);      // {0, 0}: the generic kernels
//   bool ring = depthwise::ring_shape(g, op, rows, vec);  // the shared-memory ring kernels
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "fusebox/core/dtype.h"

namespace fusebox::cuda::depthwise {

constexpr int kMaxFilterWidth = 8;  // wgrad keeps one accumulator vector per r2

// Channels per 16-byte vector: 8 for 16-bit types, 4 for f32.
int vector_width(DType dtype);

// Why the kernels cannot run the problem (nullopt: they can): groups != C or K != C, dtypes
// other than f32 / f16 / bf16, C not a multiple of the vector width, a wgrad filter wider than
// kMaxFilterWidth, tensors past 2^31 elements. (The operands' alignment is the engine's check.)
std::optional<std::string> cannot_implement(ConvOp op, const ConvGeometry& g, DType dtype);

// The rows kernels' (filter width, stride) along the last dim, or {0, 0} where they do not
// apply: filters 3, 5 or 7 wide, stride 1 or 2 and no dilation there; dgrad stride 1 on every
// dim (a strided dgrad skips taps per phase: the generic kernel).
std::pair<int, int> rows_kernel_shape(const ConvGeometry& g, ConvOp op);

// Whether the ring kernels take the problem: a 2-D one (dim 0 of the geometry untouched) of
// the rows kernels' shape whose C / V divides by 4 (the channel chunks measured: 4 to 16
// vectors); fprop / dgrad at stride 1 with rows of at least 7 outputs; wgrad with at most 8
// filter rows (a warp per filter row).
bool ring_shape(const ConvGeometry& g, ConvOp op, std::pair<int, int> rows, int vec_width);

}  // namespace fusebox::cuda::depthwise
