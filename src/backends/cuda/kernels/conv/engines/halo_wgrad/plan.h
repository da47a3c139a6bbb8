// Planning the halo weight gradient (kernels/conv/engines/halo_wgrad/): a 3x3, stride-1, pad-1 2-D
// wgrad whose x rows are fetched once for all nine taps. Host code without CUDA types, so the
// refusals and the split are tested without a GPU.
//
//   if (auto why = halo_wgrad::cannot_implement(g, dtype, compute_capability, aligned)) ...
//   halo_wgrad::Plan plan = halo_wgrad::make_plan(g, dtype, sm_count);
//   halo_wgrad::record(ctx, plan, g, operands, reads, written, partial);   // halo_wgrad.h
//
// Why a kernel of its own: as a GEMM, dw [K][9 C] = dy^T [K][P] x im2col(x) [P][9 C] over the
// P = N*H*W pixels. With K = 64 filters (ResNet-50's layer 1) every CUTLASS tile is one tile
// high and reads its nine im2col'd taps of x through L2 again per column tile: 0.46x cuDNN on
// the H200 (bench/results/2026-11-28_h200_session22_dense/). Here a CTA keeps three x rows
// (with their one-column halos) in shared memory and reduces dy's row against all nine taps:
//
//   op     M           N                 K (reduced)              A (smem)        B (smem)
//   wgrad  64 filters  3 x 64 channels   W' pixels of one row     dy row, read    x row h+r-1
//          (a block)   (taps s of row r) (per output row h)       transposed      shifted by s
//
// Warpgroup r of three owns tap row r: per output row, W'/16 wgmmas of m64 n192 k16 whose B is
// x's row h + r - 1 stored three times, shifted by s - 1 columns (so every descriptor starts
// on a swizzle atom: wgmma's B cannot start mid-atom). Rows wider than 64 pixels are cut into
// segments of equal width; each segment's row is padded to W' (a multiple of 16 pixels) with
// zeros. The CTAs of a channel block split the N*H*segments rows into runs; each writes f32
// sums to its slice of a partial buffer, added in order by sum_splits (deterministic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "backends/common/conv_geometry.h"
#include "fusebox/core/dtype.h"

namespace fusebox::cuda::halo_wgrad {

constexpr int kChannelBlock = 64;  // x channels and dy filters per CTA: one 128-byte row
constexpr int kMaxRowPixels = 64;  // a segment's padded width W' at most

// Why the kernel cannot run the problem (nullopt: it can): a device other than compute
// capability 9.0, an op other than a 2-D, ungrouped 3x3 stride-1 dilation-1 wgrad with pads of
// 1 (dy as large as x), dtypes other than bf16 / f16, channel or filter counts that are not
// multiples of 64, operands not 16-byte aligned, tensors past 2^31 elements.
std::optional<std::string> cannot_implement(const ConvGeometry& g, DType dtype,
                                            int compute_capability, bool aligned);

struct Plan {
  DType dtype = DType::bf16;
  int segments = 1;       // of each row
  int segment_width = 0;  // columns of a segment (the last may have fewer)
  int row_pixels = 0;     // W': segment_width rounded up to 16 (a wgmma K step)
  int k_blocks = 0, c_blocks = 0;
  int64_t rows = 0;  // N * H * segments: the runs the reduction is cut into
  int splits = 1;    // CTAs per channel block, each a run of consecutive rows
  size_t partial_bytes = 0;

  // "halo wgrad 3x3 bf16 sm90, rows of 64 px, 132 splits"
  std::string describe() const;
};

// The plan for a problem cannot_implement accepted: splits so that the channel blocks' CTAs
// fill the device's `sm_count` multiprocessors once (one CTA an SM), at least 2 rows a run.
Plan make_plan(const ConvGeometry& g, DType dtype, int sm_count);

// Whether the default policy (kernels/conv/engines.cpp) runs an accepted problem here rather
// than on CUTLASS's wgrad: 64 filters (one block).
bool preferred(const ConvGeometry& g);

}  // namespace fusebox::cuda::halo_wgrad
