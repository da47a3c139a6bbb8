// Internals shared by the layer_norm / rms_norm backward files: kernels/norm/backward.cu (the
// register and long-row paths, the planner, the launch), kernels/norm/backward_staged.cu (the
// staged path) and kernels/norm/backward_op.cu (the IR ops and the direct-call entry points).
// Include from .cu files only.
#pragma once

#include <cooperative_groups.h>

#include <optional>
#include <string>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/norm/rows.cuh"

namespace fusebox::cuda::norm {

// The arguments of every backward kernel; S is the statistics' type (stats_t<T>).
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
  int threads_per_row;  // register and staged paths only
};

template <class T>
using BackwardKernel = BoundKernel<void (*)(BackwardArgs<T, float>)>;

// The cluster's partial row, one per kCluster blocks instead of one per block (the staged
// path, kernels/norm/backward_staged.cu, and LayerNorm's 80-register layout of the register path,
// kernels/norm/backward.cu).
// Why: the partial rows are written at the end of the kernel, when nothing else is in
// flight, then summed: a serial cost that grows with the number of partial rows
// (bench/results/norm_tuning.md). Here:
//   1. each block adds its groups' column sums (in group order) into its own shared
//      memory (stage_block_sums), [kAcc][cols] floats (the staged path's stages, free by now; the
//      register path's dynamic shared memory, sized for it);
//   2. cluster barrier; block `rank` adds slice `rank` (cols / kCluster columns) of every
//      block's sums, rank 0's first, reading them through distributed shared memory, and
//      writes the slice of partial row blockIdx.x / kCluster;
//   3. cluster barrier: no block leaves while another may still read its shared memory.
// The order of additions is fixed: the same result every run.
// This block's column sums, its groups' added in group order, into shared memory as
// [kAcc][cols] floats (`sums`): block b's sums are in registers, acc[which][k][w] for column
// (k * R + t) * W + w of its group's row (every group of a block holds the same columns).
// Every thread of the block calls; the sums are complete for all of them on return.
template <class T, int kAcc, int kVecs>
__device__ __forceinline__ void stage_block_sums(const BackwardArgs<T, float>& a,
                                                 const float (&acc)[kAcc][kVecs][kVecWidth<T>],
                                                 float4* sums, int group, int groups, int t) {
  constexpr int W = kVecWidth<T>;
  const int R = a.threads_per_row;
  const int nvec = int(a.cols / W);
  const int cols4 = int(a.cols / 4);
  for (int g = 0; g < groups; ++g) {
    if (group == g) {
#pragma unroll
      for (int which = 0; which < kAcc; ++which) {
#pragma unroll
        for (int k = 0; k < kVecs; ++k) {
          const int i = k * R + t;
          if (i >= nvec) continue;
#pragma unroll
          for (int w = 0; w < W; w += 4) {
            float4 v = make_float4(acc[which][k][w], acc[which][k][w + 1], acc[which][k][w + 2],
                                   acc[which][k][w + 3]);
            float4& slot = sums[which * cols4 + (i * W + w) / 4];
            if (g > 0) v = make_float4(slot.x + v.x, slot.y + v.y, slot.z + v.z, slot.w + v.w);
            slot = v;
          }
        }
      }
    }
    __syncthreads();
  }
}

template <class T, int kAcc, int kVecs, int kCluster>
__device__ __forceinline__ void write_cluster_partials(
    const BackwardArgs<T, float>& a, const float (&acc)[kAcc][kVecs][kVecWidth<T>], float4* smem,
    int group, int groups, int t) {
  namespace cg = cooperative_groups;
  const int cols4 = int(a.cols / 4);
  float4* sums = smem;  // [kAcc][cols / 4]
  stage_block_sums<T, kAcc, kVecs>(a, acc, sums, group, groups, t);
  const cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's sums are in place
  const int rank = int(cluster.block_rank());
  const int slice = cols4 / kCluster;  // float4s per block (cols % (4 * kCluster) == 0)
  const int64_t row = blockIdx.x / kCluster;
#pragma unroll
  for (int which = 0; which < kAcc; ++which) {
    float* partial = which == 0 ? a.partial_scale : a.partial_bias;
    if (partial == nullptr) continue;  // uniform over the cluster
    float4* out = reinterpret_cast<float4*>(partial + row * a.cols);
    for (int j = rank * slice + int(threadIdx.x); j < (rank + 1) * slice; j += int(blockDim.x)) {
      float4 v[kCluster];
#pragma unroll
      for (int q = 0; q < kCluster; ++q)
        v[q] = *cluster.map_shared_rank(&sums[which * cols4 + j], q);
      float4 total = v[0];
#pragma unroll
      for (int q = 1; q < kCluster; ++q)
        total = make_float4(total.x + v[q].x, total.y + v[q].y, total.z + v[q].z, total.w + v[q].w);
      out[j] = total;
    }
  }
  cluster.sync();  // no block leaves while its sums may still be read
}

// The staged path's layout for aligned rows of `cols` elements (cols % W == 0), when the
// variant asks for it and one fits; plan.fast == false otherwise (kernels/norm/backward_staged.cu;
// instantiated for f32, f16 and bf16).
template <class T, bool kCentre>
RowPlan plan_backward_staged(Context& ctx, int64_t rows, int64_t cols, BackwardKernel<T>* kernel);

// The tensors of one layer_norm / rms_norm backward call (kernels.h describes them).
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

// Checks the tensors and runs the backward (dscale / dbias [cols], or null).
void norm_backward(Context& ctx, const std::string& where, const BackwardTensors& b, bool centre);

// The partial rows of the column sums (parts x cols each, in the statistics' type; an
// empty buffer for a gradient not wanted): one per block of the register and staged paths,
// one per chunk of rows on the long-row path.
struct PartialRows {
  std::optional<BufferRange> scale, bias;
  int64_t parts = 0;
};

// Takes the partial rows of the wanted gradients as temporaries of the node (its arena gap,
// or the encoder's shared overflow buffer) and points `args` at them.
template <class T, class S>
PartialRows make_partial_rows(Context& ctx, const BackwardTensors& b, int64_t parts,
                              BackwardArgs<T, S>& args) {
  PartialRows p;
  p.parts = parts;
  const size_t bytes = size_t(parts * args.cols) * sizeof(S);
  auto make = [&](std::optional<BufferRange>& range, S*& pointer) {
    range = ctx.encoder.temporary(ctx.allocator, bytes);
    pointer = static_cast<S*>(range->data());
  };
  if (b.dscale) make(p.scale, args.partial_scale);
  if (b.dbias) make(p.bias, args.partial_bias);
  return p;
}

// The byte ranges of the partial rows (what a kernel that writes them declares).
inline BufferList partial_ranges(const PartialRows& p) {
  BufferList list;
  for (const std::optional<BufferRange>* range : {&p.scale, &p.bias})
    if (*range) list.push_back(**range);
  return list;
}

// Sums the partial rows into dscale and dbias ([cols]; either may be null), in a fixed
// order (kernels/norm/backward_partials.cu). S is float or double.
template <class S>
void finish_partials(Context& ctx, const PartialRows& p, int64_t cols, DeviceTensor* dscale,
                     DeviceTensor* dbias);

// The long-row path (kernels/norm/backward.cu's file comment): dx, then the column sums by chunks
// of rows, then finish_partials. Instantiated for f64, f32, f16 and bf16.
template <class T, bool kCentre>
void launch_long_backward(Context& ctx, const BackwardTensors& b, BackwardArgs<T, stats_t<T>> args,
                          const BufferList& reads);

}  // namespace fusebox::cuda::norm
