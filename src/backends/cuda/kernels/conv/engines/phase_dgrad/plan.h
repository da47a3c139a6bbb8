// Planning the phase dgrad (kernels/conv/engines/phase_dgrad/): the backward-data convolution of a
// 3x3, stride-2, pad-1 2-D convolution with its four stride phases in one CTA. Host code
// without CUDA types, so the refusals are tested without a GPU.
//
//   if (auto why = phase_dgrad::cannot_implement(g, dtype, compute_capability, aligned)) ...
//   phase_dgrad::Plan plan = phase_dgrad::make_plan(g, dtype, sm_count);
//   phase_dgrad::record(ctx, plan, g, dy, w, dx, reads, written);        // phase_dgrad.h
//
// Why a kernel of its own: dx's pixel (2i + a, 2j + b) is reached by the taps of phase (a, b)
// alone -- 1, 2, 2 and 4 of the nine -- so CUTLASS runs four unit-stride dgrads (cutlass/
// plan.h DgradPhase) whose CTAs are short (2 to 8 K steps of 64 for 128 channels) and
// stall their SMs in prologue and epilogue: ResNet-50's layer-2 dgrad 0.70x cuDNN on an H200.
// Here one CTA computes all four phases of a block of lattice points (i, j). The four phases
// read dy at only four shifts of the lattice point, S(di, dj) = dy[i + di][j + dj]:
//
//   phase (a, b)   dx[2i + a][2j + b][c] = sum over k of
//   (0, 0)         S00 w[k][1][1][c]
//   (0, 1)         S00 w[k][1][2][c] + S01 w[k][1][0][c]
//   (1, 0)         S00 w[k][2][1][c] + S10 w[k][0][1][c]
//   (1, 1)         S00 w[k][2][2][c] + S01 w[k][2][0][c] + S10 w[k][0][2][c] + S11 w[k][0][0][c]
//
//   op     M                        N              K (reduced)   A (smem)         B (smem)
//   dgrad  128 lattice points       64 channels c  K filters of  dy at one shift  w's taps,
//          (n, i, j) x 4 phases     (a block)      dy, by 64     (K-major)        c fastest
//
// so the GEMM is nine 64-deep products a K step, one A (a shift of dy) shared by the taps
// that read it, four accumulators (one a phase) per warpgroup. The CTAs are persistent and
// each keeps its channel block's whole filter (9 taps x K filters x 64 channels) in shared
// memory, so only dy streams: K is at most 128 (ResNet-50's layer 2; its layers 3 and 4,
// with 256 and 512 filters, run well on CUTLASS's phases).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backends/common/conv_geometry.h"
#include "fusebox/core/dtype.h"

namespace fusebox::cuda::phase_dgrad {

constexpr int kChannelBlock = 64;   // dx channels per CTA and dy filters per K step
constexpr int kLatticeBlock = 128;  // lattice points per tile: two warpgroups of 64
constexpr int kMaxFilterSteps = 2;  // K / 64 at most: the filter block in shared memory

// Why the kernel cannot run the problem (nullopt: it can): a device other than compute
// capability 9.0, an op other than a 2-D, ungrouped 3x3 dgrad of stride 2, dilation 1 and
// leading pads 1, dtypes other than bf16 / f16, channel or filter counts that are not
// multiples of 64, more than 128 filters, operands not 16-byte aligned, tensors past 2^31
// elements.
std::optional<std::string> cannot_implement(const ConvGeometry& g, DType dtype,
                                            int compute_capability, bool aligned);

struct Plan {
  DType dtype = DType::bf16;
  int64_t lattice_h = 0, lattice_w = 0;  // ceil(H / 2), ceil(W / 2)
  int64_t tiles = 0;                     // of kLatticeBlock lattice points over N * LH * LW
  int c_blocks = 0;
  int ctas = 0;  // persistent, a multiple of c_blocks: CTA b takes block b % c_blocks's tiles

  // "phase dgrad 3x3s2 bf16 sm90, 392 x 2 tiles on 132 CTAs"
  std::string describe() const;
};

// The plan for a problem cannot_implement accepted: one CTA an SM (at most one a tile), as
// many for each channel block.
Plan make_plan(const ConvGeometry& g, DType dtype, int sm_count);

}  // namespace fusebox::cuda::phase_dgrad
