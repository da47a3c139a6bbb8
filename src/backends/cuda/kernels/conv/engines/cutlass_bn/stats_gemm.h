// Issue 40 item 5's first kernel (docs/fusion.md, "Batch-norm statistics in convolution
// epilogues"): a 1x1 stride-1 forward convolution over channels-last bf16 tensors, the GEMM
//
//   y [m][n] = x [m][k] * w [n][k]^T        (m pixels, k input and n output channels)
//
// on CUTLASS's ping-pong kernel, whose epilogue also writes, for each tile of 128 pixels, each
// output channel's sum and sum of squares of y as stored (bf16, rounded to nearest): per-tile
// partials, dense f32 [partial_rows(m)][partial_cols(n)], every slot written (padding 0), no
// atomics (the same bits whichever CTA ran the tile). A batch norm's statistics are those
// partials merged, in place of its pass over y: a conv with channel_stats (ir/ops.h) runs it
// (kernels/conv/conv.cpp). One tile, 128 x 64: a 128 x 128 instance spilled (a 672-byte stack
// frame; 0.91 ms against 0.21 on ResNet-50's 56x56 64 -> 256 layer, H200), and CUTLASS's
// per-element bounds test in the reductions cost 1.5x (0.32 ms), so both went
// (bench/results/2026-12-02_h200_issue40_session50/).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backends/cuda/kernels.h"

namespace fusebox::cuda::cutlass_bn {

constexpr int64_t kStatsTileM = 128;  // pixels a partial row covers
constexpr int64_t kStatsTileN = 64;   // output channels a CTA's tile covers

struct StatsGemmCall {
  int64_t m = 0, n = 0, k = 0;
  const void* x = nullptr;   // [m][k] bf16
  const void* w = nullptr;   // [n][k] bf16
  void* y = nullptr;         // [m][n] bf16
  float* sums = nullptr;     // [partial_rows][partial_cols]
  float* squares = nullptr;  // [partial_rows][partial_cols]
};

inline int64_t stats_partial_rows(int64_t m) {
  return (m + kStatsTileM - 1) / kStatsTileM;
}
inline int64_t stats_partial_cols(int64_t n) {
  return (n + kStatsTileN - 1) / kStatsTileN * kStatsTileN;
}

// Records the kernel (bf16 only, compute capability 9.0), or says why CUTLASS refuses the
// problem (nothing recorded then). `reads`: x and w; `writes`: y and both partials.
std::optional<std::string> record_stats_gemm(Context& ctx, const StatsGemmCall& call,
                                             const BufferList& reads, const BufferList& writes);

}  // namespace fusebox::cuda::cutlass_bn
