// layer_norm and rms_norm, backward (kernels.h: layer_norm_backward, rms_norm_backward).
//
// With x_hat = (x - mean) * rstd (mean = 0 for rms_norm) and g = dy * scale (dy without
// scale), per row of `cols` elements:
//   dx     = rstd * (g - mean(g) - x_hat * mean(g * x_hat))    (layer_norm)
//   dx     = rstd * (g - x_hat * mean(g * x_hat))              (rms_norm)
// and per column, summed over the rows:
//   dscale = sum(dy * x_hat),   dbias = sum(dy)                (dbias: layer_norm only)
// mean and rstd are the forward's saved statistics (f32, f64 for f64 x).
//
// Register path (f32, f16, bf16 rows of up to 8,192 16-byte vectors; norm_rows.cuh): a
// persistent grid of row groups. A group loads its row of x and dy once with 16-byte
// streaming loads into registers (with prefetch, the next row's loads are issued before
// this row is reduced); from the registers it forms the two row sums (g, g * x_hat), adds
// dy * x_hat and dy into per-column f32 accumulators (a thread owns the same columns in
// every row: in registers when they fit, else in shared memory), reduces the row sums
// over the group and writes dx from the same registers. At the end each block sums its
// groups' accumulators (in group order) into one partial row per block; a second small
// kernel sums the partial rows in a fixed order into dscale and dbias. So x and dy come
// from DRAM once and dx is written once, plus 2 x (blocks x cols) f32 partials written
// and read (about 2-8% more bytes at 1K-16K columns): target 80% of the device's copy
// bandwidth or more, counting x, dy and dx. No atomics: the result is the same every run.
// The layout comes from plan_backward and the tuning variant (norm_tuning.h).
//
// Long-row path (longer rows, unaligned data, cols not a multiple of the vector width,
// f64): dx by a block per row in two passes over the row (row sums, then dx); dscale and
// dbias by a column kernel (32 columns x 8 row slices per block over chunks of rows,
// reduced in a fixed order to one partial row per chunk), then the same partial-row sum.
// About half the register path's speed.
#include <cooperative_groups.h>

#include <utility>

#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_common.h"
#include "backends/cuda/norm_rows.cuh"

namespace fusebox::cuda {

namespace {

using norm::RowPlan;
using norm::stats_t;

template <class T, class S>
struct BackwardArgs {
  const T* x;
  const T* dy;
  const T* scale;  // [cols] or null
  const S* mean;   // [rows] (layer_norm) or null (rms_norm)
  const S* rstd;   // [rows]
  T* dx;
  S* partial_scale;  // [parts, cols] or null (dscale not wanted)
  S* partial_bias;   // [parts, cols] or null (dbias not wanted, or rms_norm)
  int64_t rows;
  int64_t cols;
  int threads_per_row;  // register path only
};

// Register path; see the file comment. Block = G row groups of R threads, persistent.
// kSmemAcc: the column sums live in dynamic shared memory, [G][kAcc][cols] floats (each
// thread touches only its own columns of its group's region); otherwise in registers,
// and the dynamic shared memory (when G > 1) stages the block's partial row.
template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc>
constexpr int backward_data_registers() {
  constexpr int row = 2 * kVecs * (kVecBytes / 4) * (kPrefetch ? 2 : 1);  // x and dy
  constexpr int acc = kSmemAcc ? 0 : (kCentre ? 2 : 1) * kVecs * kVecWidth<T>;
  return row + acc;
}

// The block size the kernel is compiled for (its register cap 64, 128 or 255): from the
// register counts ptxas reports, a thread holding more than 16 registers of data (32
// without prefetch) needs more than 64 registers.
template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc>
constexpr int backward_max_block() {
  constexpr int data = backward_data_registers<T, kCentre, kVecs, kPrefetch, kSmemAcc>();
  return data <= 16 || (!kPrefetch && data <= 32) ? 1024 : data <= 64 ? 512 : 256;
}

// kCluster > 1: a cluster of kCluster blocks (one row group each) shares each row, block
// `rank` of the cluster owning the rank-th slice of nvec / kCluster vectors; the blocks
// exchange their row sums through distributed shared memory (one cluster barrier per
// row, the sums read in rank order by every block: the same result in each). A row's
// registers are then split over kCluster SMs, which leaves room to prefetch the widest
// rows. The partial rows are one per cluster, each block writing its slice.
template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc, int kCluster>
__device__ __forceinline__ void backward_rows(const BackwardArgs<T, float>& a) {
  using norm::Packed;
  using norm::unpack;
  constexpr int W = kVecWidth<T>;
  constexpr int kAcc = kCentre ? 2 : 1;  // dscale (and dbias) column sums
  extern __shared__ float4 dynamic_smem[];
  float* smem = reinterpret_cast<float*>(dynamic_smem);
  __shared__ norm::SumSlots<2> slots;
  __shared__ float cluster_slots[2][2];  // kCluster > 1: this block's row sums, by parity
  const int R = a.threads_per_row;
  const int groups = blockDim.x / R;
  const int group = threadIdx.x / R, t = threadIdx.x % R;
  const int64_t cols = a.cols;  // the row pitch
  // This block's slice of the row: vectors [rank * nvec, (rank + 1) * nvec), local columns
  // from `first`; `unit` numbers the clusters (blocks when kCluster == 1).
  const int rank = kCluster > 1 ? int(blockIdx.x % kCluster) : 0;
  const int unit = int(blockIdx.x / kCluster), units = int(gridDim.x / kCluster);
  const int nvec = int(cols / W) / kCluster;
  const int64_t local_cols = int64_t(nvec) * W, first = rank * local_cols;
  const float inv_cols = 1.0f / float(cols);
  const int64_t stride = int64_t(units) * groups;

  float acc[kSmemAcc ? 1 : kAcc][kSmemAcc ? 1 : kVecs][kSmemAcc ? 1 : W] = {};
  float* group_acc = smem + int64_t(group) * kAcc * local_cols;  // kSmemAcc: group's region
  if constexpr (kSmemAcc) {
    for (int64_t j = threadIdx.x; j < int64_t(groups) * kAcc * local_cols; j += blockDim.x) {
      smem[j] = 0;
    }
    __syncthreads();
  }
  const T* scale_slice = a.scale ? a.scale + first : nullptr;

  struct Row {
    Packed x[kVecs], dy[kVecs];
    float mean, rstd;
  };
  Row cur = {}, next = {};
  auto load_row = [&](Row& dst, int64_t row) {
    if (row >= a.rows) return;
    const int64_t offset = row * cols + first;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = k * R + t;
      if (i < nvec) {
        dst.x[k] = norm::load_packed_stream(a.x + offset, i);
        dst.dy[k] = norm::load_packed_stream(a.dy + offset, i);
      }
    }
    dst.mean = kCentre ? a.mean[row] : 0.0f;
    dst.rstd = a.rstd[row];
  };

  int parity = 0, cluster_parity = 0;
  int64_t row = int64_t(unit) * groups + group;
  if constexpr (kPrefetch) load_row(cur, row);
  for (int64_t base = int64_t(unit) * groups; base < a.rows; base += stride, row += stride) {
    if constexpr (!kPrefetch) load_row(cur, row);
    const bool active = row < a.rows;
    bool valid[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) valid[k] = active && k * R + t < nvec;
    const float mean = cur.mean, rstd = cur.rstd;

    // Row sums of g and g * x_hat; column sums of dy * x_hat (and dy). g is rounded on its
    // own (__fmul_rn: never fused into a later subtraction) so that both passes see the
    // same g: for a one-element row, g - mean(g) is then exactly 0.
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!valid[k]) continue;
      const int i = k * R + t;
      const Packed scale =
          scale_slice ? norm::load_packed_ro(scale_slice, i) : norm::ones_packed<T>();
      float col_scale[W], col_bias[W];
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float x_hat = (unpack<T>(cur.x[k], w) - mean) * rstd;
        const float dy = unpack<T>(cur.dy[k], w);
        const float g = __fmul_rn(dy, unpack<T>(scale, w));
        sums[0] += g;
        sums[1] += g * x_hat;
        col_scale[w] = dy * x_hat;
        col_bias[w] = dy;
      }
      if constexpr (kSmemAcc) {
#pragma unroll
        for (int w = 0; w < W; w += 4) {
          float4* s = reinterpret_cast<float4*>(group_acc + i * W + w);
          float4 v = *s;
          v.x += col_scale[w], v.y += col_scale[w + 1], v.z += col_scale[w + 2];
          v.w += col_scale[w + 3];
          *s = v;
          if constexpr (kCentre) {
            float4* b = reinterpret_cast<float4*>(group_acc + local_cols + i * W + w);
            float4 u = *b;
            u.x += col_bias[w], u.y += col_bias[w + 1], u.z += col_bias[w + 2];
            u.w += col_bias[w + 3];
            *b = u;
          }
        }
      } else {
#pragma unroll
        for (int w = 0; w < W; ++w) {
          acc[0][k][w] += col_scale[w];
          if constexpr (kCentre) acc[kAcc - 1][k][w] += col_bias[w];
        }
      }
    }
    // The next row's loads go out here, after the column sums (whose temporaries are then
    // dead, so fewer registers are live at once), and stay in flight through the
    // reduction and the writes of dx.
    if constexpr (kPrefetch) load_row(next, row + stride);
    norm::group_sum(sums, slots, R, parity);
    parity ^= 1;
    if constexpr (kCluster > 1) {
      // Every block of the cluster posts its sums; after the barrier each reads all of
      // them in rank order. The slots alternate with the rows, so a block cannot overwrite
      // a slot another block has yet to read (that needs the next row's barrier first).
      namespace cg = cooperative_groups;
      const cg::cluster_group cluster = cg::this_cluster();
      if (threadIdx.x == 0) {
        cluster_slots[cluster_parity][0] = sums[0];
        cluster_slots[cluster_parity][1] = sums[1];
      }
      cluster.sync();
      sums[0] = sums[1] = 0.0f;
#pragma unroll
      for (int r = 0; r < kCluster; ++r) {
        const float* remote = cluster.map_shared_rank(&cluster_slots[cluster_parity][0], r);
        sums[0] += remote[0];
        sums[1] += remote[1];
      }
      cluster_parity ^= 1;
    }
    const float mean_g = kCentre ? sums[0] * inv_cols : 0.0f;
    const float mean_gx = sums[1] * inv_cols;

    if (active) {
      const int64_t offset = row * cols + first;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (!valid[k]) continue;
        const int i = k * R + t;
        const Packed scale =
            scale_slice ? norm::load_packed_ro(scale_slice, i) : norm::ones_packed<T>();
        float out[W];
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const float x_hat = (unpack<T>(cur.x[k], w) - mean) * rstd;
          const float g = __fmul_rn(unpack<T>(cur.dy[k], w), unpack<T>(scale, w));
          out[w] = rstd * (g - mean_g - x_hat * mean_gx);
        }
        norm::store_packed_stream(a.dx + offset, i, norm::pack<T>(out));
      }
    }
    if constexpr (kPrefetch) cur = next;
  }

  // This block's partial row: its groups' column sums added in group order.
#pragma unroll
  for (int which = 0; which < kAcc; ++which) {
    float* partial = which == 0 ? a.partial_scale : a.partial_bias;
    if (partial == nullptr) continue;  // uniform over the block
    float* out = partial + int64_t(unit) * cols + first;
    if constexpr (kSmemAcc) {
      __syncthreads();
      for (int64_t j = threadIdx.x; j < local_cols; j += blockDim.x) {
        float s = 0.0f;
        for (int g = 0; g < groups; ++g) s += smem[(int64_t(g) * kAcc + which) * local_cols + j];
        out[j] = s;
      }
    } else if (groups == 1) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int i = k * R + t;
        if (i >= nvec) continue;
#pragma unroll
        for (int w = 0; w < W; w += 4) {
          reinterpret_cast<float4*>(out + i * W)[w / 4] = make_float4(
              acc[which][k][w], acc[which][k][w + 1], acc[which][k][w + 2], acc[which][k][w + 3]);
        }
      }
    } else {
      for (int g = 0; g < groups; ++g) {
        if (group == g) {
#pragma unroll
          for (int k = 0; k < kVecs; ++k) {
            const int i = k * R + t;
            if (i >= nvec) continue;
#pragma unroll
            for (int w = 0; w < W; ++w)
              smem[i * W + w] = (g == 0 ? 0.0f : smem[i * W + w]) + acc[which][k][w];
          }
        }
        __syncthreads();
      }
      for (int64_t j = threadIdx.x; j < local_cols; j += blockDim.x) out[j] = smem[j];
      __syncthreads();  // the staging is reused for the next sum
    }
  }
  // No block may exit while another of its cluster can still read its slots.
  if constexpr (kCluster > 1) cooperative_groups::this_cluster().sync();
}

template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc>
__global__ void __launch_bounds__(backward_max_block<T, kCentre, kVecs, kPrefetch, kSmemAcc>())
    norm_backward_rows(BackwardArgs<T, float> a) {
  backward_rows<T, kCentre, kVecs, kPrefetch, kSmemAcc, 1>(a);
}

// Register-capped kernels (a variant's backward_max_regs): __launch_bounds__(kBlock,
// kMinBlocks) caps the registers at 64K / (kBlock * kMinBlocks) per thread; a block may hold
// several row groups of R > 32 threads (group_sum serves them all with one barrier).
template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc, int kBlock,
          int kMinBlocks>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
    norm_backward_capped_rows(BackwardArgs<T, float> a) {
  backward_rows<T, kCentre, kVecs, kPrefetch, kSmemAcc, 1>(a);
}

// Pairs of blocks per row (f32 / f16 / bf16 rows too wide for one block to prefetch).
constexpr int kClusterBlocks = 2;
template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1)
    __launch_bounds__(backward_max_block<T, kCentre, kVecs, kPrefetch, kSmemAcc>())
        norm_backward_cluster_rows(BackwardArgs<T, float> a) {
  backward_rows<T, kCentre, kVecs, kPrefetch, kSmemAcc, kClusterBlocks>(a);
}

// a * b rounded once, never contracted into a neighbouring add (f32 and f64).
__device__ __forceinline__ float exact_product(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double exact_product(double a, double b) {
  return __dmul_rn(a, b);
}

// Long-row path, dx: a block per row (grid-stride over rows); pass 1 sums g and
// g * x_hat over the row, pass 2 writes dx. C is f32 (f64 for f64).
template <class T, bool kCentre>
__global__ void norm_backward_long_dx(BackwardArgs<T, stats_t<T>> a) {
  using C = compute_t<T>;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t offset = row * a.cols;
    const C mean = kCentre ? C(a.mean[row]) : C(0), rstd = C(a.rstd[row]);
    // g rounded on its own (never fused into a later subtraction), as in the register path.
    auto g_at = [&](int64_t j) {
      const C dy = load_compute(a.dy, offset + j);
      return a.scale ? exact_product(dy, load_compute(a.scale, j)) : dy;
    };
    C sum_g = 0, sum_gx = 0;
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      const C x_hat = (load_compute(a.x, offset + j) - mean) * rstd;
      const C g = g_at(j);
      sum_g += g;
      sum_gx += g * x_hat;
    }
    const C mean_g = kCentre ? block_reduce(sum_g, SumOp{}, C(0)) / C(a.cols) : C(0);
    const C mean_gx = block_reduce(sum_gx, SumOp{}, C(0)) / C(a.cols);
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      const C x_hat = (load_compute(a.x, offset + j) - mean) * rstd;
      store_compute(a.dx, offset + j, rstd * (g_at(j) - mean_g - x_hat * mean_gx));
    }
  }
}

// Long-row path, dscale / dbias partials: block (32, 8) covers 32 columns of one chunk of
// rows; thread row ty takes rows ty, ty + 8, ... of the chunk; the 8 sums are added in
// order and written as row `chunk` of the partials.
template <class T, bool kCentre>
__global__ void norm_backward_long_params(BackwardArgs<T, stats_t<T>> a, int64_t rows_per_chunk) {
  using C = compute_t<T>;
  using S = stats_t<T>;
  __shared__ C part[2][8][33];
  const int64_t j = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t first = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t last = min(a.rows, first + rows_per_chunk);
  C sum_scale = 0, sum_bias = 0;
  if (j < a.cols) {
    for (int64_t row = first + threadIdx.y; row < last; row += 8) {
      const C mean = kCentre ? C(a.mean[row]) : C(0);
      const C x_hat = (load_compute(a.x, row * a.cols + j) - mean) * C(a.rstd[row]);
      const C dy = load_compute(a.dy, row * a.cols + j);
      sum_scale += dy * x_hat;
      sum_bias += dy;
    }
  }
  part[0][threadIdx.y][threadIdx.x] = sum_scale;
  part[1][threadIdx.y][threadIdx.x] = sum_bias;
  __syncthreads();
  if (threadIdx.y != 0 || j >= a.cols) return;
  C total_scale = 0, total_bias = 0;
#pragma unroll
  for (int y = 0; y < 8; ++y) {
    total_scale += part[0][y][threadIdx.x];
    total_bias += part[1][y][threadIdx.x];
  }
  const int64_t at = int64_t(blockIdx.y) * a.cols + j;
  if (a.partial_scale) a.partial_scale[at] = S(total_scale);
  if (kCentre && a.partial_bias) a.partial_bias[at] = S(total_bias);
}

template <class T>
using BackwardKernel = norm::BoundKernel<void (*)(BackwardArgs<T, float>)>;

template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc>
BackwardKernel<T> bound_backward_rows() {
  return {&norm_backward_rows<T, kCentre, kVecs, kPrefetch, kSmemAcc>,
          backward_max_block<T, kCentre, kVecs, kPrefetch, kSmemAcc>()};
}

// The instantiated layouts: those whose registers fit without spilling (empty otherwise).
// 4 vectors with prefetch only with the column sums in shared memory; 8 vectors only
// without prefetch and with the sums in shared memory.
template <class T, bool kCentre, bool kPrefetch, bool kSmemAcc>
BackwardKernel<T> backward_rows_kernel(int vecs) {
  switch (vecs) {
    case 1:
      return bound_backward_rows<T, kCentre, 1, kPrefetch, kSmemAcc>();
    case 2:
      return bound_backward_rows<T, kCentre, 2, kPrefetch, kSmemAcc>();
    case 4:
      if constexpr (kPrefetch && !kSmemAcc) return {};
      return bound_backward_rows<T, kCentre, 4, kPrefetch, kSmemAcc>();
    default:
      if constexpr (kPrefetch || !kSmemAcc) return {};
      return bound_backward_rows<T, kCentre, 8, false, true>();
  }
}

template <class T, bool kCentre>
BackwardKernel<T> backward_rows_kernel(int vecs, bool prefetch, bool smem_acc) {
  if (prefetch) {
    return smem_acc ? backward_rows_kernel<T, kCentre, true, true>(vecs)
                    : backward_rows_kernel<T, kCentre, true, false>(vecs);
  }
  return smem_acc ? backward_rows_kernel<T, kCentre, false, true>(vecs)
                  : backward_rows_kernel<T, kCentre, false, false>(vecs);
}

// Cluster layouts: prefetching, 2 vectors (column sums in registers or shared memory) or
// 4 (shared memory).
template <class T, bool kCentre>
BackwardKernel<T> backward_cluster_kernel(int vecs, bool smem_acc) {
  constexpr auto bound = [](auto kernel, int max_block) {
    return BackwardKernel<T>{kernel, max_block};
  };
  if (vecs == 2) {
    return smem_acc ? bound(&norm_backward_cluster_rows<T, kCentre, 2, true, true>,
                            backward_max_block<T, kCentre, 2, true, true>())
                    : bound(&norm_backward_cluster_rows<T, kCentre, 2, true, false>,
                            backward_max_block<T, kCentre, 2, true, false>());
  }
  if (vecs == 4 && smem_acc) {
    return bound(&norm_backward_cluster_rows<T, kCentre, 4, true, true>,
                 backward_max_block<T, kCentre, 4, true, true>());
  }
  return {};
}

// The register-capped layouts (f16 / bf16 only; f32 meets its target with the default
// bounds). LayerNorm's two f32 column sums per element (32 registers at V=2) plus the row
// (16, 32 with prefetch) leave the default-bounded kernel at > 85 registers, 2 blocks of
// 256 per SM. Capped at 64 with blocks of 1024 threads: 32 warps per SM and one partial
// row per block of several row groups. Those that spill (ptxas -v; checked at run time by
// the planner, which skips them) are no use.
struct CappedLayout {
  int max_regs;
  int vecs;
  bool prefetch;
  bool smem_acc;
  int block;
};
// ptxas -v (sm_90, bf16 and f16 alike), LayerNorm / RMSNorm: registers, spill stores:
//   64: V=2 plain, block 1024    64 + 64 B spilled / 64, none  (4 x 256 at 4096 cols)
//   64: V=1 prefetch, block 1024 64 + 8 B / 61-63, none        (2 x 512 at 4096 cols)
//   64: V=1 plain, block 1024    61 / 52, none                 (2 x 512 at 4096 cols)
//   80: V=2 plain, block 256     80 / 71, none                 (3 blocks per SM)
// (The ordinary V=2 plain kernel: 88 / 64 registers. V=2 with prefetch and the sums in
// shared memory, for 16384 columns, spills 36 bytes at 64: not listed.)
constexpr CappedLayout kCappedLayouts[] = {
    {64, 2, false, false, 1024},
    {64, 1, true, false, 1024},
    {64, 1, false, false, 1024},
    {80, 2, false, false, 256},
};
// Spills up to this many bytes per thread are accepted (a word or two saved once, as the
// V=1 prefetching LayerNorm kernel's 8 bytes); more are not.
constexpr size_t kMaxSpillBytes = 16;

template <class T, bool kCentre, size_t I>
BackwardKernel<T> capped_kernel_at() {
  constexpr CappedLayout l = kCappedLayouts[I];
  constexpr int min_blocks = 65536 / (l.block * l.max_regs);
  return {
      &norm_backward_capped_rows<T, kCentre, l.vecs, l.prefetch, l.smem_acc, l.block, min_blocks>,
      l.block};
}

template <class T, bool kCentre, size_t... I>
BackwardKernel<T> capped_kernel(size_t index, std::index_sequence<I...>) {
  BackwardKernel<T> k;
  if constexpr (is_half_v<T>) {
    ((index == I ? (void)(k = capped_kernel_at<T, kCentre, I>()) : void()), ...);
  } else {
    (void)index;
  }
  return k;
}

// Whether the loaded kernel keeps (nearly) everything in registers: local memory of at
// most kMaxSpillBytes per thread.
template <class T>
bool spill_free(const BackwardKernel<T>& k, const DeviceProperties& props) {
  const DeviceGuard guard(props.id);
  const void* fn = reinterpret_cast<const void*>(k.fn);
  return norm::kernel_limits(fn, props.id).local_bytes <= kMaxSpillBytes;
}

// The backward's dynamic shared memory: the column sums of every group (smem_acc), else
// the staging of the block's partial row when it has several groups.
template <bool kCentre>
size_t backward_shared_bytes(bool smem_acc, int groups, int64_t cols) {
  return smem_acc     ? size_t(groups) * (kCentre ? 2 : 1) * size_t(cols) * sizeof(float)
         : groups > 1 ? size_t(cols) * sizeof(float)
                      : 0;
}

// A register-capped layout (the variant's backward_max_regs), tried in the same order as
// plan_backward tries the ordinary ones; plan.fast == false when none fits, launches and
// is (nearly) spill-free.
template <class T, bool kCentre>
norm::RowPlan plan_backward_capped(int64_t rows, int64_t cols, const DeviceProperties& props,
                                   BackwardKernel<T>* kernel) {
  constexpr int W = kVecWidth<T>;
  norm::RowPlan plan;
  const norm::Variant& variant = norm::norm_variant();
  if (variant.backward_max_regs == 0) return plan;
  for (bool prefetch : {true, false}) {
    if (prefetch && !variant.backward_prefetch) continue;
    for (int preferred = variant.backward_vecs; preferred <= norm::kMaxVecs; preferred *= 2) {
      int vecs = preferred, threads = 0;
      norm::fit_row(cols / W, vecs, threads);
      if (threads == 0) continue;
      for (bool smem_acc : {variant.backward_smem_acc, !variant.backward_smem_acc}) {
        for (size_t i = 0; i < std::size(kCappedLayouts); ++i) {
          const CappedLayout& l = kCappedLayouts[i];
          if (l.max_regs != variant.backward_max_regs || l.vecs != vecs || l.prefetch != prefetch ||
              l.smem_acc != smem_acc || threads > l.block) {
            continue;
          }
          const BackwardKernel<T> k =
              capped_kernel<T, kCentre>(i, std::make_index_sequence<std::size(kCappedLayouts)>{});
          const int groups = l.block / threads;
          const size_t shared_bytes = backward_shared_bytes<kCentre>(smem_acc, groups, cols);
          const unsigned grid =
              norm::persistent_grid(k, l.block, shared_bytes, props, (rows + groups - 1) / groups);
          if (grid == 0 || !spill_free(k, props)) continue;
          plan.fast = true;
          plan.vecs = vecs;
          plan.threads_per_row = threads;
          plan.block = l.block;
          plan.prefetch = prefetch;
          plan.smem_acc = smem_acc;
          plan.shared_bytes = shared_bytes;
          plan.max_regs = l.max_regs;
          plan.grid = grid;
          *kernel = k;
          return plan;
        }
      }
    }
  }
  return plan;
}

// Thread-block clusters need the launch to carry the cluster shape (or at least a launch
// path tested with the compile-time __cluster_dims__); the encoder records plain kernel
// nodes and launches (no cudaLaunchAttributeClusterDimension, no cudaLaunchKernelEx), so
// the cluster layouts stay off: the variant that asks for them gets the ordinary layout,
// and its layout text says so. Turn this on once the encoder launches clusters.
constexpr bool kEncoderLaunchesClusters = false;
constexpr const char* kClusterUnavailable =
    " (cluster unavailable: the encoder has no cluster launch)";

// A cluster layout (kClusterBlocks blocks per row, each a row group of R > 32 threads over
// its slice), when the variant asks for one and a slice fits; plan.fast == false otherwise.
template <class T, bool kCentre>
norm::RowPlan plan_backward_cluster(Context& ctx, int64_t rows, int64_t cols,
                                    BackwardKernel<T>* kernel) {
  constexpr int W = kVecWidth<T>;
  norm::RowPlan plan;
  if constexpr (kEncoderLaunchesClusters) {
    const DeviceProperties& props = ctx.device.properties();
    const int64_t nvec = cols / W;
    if (nvec % kClusterBlocks != 0) return plan;
    for (int preferred = 2; preferred <= 4; preferred *= 2) {
      int vecs = preferred, threads = 0;
      norm::fit_row(nvec / kClusterBlocks, vecs, threads);
      if (threads <= 32) continue;  // one row group per block
      for (bool smem_acc : {false, true}) {
        const size_t shared_bytes =
            smem_acc ? size_t(kCentre ? 2 : 1) * size_t(cols / kClusterBlocks) * sizeof(float) : 0;
        const BackwardKernel<T> k = backward_cluster_kernel<T, kCentre>(vecs, smem_acc);
        if (!norm::launchable(k, threads, shared_bytes, props)) continue;
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(unsigned(kClusterBlocks * props.sm_count));
        config.blockDim = dim3(unsigned(threads));
        config.dynamicSmemBytes = shared_bytes;
        int clusters = 0;
        const void* fn = reinterpret_cast<const void*>(k.fn);
        if (cudaOccupancyMaxActiveClusters(&clusters, fn, &config) != cudaSuccess) {
          (void)cudaGetLastError();  // not launchable this way: try another layout
          continue;
        }
        if (clusters == 0) continue;
        plan.fast = true;
        plan.vecs = vecs;
        plan.threads_per_row = threads;
        plan.block = threads;
        plan.prefetch = true;
        plan.smem_acc = smem_acc;
        plan.shared_bytes = shared_bytes;
        plan.cluster = kClusterBlocks;
        plan.grid = unsigned(kClusterBlocks * std::clamp<int64_t>(rows, 1, clusters));
        *kernel = k;
        return plan;
      }
    }
  } else {
    (void)ctx, (void)rows, (void)cols, (void)kernel, (void)W;
  }
  return plan;
}

// Whether the variant asks for a cluster layout at this width.
inline bool wants_cluster(int64_t cols) {
  const norm::Variant& variant = norm::norm_variant();
  return variant.backward_cluster && cols >= variant.backward_cluster_min_cols;
}

// The register path's layout for rows of `cols` elements, or plan.fast == false. Tries,
// in order: a cluster layout (when the variant asks for one), prefetching layouts (when
// the variant allows), then plain ones; within each,
// from the variant's vectors per thread up; for each layout the column sums in registers
// first (in shared memory first when the variant says so). A variant with a register cap
// tries its capped layouts (plan_backward_capped) before the ordinary ones. The first that fits
// kMaxRowThreads threads per row, the shared memory and the registers wins.
template <class T, bool kCentre>
norm::RowPlan plan_backward(Context& ctx, int64_t rows, int64_t cols, bool aligned,
                            BackwardKernel<T>* kernel) {
  constexpr int W = kVecWidth<T>;
  norm::RowPlan plan;
  if (!aligned || cols % W != 0) return plan;
  const DeviceProperties& props = ctx.device.properties();
  const norm::Variant& variant = norm::norm_variant();
  if (wants_cluster(cols)) {
    plan = plan_backward_cluster<T, kCentre>(ctx, rows, cols, kernel);
    if (plan.fast) return plan;
  }
  plan = plan_backward_capped<T, kCentre>(rows, cols, props, kernel);
  if (plan.fast) return plan;
  for (bool prefetch : {true, false}) {
    if (prefetch && !variant.backward_prefetch) continue;
    for (int preferred = variant.backward_vecs; preferred <= norm::kMaxVecs; preferred *= 2) {
      int vecs = preferred, threads = 0;
      norm::fit_row(cols / W, vecs, threads);
      if (threads == 0) continue;
      const int block = threads <= 32 ? norm::kSmallGroupBlock : threads;  // R > 32: one group
      const int groups = block / threads;
      for (bool smem_acc : {variant.backward_smem_acc, !variant.backward_smem_acc}) {
        const size_t shared_bytes = backward_shared_bytes<kCentre>(smem_acc, groups, cols);
        const BackwardKernel<T> k = backward_rows_kernel<T, kCentre>(vecs, prefetch, smem_acc);
        const unsigned grid =
            norm::persistent_grid(k, block, shared_bytes, props, (rows + groups - 1) / groups);
        if (grid == 0) continue;
        plan.fast = true;
        plan.vecs = vecs;
        plan.threads_per_row = threads;
        plan.block = block;
        plan.prefetch = prefetch;
        plan.smem_acc = smem_acc;
        plan.shared_bytes = shared_bytes;
        plan.grid = grid;
        *kernel = k;
        return plan;
      }
    }
  }
  return plan;
}

// Sums `parts` partial rows into `out` ([cols], in out's dtype).
template <class A>
void sum_partials(Context& ctx, const DeviceBuffer& partial, int64_t parts, int64_t cols,
                  DeviceTensor& out) {
  const BufferRange partial_range(partial, 0, size_t(parts * cols) * sizeof(A));
  visit_device_dtype(out.dtype, [&](auto tag) {
    using O = decltype(tag);
    if constexpr (is_float_v<O>) {
      ctx.encoder.launch(&norm::sum_partial_rows<A, O>, dim3(unsigned((cols + 31) / 32)),
                         dim3(32, 8), 0, {partial_range}, {out.range()}, partial.as<const A>(),
                         parts, cols, out.as<O>());
    }
  });
}

struct BackwardTensors {
  const DeviceTensor& x;
  const DeviceTensor& dy;
  const DeviceTensor* scale;
  const DeviceTensor* mean;
  const DeviceTensor& rstd;
  DeviceTensor& dx;
  DeviceTensor* dscale;
  DeviceTensor* dbias;
};

template <class T, bool kCentre>
void launch_backward(Context& ctx, const BackwardTensors& b, int64_t rows, int64_t cols) {
  using S = stats_t<T>;
  const DeviceProperties& props = ctx.device.properties();
  const int sms = props.sm_count;
  BackwardArgs<T, S> args{b.x.as<const T>(),
                          b.dy.as<const T>(),
                          b.scale ? b.scale->as<const T>() : nullptr,
                          b.mean ? b.mean->as<const S>() : nullptr,
                          b.rstd.as<const S>(),
                          b.dx.as<T>(),
                          nullptr,
                          nullptr,
                          rows,
                          cols,
                          0};
  const BufferList reads = norm::ranges({&b.x, &b.dy, b.scale, b.mean, &b.rstd});
  DeviceBuffer partial_scale, partial_bias;
  // Partial rows for dscale / dbias (parts x cols, in S), made once the part count is known.
  auto make_partials = [&](int64_t parts) {
    const size_t bytes = size_t(parts * cols) * sizeof(S);
    if (b.dscale) {
      partial_scale = ctx.allocator.allocate(bytes);
      ctx.encoder.add_temporary(partial_scale);
      args.partial_scale = partial_scale.as<S>();
    }
    if (b.dbias) {
      partial_bias = ctx.allocator.allocate(bytes);
      ctx.encoder.add_temporary(partial_bias);
      args.partial_bias = partial_bias.as<S>();
    }
    BufferList writes = norm::ranges({&b.dx});
    if (partial_scale) writes.push_back(BufferRange(partial_scale, 0, bytes));
    if (partial_bias) writes.push_back(BufferRange(partial_bias, 0, bytes));
    return writes;
  };
  auto finish = [&](int64_t parts) {
    if (b.dscale) sum_partials<S>(ctx, partial_scale, parts, cols, *b.dscale);
    if (b.dbias) sum_partials<S>(ctx, partial_bias, parts, cols, *b.dbias);
  };

  if constexpr (!std::is_same_v<T, double>) {
    const bool aligned = norm::aligned16(args.x) && norm::aligned16(args.dy) &&
                         norm::aligned16(args.scale) && norm::aligned16(args.dx);
    BackwardKernel<T> kernel;
    const RowPlan plan = plan_backward<T, kCentre>(ctx, rows, cols, aligned, &kernel);
    if (plan.fast) {
      args.threads_per_row = plan.threads_per_row;
      const int64_t parts = plan.grid / plan.cluster;  // one partial row per block / cluster
      const BufferList writes = make_partials(parts);
      ctx.encoder.launch(kernel.fn, dim3(plan.grid), dim3(plan.block), plan.shared_bytes, reads,
                         writes, args);
      finish(parts);
      return;
    }
  }
  // The long-row kernels have no launch bounds and few registers: they always launch.
  const norm::BoundKernel<void (*)(BackwardArgs<T, S>)> long_dx{&norm_backward_long_dx<T, kCentre>,
                                                                norm::kUnbounded};
  const unsigned grid = norm::persistent_grid(long_dx, norm::kLongRowBlock, 0, props, rows);
  FUSEBOX_CHECK(grid > 0, "layer_norm_backward / rms_norm_backward",
                "the long-row kernel does not launch");
  ctx.encoder.launch(long_dx.fn, dim3(grid), dim3(norm::kLongRowBlock), 0, reads,
                     norm::ranges({&b.dx}), args);
  if (!b.dscale && !b.dbias) return;
  // Chunks of rows: about 4 blocks per SM in all, each chunk at least 8 rows.
  const int64_t column_blocks = (cols + 31) / 32;
  int64_t chunks = std::clamp<int64_t>((4 * sms + column_blocks - 1) / column_blocks, 1,
                                       std::max<int64_t>(1, (rows + 7) / 8));
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  BufferList writes = make_partials(chunks);
  writes.erase(writes.begin());  // dx is not written here
  ctx.encoder.launch(&norm_backward_long_params<T, kCentre>,
                     dim3(unsigned(column_blocks), unsigned(chunks)), dim3(32, 8), 0, reads, writes,
                     args, rows_per_chunk);
  finish(chunks);
}

void norm_backward(Context& ctx, const std::string& where, const BackwardTensors& b, bool centre) {
  const DeviceTensor& x = b.x;
  FUSEBOX_CHECK(x.is_contiguous() && b.dy.is_contiguous() && b.dx.is_contiguous(), where,
                "x, dy and dx must be contiguous");
  FUSEBOX_CHECK(b.dy.dtype == x.dtype && b.dy.shape == x.shape && b.dx.dtype == x.dtype &&
                    b.dx.shape == x.shape,
                where, "dy and dx must match x (", dtype_name(x.dtype), " ", shape_str(x.shape),
                ")");
  const DType stats = x.dtype == DType::f64 ? DType::f64 : DType::f32;
  const int64_t rows = b.rstd.numel();
  FUSEBOX_CHECK(
      b.rstd.dtype == stats && (!b.mean || (b.mean->dtype == stats && b.mean->numel() == rows)),
      where, "the saved statistics must be ", dtype_name(stats), " with one value per row");
  int64_t cols = rows > 0 ? x.numel() / rows : 0;
  for (const DeviceTensor* p : {b.scale, static_cast<const DeviceTensor*>(b.dscale),
                                static_cast<const DeviceTensor*>(b.dbias)}) {
    if (p && rows == 0) cols = p->numel();
  }
  FUSEBOX_CHECK(rows * cols == x.numel(), where, "x ", shape_str(x.shape), " is not ", rows,
                " rows (one per saved statistic)");
  FUSEBOX_CHECK(!b.scale || (b.scale->dtype == x.dtype && b.scale->numel() == cols &&
                             b.scale->is_contiguous()),
                where, "scale must be ", dtype_name(x.dtype), " with ", cols, " elements");
  for (DeviceTensor* p : {b.dscale, b.dbias}) {
    FUSEBOX_CHECK(!p || (p->numel() == cols && p->is_contiguous() &&
                         (p->dtype == x.dtype || p->dtype == DType::f32)),
                  where, "dscale and dbias must have ", cols, " elements, in ", dtype_name(x.dtype),
                  " or f32");
  }
  if (rows == 0 || cols == 0) {  // empty sums
    for (DeviceTensor* p : {b.dscale, b.dbias})
      if (p) ctx.encoder.memset(p->range(), 0);
    return;
  }
  switch (x.dtype) {
    case DType::f64:
      return centre ? launch_backward<double, true>(ctx, b, rows, cols)
                    : launch_backward<double, false>(ctx, b, rows, cols);
    case DType::f32:
      return centre ? launch_backward<float, true>(ctx, b, rows, cols)
                    : launch_backward<float, false>(ctx, b, rows, cols);
    case DType::f16:
      return centre ? launch_backward<__half, true>(ctx, b, rows, cols)
                    : launch_backward<__half, false>(ctx, b, rows, cols);
    case DType::bf16:
      return centre ? launch_backward<__nv_bfloat16, true>(ctx, b, rows, cols)
                    : launch_backward<__nv_bfloat16, false>(ctx, b, rows, cols);
    default:
      break;
  }
  throw Error(where, cat("expects a floating-point x, got ", dtype_name(x.dtype)));
}

// ---- the IR ops ------------------------------------------------------------------------

constexpr int kMaxParamRank = 8;

// A parameter gradient reduced from the normalised dims to the parameter's shape: the
// dims where the parameter has 1 (or is missing, leading) are summed.
struct SumToShape {
  int rank;                      // of the normalised dims
  int64_t full[kMaxParamRank];   // the normalised dims
  int64_t param[kMaxParamRank];  // the parameter's dims, right-aligned, 1-padded
};

// out[o] = sum of full[i] over the elements i of the normalised dims that broadcast from
// element o of the parameter; one thread per output element, in row-major order of i
// (deterministic).
template <class O>
__global__ void sum_to_param_shape(const float* full, SumToShape s, int64_t count, O* out) {
  const int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= count) return;
  // Coordinates of o in the parameter; the summed dims run over all their values.
  int64_t coord[kMaxParamRank];
  int64_t rest = o;
  for (int d = s.rank - 1; d >= 0; --d) {
    coord[d] = rest % s.param[d];
    rest /= s.param[d];
  }
  int64_t inner = 1;
  for (int d = 0; d < s.rank; ++d)
    if (s.param[d] == 1) inner *= s.full[d];
  float total = 0.0f;
  for (int64_t k = 0; k < inner; ++k) {
    int64_t kk = k, index = 0, stride = 1;
    int64_t c[kMaxParamRank];
    for (int d = s.rank - 1; d >= 0; --d) {
      if (s.param[d] == 1) {
        c[d] = kk % s.full[d];
        kk /= s.full[d];
      } else {
        c[d] = coord[d];
      }
    }
    for (int d = s.rank - 1; d >= 0; --d) {
      index += c[d] * stride;
      stride *= s.full[d];
    }
    total += full[index];
  }
  out[o] = convert<O>(total);
}

// (dy, x, scale?, mean, inv_std_dev) -> (dx, dscale, dbias) for layer_norm (centre),
// (dy, x, scale?, inv_rms) -> (dx, dscale) for rms_norm; ops.h. The parameter gradients
// have scale's shape (summed over the dims scale broadcasts along), else the normalised
// dims', in x's dtype.
void norm_backward_op(Context& ctx, const Node& n, Inputs in, Outputs out, bool centre) {
  const std::string where = node_label(n);
  const size_t inputs = centre ? 5 : 4, outputs = centre ? 3 : 2;
  FUSEBOX_CHECK(
      in.size() == inputs && in[0] && in[1] && in[3] && (!centre || in[4]) && out.size() == outputs,
      where, "expects ", inputs, " inputs and ", outputs, " outputs");
  const DeviceTensor &dy = *in[0], &x = *in[1];
  const norm::RowsView view = norm::rows_view(where, x.shape, std::get<NormAttrs>(n.attrs).axis);
  DeviceTensor scale_storage;
  const DeviceTensor* scale = norm::expand_param(ctx, where, in[2], view, scale_storage);
  const DeviceTensor* mean = centre ? in[3] : nullptr;
  const DeviceTensor& rstd = *in[centre ? 4 : 3];
  FUSEBOX_CHECK(rstd.numel() == view.rows && (!mean || mean->numel() == view.rows), where,
                "the saved statistics must have ", view.rows, " elements (one per row of x ",
                shape_str(x.shape), ")");
  const Shape param_shape = in[2] ? in[2]->shape : view.norm_shape;
  for (size_t o = 1; o < outputs; ++o) {
    FUSEBOX_CHECK(out[o].dtype == x.dtype && out[o].shape == param_shape, where, "output ", o,
                  " must be ", dtype_name(x.dtype), " ", shape_str(param_shape));
  }
  DeviceTensor* dscale = &out[1];
  DeviceTensor* dbias = centre ? &out[2] : nullptr;
  if (numel(param_shape) == view.cols) {
    norm_backward(ctx, where, {x, dy, scale, mean, rstd, out[0], dscale, dbias}, centre);
    return;
  }
  // scale broadcasts: the column sums go to f32 [cols] temporaries, then summed down.
  FUSEBOX_CHECK(view.norm_shape.size() <= size_t(kMaxParamRank), where, "at most ", kMaxParamRank,
                " normalised dims are supported, got ", shape_str(view.norm_shape));
  DeviceTensor full_scale = DeviceTensor::empty(ctx.allocator, DType::f32, {view.cols});
  DeviceTensor full_bias =
      centre ? DeviceTensor::empty(ctx.allocator, DType::f32, {view.cols}) : DeviceTensor();
  ctx.encoder.add_temporary(full_scale.buffer);
  if (centre) ctx.encoder.add_temporary(full_bias.buffer);
  norm_backward(ctx, where,
                {x, dy, scale, mean, rstd, out[0], &full_scale, centre ? &full_bias : nullptr},
                centre);
  SumToShape s{};
  s.rank = int(view.norm_shape.size());
  const size_t lead = view.norm_shape.size() - param_shape.size();
  for (int d = 0; d < s.rank; ++d) {
    s.full[d] = view.norm_shape[size_t(d)];
    s.param[d] = size_t(d) < lead ? 1 : param_shape[size_t(d) - lead];
  }
  const int64_t count = numel(param_shape);
  for (size_t o = 1; o < outputs; ++o) {
    const DeviceTensor& full = o == 1 ? full_scale : full_bias;
    visit_device_float(n, x.dtype, [&](auto tag) {
      using O = decltype(tag);
      ctx.encoder.launch(&sum_to_param_shape<O>, dim3(unsigned((count + 255) / 256)), dim3(256), 0,
                         {full.range()}, {out[o].range()}, full.as<const float>(), s, count,
                         out[o].as<O>());
    });
  }
}

}  // namespace

void layer_norm_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  norm_backward_op(ctx, n, in, out, true);
}

void rms_norm_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  norm_backward_op(ctx, n, in, out, false);
}

void layer_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                         const DeviceTensor* scale, const DeviceTensor& mean,
                         const DeviceTensor& rstd, DeviceTensor& dx, DeviceTensor* dscale,
                         DeviceTensor* dbias) {
  norm_backward(ctx, "layer_norm_backward", {x, dy, scale, &mean, rstd, dx, dscale, dbias}, true);
}

void rms_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                       const DeviceTensor* scale, const DeviceTensor& rstd, DeviceTensor& dx,
                       DeviceTensor* dscale) {
  norm_backward(ctx, "rms_norm_backward", {x, dy, scale, nullptr, rstd, dx, dscale, nullptr},
                false);
}

namespace norm {

std::string backward_layout(Context& ctx, DType dtype, int64_t rows, int64_t cols, bool centre) {
  std::string text = "long-row";
  if (dtype == DType::f64) return text;
  visit_device_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || is_half_v<T>) {
      BackwardKernel<T> kernel;
      text = layout_text(centre ? plan_backward<T, true>(ctx, rows, cols, true, &kernel)
                                : plan_backward<T, false>(ctx, rows, cols, true, &kernel),
                         true);
      if (wants_cluster(cols) && !kEncoderLaunchesClusters) text += kClusterUnavailable;
    }
  });
  return text;
}

}  // namespace norm

}  // namespace fusebox::cuda
