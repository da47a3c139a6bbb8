// Tuning variants of the layer_norm / rms_norm register-path and staged kernels
// (kernels/norm/forward.cu, backward*.cu), so that one benchmark run can compare a few layouts.
//
// The variant in use is FUSEBOX_NORM_VARIANT (an index into norm_variants(); default 0)
// unless select_norm_variant() was called. Every variant computes the same function with
// the same arithmetic per element; only the layout (threads per row, vectors per thread,
// the register or staged path), the prefetch of the next row, where the backward's column
// sums live and whether their partial rows are dropped from L2 differ, so any variant
// passes the same tests (the sums' order of additions differs between layouts).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "fusebox/core/dtype.h"

namespace fusebox::cuda {
struct Context;
}

namespace fusebox::cuda::norm {

enum class StagedUse {
  never,
  always,           // first, for every width it fits
  for_shared_sums,  // backward: where the register path would keep the column sums in
                    // shared memory
  for_long_rows,    // forward: rows of kStagedForwardMinVecs 16-byte vectors or more
};
// Forward rows this long (f32 16,384 columns) would hold 32 registers of row data per
// thread on the register path with its prefetch, one block of 1024 per SM.
constexpr int64_t kStagedForwardMinVecs = 4096;

struct Variant {
  const char* name = nullptr;
  int forward_vecs = 2;            // preferred 16-byte vectors per thread (1, 2, 4 or 8), forward
  bool forward_prefetch = true;    // allow loading the next row while reducing the current one
  int backward_vecs = 2;           // the same, backward (x and dy each)
  bool backward_prefetch = false;  // the same, backward
  bool backward_smem_acc = false;  // column sums (dscale, dbias) always in shared memory
  // Rows of at least backward_cluster_min_cols elements: a thread-block cluster of two
  // blocks per row (half the row's registers per SM, so the next row can be prefetched).
  bool backward_cluster = false;
  int backward_cluster_min_cols = 0;
  // Nonzero: first try the backward kernels compiled with a register cap of this many per
  // thread (__launch_bounds__(block, blocks per SM)), some with several row groups per
  // block (fewer blocks, so fewer partial rows of column sums); the layouts tried are those
  // of kernels/norm/backward.cu's capped_layouts that spill nothing. 0: the default bounds only.
  int backward_max_regs = 0;
  // When the staged path is tried (kernels/norm/backward_staged.cu: x and dy copied into shared
  // memory rows ahead with cp.async, several row groups per block, column sums in
  // registers); the layouts above where it does not fit.
  StagedUse backward_staged = StagedUse::never;
  // The backward's partial column sums dropped from L2 once summed (never written back).
  bool discard_partials = false;
  // Blocks form thread-block clusters of up to this many (2, 4 or 8; 0: none) and write
  // one partial row per cluster, summed through distributed shared memory
  // (kernels/norm/backward_impl.cuh: write_cluster_partials), where a cluster size keeps the whole
  // grid: on LayerNorm's 80-register layout of the register path (cluster_partials), on
  // the staged path (staged_cluster_partials).
  int cluster_partials = 0;
  int staged_cluster_partials = 0;
  // When the forward's staged path is tried (kernels/norm/forward_staged.cu: x copied into shared
  // memory rows ahead with cp.async); the register path where it does not fit.
  StagedUse forward_staged = StagedUse::never;
};

std::span<const Variant> norm_variants();
const Variant& norm_variant();        // the one in use
void select_norm_variant(int index);  // for benchmarks; throws on a bad index

// The layout the current variant picks for contiguous, aligned [rows, cols] data of
// `dtype` (layer_norm when centre, else rms_norm), as text for benchmark tables:
// "R=256 V=2 prefetch grid=528 block=256" (backward: "acc=regs" or "acc=smem"), or
// "long-row" for the scalar fallback.
std::string forward_layout(Context& ctx, DType dtype, int64_t rows, int64_t cols, bool centre);
std::string backward_layout(Context& ctx, DType dtype, int64_t rows, int64_t cols, bool centre);
inline std::string norm_layout(Context& ctx, DType dtype, int64_t rows, int64_t cols, bool centre,
                               bool backward) {
  return backward ? backward_layout(ctx, dtype, rows, cols, centre)
                  : forward_layout(ctx, dtype, rows, cols, centre);
}

}  // namespace fusebox::cuda::norm
