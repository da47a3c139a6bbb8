// The short-sequence attention forward (short_attention.cu): one kernel for the many small
// problems of windowed attention (Swin's 7x7 windows: Tq = Tk = 49, d = 32), where cuDNN's
// flash kernel, made for long sequences, leaves the GPU mostly idle. attention.cu tries it
// first.
//
// Takes: bf16 and f16; Tq, Tk <= 64; d, dv <= 64 and multiples of 8 (16-byte rows); the
// scale, causal masking (key j kept for query i when j <= i), an f32 additive bias read
// through broadcast strides, and lse (training forward). Forward only.
#pragma once

#include <string>

#include "backends/cuda/cudnn/attention.h"
#include "backends/cuda/kernels.h"

namespace fusebox::cuda {

// The bias's element strides over (batch, head, query, key); 0 along the dims it broadcasts.
struct BiasStrides {
  int64_t batch = 0, head = 0, query = 0, key = 0;
};

inline constexpr int64_t kShortAttentionMaxTokens = 64;  // Tq, Tk
inline constexpr int64_t kShortAttentionMaxDim = 64;     // d, dv

// Whether the kernel takes `p` (dtype, extents, direction); `why` says why not. Host only.
bool short_attention_takes(const AttentionProblem& p, std::string& why);

// Records the kernel for `p` (short_attention_takes(p) holds): y [B, H, Tq, dv] (and lse
// [B, H, Tq] unless null) from contiguous q, k, v; `bias` f32 or null. False with `why`
// when an operand is not 16-byte aligned.
bool record_short_attention(Context& ctx, const Node& n, const AttentionProblem& p,
                            const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                            const DeviceTensor& y, float* lse, const float* bias,
                            const BiasStrides& bias_strides, const BufferList& reads,
                            const BufferList& writes, std::string& why);

}  // namespace fusebox::cuda
