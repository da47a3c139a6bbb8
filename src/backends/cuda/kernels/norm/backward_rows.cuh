// The register path's kernel body of the layer_norm / rms_norm backward (kernels/norm/backward.cu
// has the algorithm, the kernels built on it and their planner). Include from
// kernels/norm/backward.cu only.
#pragma once

#include <cooperative_groups.h>

#include "backends/cuda/kernels/norm/backward_impl.cuh"
#include "backends/cuda/kernels/norm/rows.cuh"

namespace fusebox::cuda::norm {

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
// kPartialCluster > 1 (kCluster == 1, sums in registers): the blocks form clusters of that
// many, one partial row per cluster (kernels/norm/backward_impl.cuh: write_cluster_partials); the
// dynamic shared memory then holds [kAcc][cols] floats for it.
template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc, int kCluster,
          int kPartialCluster = 1>
__device__ __forceinline__ void backward_rows(const BackwardArgs<T, float>& a) {
  static_assert(kPartialCluster == 1 || (kCluster == 1 && !kSmemAcc),
                "cluster partials take register sums of whole rows");
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

  if constexpr (kPartialCluster > 1) {
    __syncthreads();  // the shared memory is free (group_sum's slots are static)
    write_cluster_partials<T, kAcc, kVecs, kPartialCluster>(a, acc, dynamic_smem, group, groups, t);
  } else {
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
  }
  // No block may exit while another of its cluster can still read its slots.
  if constexpr (kCluster > 1) cooperative_groups::this_cluster().sync();
}

}  // namespace fusebox::cuda::norm
