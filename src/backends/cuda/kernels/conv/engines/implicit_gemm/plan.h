// Planning the implicit-GEMM convolutions (kernels/conv/engines/implicit_gemm/): whether a problem
// can run on them and why not (CUTLASS's can_implement), which tile, how many stride phases
// (dgrad) and K splits (wgrad), and the kernel parameters. Host code without CUDA types: the
// refusals, the phase tables and the tile choice are tested without a GPU.
//
//   if (auto why = igemm::cannot_implement(op, geometry, dtype)) ... conv_direct, report *why
//   igemm::Plan plan = igemm::make_plan(op, geometry, dtype, {.allow_tf32, .aligned}, sm_count);
//   plan.params.x = ...; run_plan(ctx, plan, ...)              // implicit_gemm.h
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/params.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "fusebox/core/dtype.h"

namespace fusebox::cuda::igemm {

// CTA tiles (M x N). mma.sync (mainloop.cuh, any sm_80+ GPU): K step 32, four warps each:
// 128x128 (64x64 per warp), 128x64, 64x128, 64x64 (32x32 per warp). wgmma (mainloop_sm90.cuh,
// compute capability 9.0 only): K step 64, two warpgroups of 64 rows: wg128x128, wg128x64.
enum class TileShape : uint8_t { t128x128, t128x64, t64x128, t64x64, wg128x128, wg128x64 };
bool is_wgmma(TileShape t);
int tile_k(TileShape t);             // 32 or 64
const char* tile_name(TileShape t);  // "128x128"
int tile_m(TileShape t);
std::optional<TileShape> parse_tile(const std::string& name);  // "128x64" -> t128x64
int tile_n(TileShape t);
constexpr int kTileK = 32;  // the mma.sync tiles'
constexpr int kStages = 4;

// How products are computed: tensor cores (bf16 / f16 with f32 accumulation; TF32 for f32),
// or exact f32 multiply-adds (f32 with FUSEBOX_ALLOW_TF32=0; the tests' reference mode).
enum class Math : uint8_t { tensor_core, exact };

struct PlanOptions {
  bool allow_tf32 = true;         // f32: TF32 tensor cores, else exact
  bool aligned = true;            // every operand's address is a multiple of 16 bytes
  bool wgmma = false;             // the device runs sm_90a code (compute capability 9.0)
  std::optional<TileShape> tile;  // forced (benchmarks, autotuning); else the heuristic's
  int splits = 0;                 // wgrad: forced K splits (0: the heuristic's)
};

struct Plan {
  ConvOp op = ConvOp::fprop;
  DType dtype = DType::f32;
  Math math = Math::tensor_core;
  bool vector = false;  // 16-byte cp.async loads (else element loads: odd channel counts)
  TileShape tile = TileShape::t64x64;
  Params params;  // all but the pointers
  uint32_t grid[3] = {1, 1, 1};
  size_t partial_bytes = 0;  // wgrad's f32 split sums (0: written straight to dw)

  // "igemm bf16 tensor-core 128x128x32 vec8, 4 phases, 6 splits"
  std::string describe() const;
};

// Why the implicit GEMM cannot run the problem (nullopt: it can): dtypes other than f32,
// f16, bf16; tensors or GEMM extents past 2^31 elements; a strided dgrad with more than
// kMaxPhases stride phases or a filter with more than kMaxTaps taps.
std::optional<std::string> cannot_implement(ConvOp op, const ConvGeometry& g, DType dtype);

// Whether tile t is compiled for the combination (the dispatch in launch.cuh and
// conv_sm90a.cu instantiates exactly these): mma.sync tiles for every op, the 64x64 tile alone
// for exact f32 and element loads, 128x128 not for f32; wgmma tiles for bf16 / f16 fprop and
// dgrad on the vector path, on a device that runs them (`wgmma`).
bool tile_available(ConvOp op, DType dtype, Math math, bool vector, bool wgmma, TileShape t);

// The plan for a problem cannot_implement accepted. sm_count: the device's multiprocessors
// (the tile and split heuristics aim for full waves).
Plan make_plan(ConvOp op, const ConvGeometry& g, DType dtype, const PlanOptions& options,
               int sm_count);

}  // namespace fusebox::cuda::igemm
