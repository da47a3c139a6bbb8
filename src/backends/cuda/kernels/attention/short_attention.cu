// The short-sequence attention forward (short_attention.h): many small problems (Tq, Tk <= 64,
// d, dv <= 64), each done in one pass with all of its keys on chip, on tensor cores.
//
// Algorithm. A thread block takes `per_block` consecutive (batch, head) problems; a problem
// gets one warp per 16 query rows (warps_per_problem = ceil(Tq / 16)), and per_block is
// chosen so that a block has about 4 warps (4 problems of Tq <= 16, 2 of Tq <= 32, ...).
//   1. The block copies every problem's Q [Tq, d], K [Tk, d] and V [Tk, dv] into shared
//      memory with 16-byte cp.async, zero-filling the tiles' padding: Q's rows up to the
//      warps' 16-row tiles, K's and V's up to KP (32 or 64) rows, the columns up to DP / DVP
//      (32 or 64). Zeros keep the padding finite: masked scores multiply V's padded rows.
//   2. Each warp: S = Q K^T for its 16 rows x KP keys with mma.sync m16n8k16 (f32
//      accumulators, the fragments from ldmatrix), s = scale S + bias (f32, read from
//      global memory through broadcast strides: it is small and shared by many problems, so
//      it lives in L1 / L2), -inf where masked (j >= Tk, causal j > i).
//   3. Row softmax in registers: a row's scores are spread over a quad of lanes, so max and
//      sum are two xor-shuffles; p = exp(s - m), l = sum p (f32).
//   4. O = P V with mma.sync: the S accumulators of two adjacent 8-key tiles are exactly the
//      A fragment of a 16-key step, so P goes from registers to the tensor cores rounded to
//      the io dtype, never through memory. y = O / l, lse = m + log l.
//   5. The warp stages its 16 output rows in its own (already read) rows of the Q tile and
//      writes them to global memory in 16-byte stores.
// A row whose keys are all masked by a -inf bias gets y = 0 and lse = -inf.
//
// Cost (Swin-T stage 1: 24,576 problems of 49 x 49, d = 32): ~12.5 KB of q, k, v, y per
// problem, ~0.3 MFLOP, so the kernel is bound by memory bandwidth; 15 KB of shared memory
// and 128 threads per block.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/device/mma.cuh"
#include "backends/cuda/kernels/attention/short_attention.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kSkew = 8;           // elements padding each shared row: ldmatrix without
                                   // bank conflicts (row strides of 80 or 144 bytes)
constexpr int kWarpsPerBlock = 4;  // the block size aimed at
// Caps registers at 80: Swin's 49 x 49, d 32 variant fits without spills (unbounded it takes
// 89 registers, 5 blocks per SM).
constexpr int kMinBlocksPerSm = 6;
constexpr int kMaxBlockBytes = 48 << 10;  // no opt-in shared memory needed

struct ShortGeometry {
  int tq, tk, d, dv;
  int64_t heads, problems;  // problems = batch * heads
  int per_block, warps_per_problem;
  float scale;
  bool causal;
  BiasStrides bias;
};

// Padded tile extents: KP keys, DP columns of q and k, DVP columns of v.
template <int KP, int DP, int DVP>
struct Tiles {
  static constexpr int q_stride = (DP > DVP ? DP : DVP) + kSkew;  // also holds y's rows
  static constexpr int k_stride = DP + kSkew;
  static constexpr int v_stride = DVP + kSkew;
  // A problem's shared elements: Q's q_rows rows, K's and V's KP rows.
  __host__ __device__ static constexpr int64_t elements(int q_rows) {
    return int64_t(q_rows) * q_stride + KP * k_stride + KP * v_stride;
  }
};

// Copies the rows x cols matrix at src (row length cols, 16-byte aligned) into a padded_rows x
// padded_cols tile at dst (row stride `stride`), zeros outside the matrix. Every thread of
// the block takes part.
template <int padded_cols, class T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int rows, int cols, int padded_rows,
                                          int stride) {
  constexpr int chunks_per_row = padded_cols / 8;  // 8 elements of 16 bits: 16 bytes
  for (int c = threadIdx.x; c < padded_rows * chunks_per_row; c += blockDim.x) {
    const int r = c / chunks_per_row, col = (c % chunks_per_row) * 8;
    const bool valid = r < rows && col < cols;
    cp_async_16(dst + r * stride + col, valid ? src + int64_t(r) * cols + col : src, valid);
  }
}

// Two floats as one register of two 16-bit values, `lo` in the low half (the lower column).
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  } else {
    const __half2 pair = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  }
}

// The reduction over the quad of lanes that holds one accumulator row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <class T, int KP, int DP, int DVP>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocksPerSm)
    short_attention_kernel(const T* __restrict__ q, const T* __restrict__ k,
                           const T* __restrict__ v, const float* __restrict__ bias,
                           T* __restrict__ y, float* __restrict__ lse, ShortGeometry g) {
  using Tile = Tiles<KP, DP, DVP>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* const shared = reinterpret_cast<T*>(shared_bytes);
  const int q_rows = g.warps_per_problem * 16;
  const int64_t per_problem = Tile::elements(q_rows);
  const int64_t first = int64_t(blockIdx.x) * g.per_block;

  // 1. Q, K, V of the block's problems into shared memory.
  for (int p = 0; p < g.per_block && first + p < g.problems; ++p) {
    const int64_t lead = first + p;
    T* const qs = shared + p * per_problem;
    T* const ks = qs + q_rows * Tile::q_stride;
    T* const vs = ks + KP * Tile::k_stride;
    load_tile<DP>(qs, q + lead * g.tq * g.d, g.tq, g.d, q_rows, Tile::q_stride);
    load_tile<DP>(ks, k + lead * g.tk * g.d, g.tk, g.d, KP, Tile::k_stride);
    load_tile<DVP>(vs, v + lead * g.tk * g.dv, g.tk, g.dv, KP, Tile::v_stride);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // the last block barrier: warps past the problem count may leave

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int p = warp / g.warps_per_problem, m0 = (warp % g.warps_per_problem) * 16;
  const int64_t lead = first + p;
  if (lead >= g.problems) return;
  T* const qs = shared + p * per_problem;
  const T* const ks = qs + q_rows * Tile::q_stride;
  const T* const vs = ks + KP * Tile::k_stride;
  // ldmatrix: lane l addresses row l % 8 of 8x8 matrix l / 8.
  const int quad_row = lane / 4, quad_col = (lane % 4) * 2;  // accumulator element positions
  const int low8 = lane % 8, second8 = (lane / 8) % 2 * 8, upper16 = lane / 16 * 8;

  // 2. S = Q K^T: A fragments of Q (matrices: rows 0-7 | 8-15, then columns 8-15), B of K
  // (K's rows are S's columns: keys 0-7, columns 0-7 | 8-15, then keys 8-15).
  float s[KP / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, qs + (m0 + second8 + low8) * Tile::q_stride + kk * 16 + upper16);
#pragma unroll
    for (int n = 0; n < KP / 16; ++n) {
      uint32_t b[4];
      ldmatrix_x4(b, ks + (n * 16 + upper16 + low8) * Tile::k_stride + kk * 16 + second8);
      const uint32_t b_low[2] = {b[0], b[1]}, b_high[2] = {b[2], b[3]};
      mma_16816<T>(s[2 * n], a, b_low);
      mma_16816<T>(s[2 * n + 1], a, b_high);
    }
  }

  // Scale, bias, mask; element e of tile n sits at row m0 + quad_row + 8 (e / 2), key
  // n * 8 + quad_col + e % 2. Padded query rows (zeros in Q) get no bias: nothing is read
  // outside the bias, and they are never stored.
  const float* const bias_of_lead =
      bias != nullptr ? bias + (lead / g.heads) * g.bias.batch + (lead % g.heads) * g.bias.head
                      : nullptr;
  // Within a lead the bias's offsets are below 64 (Tq + Tk): 32-bit arithmetic.
  const int query_stride = int(g.bias.query), key_stride = int(g.bias.key);
  float m[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < KP / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = m0 + quad_row + (e / 2) * 8, j = n * 8 + quad_col + e % 2;
      float x = g.scale * s[n][e];
      const bool keep = j < g.tk && (!g.causal || j <= i);
      if (keep && bias_of_lead != nullptr && i < g.tq)
        x += __ldg(bias_of_lead + i * query_stride + j * key_stride);
      s[n][e] = keep ? x : -INFINITY;
      m[e / 2] = fmaxf(m[e / 2], s[n][e]);
    }
  }

  // 3. Softmax numerators and row sums (a row with no finite score keeps p = 0).
  float l[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m[r] = quad_max(m[r]);
    if (m[r] == -INFINITY) m[r] = 0.f;
  }
#pragma unroll
  for (int n = 0; n < KP / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) l[e / 2] += (s[n][e] = __expf(s[n][e] - m[e / 2]));
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = quad_sum(l[r]);

  // 4. O = P V: A fragments from two score tiles, B of V via transposed ldmatrix (V's rows
  // are keys: keys 0-7 | 8-15, then columns 8-15).
  float o[DVP / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < KP / 16; ++kk) {
    const uint32_t a[4] = {pack_pair<T>(s[2 * kk][0], s[2 * kk][1]),
                           pack_pair<T>(s[2 * kk][2], s[2 * kk][3]),
                           pack_pair<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           pack_pair<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < DVP / 16; ++n) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vs + (kk * 16 + second8 + low8) * Tile::v_stride + n * 16 + upper16);
      const uint32_t b_low[2] = {b[0], b[1]}, b_high[2] = {b[2], b[3]};
      mma_16816<T>(o[2 * n], a, b_low);
      mma_16816<T>(o[2 * n + 1], a, b_high);
    }
  }

  // 5. y = O / l through this warp's rows of the Q tile, then 16-byte stores of the real rows.
  const float inv_l[2] = {l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f};
  __syncwarp();
#pragma unroll
  for (int n = 0; n < DVP / 8; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint32_t*>(qs + (m0 + quad_row + 8 * r) * Tile::q_stride + n * 8 +
                                   quad_col) =
          pack_pair<T>(o[n][2 * r] * inv_l[r], o[n][2 * r + 1] * inv_l[r]);
    }
  }
  __syncwarp();
  const int chunks_per_row = g.dv / 8;
  for (int c = lane; c < 16 * chunks_per_row; c += 32) {
    const int r = c / chunks_per_row, col = (c % chunks_per_row) * 8, i = m0 + r;
    if (i < g.tq)
      *reinterpret_cast<uint4*>(y + (lead * g.tq + i) * g.dv + col) =
          *reinterpret_cast<const uint4*>(qs + (m0 + r) * Tile::q_stride + col);
  }
  if (lse != nullptr && lane % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = m0 + quad_row + 8 * r;
      if (i < g.tq) lse[lead * g.tq + i] = m[r] + logf(l[r]);
    }
  }
}

// Calls f(std::integral_constant<int, 32 or 64>{}): the padded extent that holds `extent`.
template <class F>
void with_padded(int64_t extent, F&& f) {
  if (extent <= 32)
    f(std::integral_constant<int, 32>{});
  else
    f(std::integral_constant<int, 64>{});
}

bool aligned16(const DeviceTensor& t) {
  return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0;
}

}  // namespace

bool short_attention_takes(const AttentionProblem& p, std::string& why) {
  if (p.backward)
    why = "the short-sequence kernel is forward only";
  else if (p.dtype != DType::bf16 && p.dtype != DType::f16)
    why = cat("the short-sequence kernel takes bf16 and f16, not ", dtype_name(p.dtype));
  else if (p.tq > kShortAttentionMaxTokens || p.tk > kShortAttentionMaxTokens)
    why = cat("Tq ", p.tq, " / Tk ", p.tk, " past the short-sequence kernel's ",
              kShortAttentionMaxTokens);
  else if (p.d > kShortAttentionMaxDim || p.dv > kShortAttentionMaxDim || p.d % 8 != 0 ||
           p.dv % 8 != 0)
    why = cat("d ", p.d, " / dv ", p.dv, ": the short-sequence kernel takes multiples of 8 up to ",
              kShortAttentionMaxDim);
  else
    return true;
  return false;
}

bool record_short_attention(Context& ctx, const Node& n, const AttentionProblem& p,
                            const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                            const DeviceTensor& y, float* lse, const float* bias,
                            const BiasStrides& bias_strides, const BufferList& reads,
                            const BufferList& writes, std::string& why) {
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(y)) {
    why = "q, k, v or y not 16-byte aligned for the short-sequence kernel";
    return false;
  }
  ShortGeometry g;
  g.tq = int(p.tq), g.tk = int(p.tk), g.d = int(p.d), g.dv = int(p.dv);
  g.heads = p.heads, g.problems = p.batch * p.heads;
  g.warps_per_problem = int((p.tq + 15) / 16);
  g.scale = float(p.scale), g.causal = p.causal, g.bias = bias_strides;
  with_padded(p.tk, [&](auto keys) {
    with_padded(p.d, [&](auto dims) {
      with_padded(p.dv, [&](auto value_dims) {
        constexpr int KP = decltype(keys)::value, DP = decltype(dims)::value,
                      DVP = decltype(value_dims)::value;
        const int64_t problem_bytes =
            Tiles<KP, DP, DVP>::elements(g.warps_per_problem * 16) * int64_t(sizeof(uint16_t));
        g.per_block =
            int(std::max<int64_t>(1, std::min<int64_t>(kWarpsPerBlock / g.warps_per_problem,
                                                       kMaxBlockBytes / problem_bytes)));
        const int64_t blocks = (g.problems + g.per_block - 1) / g.per_block;
        FUSEBOX_CHECK(blocks <= int64_t(INT32_MAX), node_label(n),
                      "too many (batch, head) problems for the short-sequence attention kernel");
        visit_device_float(n, p.dtype, [&](auto tag) {
          using T = decltype(tag);
          if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) {
            ctx.encoder.launch(short_attention_kernel<T, KP, DP, DVP>, dim3(unsigned(blocks)),
                               dim3(unsigned(g.per_block * g.warps_per_problem * 32)),
                               size_t(g.per_block * problem_bytes), reads, writes, q.as<T>(),
                               k.as<T>(), v.as<T>(), bias, y.as<T>(), lse, g);
          }
        });
      });
    });
  });
  return true;
}

}  // namespace fusebox::cuda
