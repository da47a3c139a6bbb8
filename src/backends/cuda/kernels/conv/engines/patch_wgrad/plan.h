// Planning the patch weight gradient (kernels/conv/engines/patch_wgrad/): the wgrad of a 7x7 filter
// over an image of at most 4 channels (an RGB stem), its patches gathered in shared memory.
// Host code without CUDA types, so the refusals and the split are tested without a GPU.
//
//   if (auto why = patch_wgrad::cannot_implement(g, dtype, compute_capability, aligned)) ...
//   patch_wgrad::Plan plan = patch_wgrad::make_plan(g, dtype, sm_count);
//   patch_wgrad::record(ctx, plan, g, operands, reads, written, partial);   // patch_wgrad.h
//
// Why a kernel of its own: as a GEMM, dw [K][R*S*C] = dy^T [K][P] x patches [P][R*S*C] over the
// P = N*OH*OW output pixels. With C = 3 TMA cannot move x's rows, so the CUTLASS path writes
// the patch matrix out (ResNet-50's stem: 802816 x 152, 244 MB) and reads it back: 0.70x
// cuDNN, which is itself slow here (51 TFLOP/s on the H200). Here the patches never leave
// shared memory:
//
//   op     M            N                         K (reduced)            A          B
//   wgrad  64 filters   R*S*4 (tap, channel pad   OW' pixels of one      dy's row   the row's
//          (a block)    to 4), 196 -> 256         output row             (MN-major) patches
//
// Per output row (n, oh) a CTA loads x's R input rows (channels padded to 4: one 8-byte
// vector a pixel), gathers the row's patches [OW'][tap, c] into wgmma's MN-major layout (one
// 8-byte copy per pixel and tap) and reduces dy's row against them: warpgroup 0 the columns
// 0..127, warpgroup 1 128..255 (m64 n128 k16 each; past 195 zeros). The CTAs of a filter block
// split the N*OH rows into runs; f32 sums per run, added in order by sum_splits (deterministic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "backends/common/conv_geometry.h"
#include "fusebox/core/dtype.h"

namespace fusebox::cuda::patch_wgrad {

constexpr int kFilterBlock = 64;     // dy's filters per CTA: one 128-byte row
constexpr int kMaxRowPixels = 128;   // OW' (OW rounded up to 16) at most
constexpr int kMaxXRowPixels = 292;  // x's row as stored, (OW - 1) * stride + 7, at most
constexpr int kTap = 7;              // R = S = 7
constexpr int kChannels = 4;         // x's channels padded to 4

// Why the kernel cannot run the problem (nullopt: it can): a device other than compute
// capability 9.0, an op other than a 2-D ungrouped 7x7 wgrad of dilation 1 with at most 4 input
// channels, filters in multiples of 64, output rows past 128 pixels or reading x rows past 292
// pixels, pads past the filter,
// dtypes other than bf16 / f16, unaligned operands, tensors past 2^31 elements.
std::optional<std::string> cannot_implement(const ConvGeometry& g, DType dtype,
                                            int compute_capability, bool aligned);

struct Plan {
  DType dtype = DType::bf16;
  int row_pixels = 0;    // OW': OW rounded up to 16 (a wgmma K step)
  int x_row_pixels = 0;  // x's row as stored: (OW - 1) * stride + 7 pixels from -pad
  int k_blocks = 0;
  int64_t rows = 0;  // N * OH: the runs the reduction is cut into
  int splits = 1;    // CTAs per filter block, each a run of consecutive output rows
  size_t partial_bytes = 0;

  // "patch wgrad 7x7 bf16 sm90, rows of 112 px, 132 splits"
  std::string describe() const;
};

// The plan for a problem cannot_implement accepted: runs so that the filter blocks' CTAs fill
// the device's `sm_count` multiprocessors once (one CTA an SM), at least 2 rows a run.
Plan make_plan(const ConvGeometry& g, DType dtype, int sm_count);

}  // namespace fusebox::cuda::patch_wgrad
