// Planning the Hopper convolutions built on CUTLASS 3's implicit-GEMM collective
// (kernels/conv/engines/cutlass/): whether a problem can run on them and why not, which tile, how
// many batch chunks a weight gradient is split into, and which epilogue. Host code without
// CUDA or CUTLASS types, so the refusals and choices are tested without a GPU.
//
//   if (auto why = cutlass_conv::cannot_implement(op, g, dtype, epilogue, facts)) ... igemm
//   cutlass_conv::Plan plan = cutlass_conv::make_plan(op, g, dtype, epilogue, sm_count, tile);
//   cutlass_conv::record(ctx, plan, g, operands, reads, written);      // launch.h
//
// What the collective is (docs/implicit_gemm.md): one main loop for the three ops, operands
// fetched by TMA (the activation, or dy for dgrad, in im2col mode: the tensor-memory
// accelerator computes the gather the index maps of implicit_gemm/operands.cuh compute in
// registers), a producer warp feeding a multi-stage shared-memory pipeline through
// mbarriers, a consumer warpgroup on wgmma. The GEMM views (M x N, reduced over K):
//
//   op     M            N            K             A (im2col?)     B
//   fprop  N*O0*O1*O2   K            C*R0*R1*R2    x   (im2col)    w  [K][RSC]
//   dgrad  N*D0*D1*D2   C            K*R0*R1*R2    dy  (im2col)    w  [K][RSC] read C-major
//   wgrad  K            C*R0*R1*R2   N*O0*O1*O2    dy  (tiled)     x  (im2col)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/common/activation.h"
#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "fusebox/core/dtype.h"

namespace fusebox::cuda::cutlass_conv {

// CTA tiles M x N, K step 64. Instantiated (fprop_sm90a.cu, dgrad_sm90a.cu, wgrad_sm90a.cu):
// fprop and dgrad 128x128 and 128x64; wgrad 128x128 and 64x128.
enum class Tile : uint8_t { t128x128, t128x64, t64x128 };
const char* tile_name(Tile t);                            // "cutlass128x64"
std::optional<Tile> parse_tile(const std::string& name);  // the inverse
constexpr int tile_m(Tile t) {
  return t == Tile::t64x128 ? 64 : 128;
}
constexpr int tile_n(Tile t) {
  return t == Tile::t128x64 ? 64 : 128;
}
bool tile_available(ConvOp op, Tile t);

// The epilogue CUTLASS computes per output element (per-column bias, the output channel):
//   D = clamp(acc + bias[n] + (source ? residual : 0), lower, upper)
// Ours is residual_activation(activation(acc + bias) + residual); it maps when the
// activations it uses are none, relu or clip and a residual comes with activation none.
struct Epilogue {
  bool bias = false;
  bool residual = false;
  float lower = -3.4028234663852886e38f;  // -FLT_MAX: no lower clamp
  float upper = 3.4028234663852886e38f;
  // D = acc: no bias, residual or clamp (a convolution followed by a batch norm).
  bool plain() const {
    return !bias && !residual && lower == Epilogue{}.lower && upper == Epilogue{}.upper;
  }
};
// Why the epilogue cannot be computed by CUTLASS's (nullopt: it can; *out is set).
std::optional<std::string> map_epilogue(bool bias, const ActivationFn& activation, bool residual,
                                        const ActivationFn& residual_activation, Epilogue* out);

// What the caller knows about the device and the operands.
struct Facts {
  int compute_capability = 0;  // 90: the sm_90a objects run
  bool aligned = true;         // every operand's address is a multiple of 16 bytes
};

// Why the CUTLASS kernels cannot run the problem (nullopt: they can): a device other than
// compute capability 9.0, dtypes other than bf16 / f16, groups, channel counts that are not
// multiples of 8 (TMA rows of 16 bytes), misaligned operands, strided dgrad whose phases
// (dgrad_phases) do not fit, a dgrad bias with an empty phase, and the TMA im2col limits
// of a 3-D descriptor (pads and corners within 16, filter reach (R-1)*dilation below 31),
// tensors past 2^31 elements.
std::optional<std::string> cannot_implement(ConvOp op, const ConvGeometry& g, DType dtype,
                                            const Facts& facts);

// Strided dgrad as stride phases (as implicit_gemm/ does, here on CUTLASS's unit-stride
// dgrad): the dx positions d = phase + stride * j are reached only by the taps r with
// (phase + pad - r * dilation) divisible by the stride; those taps, every step-th from
// first_tap, form a sub-filter, and dx's phase is a unit-stride dgrad of dy with it:
//   dx[phase + s j] = sum over t, k of dy[j + pad' - t dil'] w[k][first + t step][c]
// pad' = (phase + pad - first * dilation) / s, dil' = dilation * step / s. Each phase is
// one launch writing dx's sub-lattice (its strides s times dx's); a phase without taps
// is zeros (dx is cleared first).
struct DgradPhase {
  int64_t phase[3] = {0, 0, 0};
  int64_t extent[3] = {1, 1, 1};  // J: positions of dx in this phase
  int64_t first_tap[3] = {0, 0, 0}, step[3] = {1, 1, 1}, taps[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0}, pad_hi[3] = {0, 0, 0}, dilation[3] = {1, 1, 1};
  bool empty() const {
    return taps[0] * taps[1] * taps[2] * extent[0] * extent[1] * extent[2] == 0;
  }
};
// The phases of a strided dgrad, or why they cannot run on CUTLASS's dgrad (a phase whose
// pads would be negative or past TMA's limits).
std::optional<std::string> dgrad_phases(const ConvGeometry& g, std::vector<DgradPhase>* out);
// The unit-stride problem of one phase: dx's extents J, the sub-filter, pads and dilation.
ConvGeometry phase_geometry(const ConvGeometry& g, const DgradPhase& p);

// A 1x1 convolution with unit strides and no padding: a plain GEMM over the channels-last
// tensors (gemm_instance.cuh runs the three ops of these on a persistent GEMM kernel).
bool is_pointwise(const ConvGeometry& g);

// The tile on which a pointwise wgrad runs as one unsplit GEMM writing dw directly, or
// nullopt: the first of 128x128 and 64x128 (or `forced`, if one of them) whose K x C output
// tiles give at least three quarters of the SMs one each. ResNet-50's layer-4 1x1 weight
// gradients (3136 pixels, 2048 x 512): 64 tiles of 128x128, 128 of 64x128 -> 23 us on the
// im2col kernel's chunks, ~12 us so (H200, bench/results/2026-11-28_h200_session22_dense/).
std::optional<Tile> direct_wgrad_tile(const ConvGeometry& g, int sm_count,
                                      std::optional<Tile> forced = std::nullopt);

struct Plan {
  ConvOp op = ConvOp::fprop;
  DType dtype = DType::bf16;
  Tile tile = Tile::t128x128;
  bool gemm = false;  // a pointwise problem: the ping-pong GEMM
  Epilogue epilogue;
  // wgrad: the reduction is cut into `chunks`, each writing its f32 sums to its own slice of
  // a partial buffer; a second kernel adds them in order (deterministic). chunks == 1 on the
  // im2col kernel still goes through the f32 buffer (one rounding into dw's dtype at the end).
  //   im2col kernel: runs of `chunk_images` images (the last may have fewer), one graph node
  //     each (independent: they run concurrently).
  //   GEMM (pointwise): runs of `chunk_rows` pixels (the last may have fewer), the batch mode
  //     of one persistent GEMM (the short last run a second launch): no split-K in CUTLASS's
  //     sm90 conv kernel, but a batched GEMM is one. With output tiles enough for the GPU
  //     (direct_wgrad_tile) there is one chunk and no partial buffer (partial_bytes 0): the
  //     GEMM's epilogue writes dw in its dtype.
  int64_t chunks = 1;
  int64_t chunk_images = 0;
  int64_t chunk_rows = 0;
  size_t partial_bytes = 0;
  // Strided dgrad: its phases (empty otherwise); zero_fill when some phase has no taps.
  std::vector<DgradPhase> phases;
  bool zero_fill = false;

  // "cutlass128x128x64 sm90 bf16 tma-im2col, 16 chunks", "cutlass128x64x64 sm90 bf16 gemm"
  std::string describe() const;
};

// The plan for a problem cannot_implement accepted. sm_count: the device's multiprocessors
// (tiles and chunks aim for full waves). `tile`: forced (benchmarks, autotuning), if
// available for the op.
Plan make_plan(ConvOp op, const ConvGeometry& g, DType dtype, const Epilogue& epilogue,
               int sm_count, std::optional<Tile> tile = std::nullopt);

}  // namespace fusebox::cuda::cutlass_conv
