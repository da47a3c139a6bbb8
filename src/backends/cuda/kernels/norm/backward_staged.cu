// layer_norm / rms_norm backward, staged path (kernels/norm/backward.cu has the algorithm and the
// other paths; a variant's backward_staged asks for this one, kernels/norm/tuning.h).
//
// The register path's arithmetic, but a row reaches its threads through shared memory.
// Each thread copies its own 16-byte vectors of x and dy for the row kStages - 1 rows
// ahead with cp.async (kernels/norm/staging.cuh), so that loads stay in flight through the row
// reduction and the writes of dx without holding any registers. The register path, by
// contrast,
// has no load in flight while a row group reduces and writes (or halves its blocks per SM
// to prefetch). The column sums stay in registers and the scale in shared memory (read
// every row: it would not fit the L1 space the stages leave).
//
// It pays only where the register path would keep its two column sums per element in
// shared memory (LayerNorm f16/bf16 at long rows), so the default variant takes it there
// alone (kernels/norm/backward.cu: plan_backward; figures in bench/results/norm_tuning.md).
//
// A block is G row groups of R threads (R >= 32, G * R = 1024; one block per
// SM, registers capped at 64) that reduce their row sums together (kernels/norm/rows.cuh:
// group_sum, one block-wide barrier per row: the copies in flight keep the memory busy
// meanwhile), and the block writes one partial row of column sums for all of them (group
// order, through shared memory at the end), or its slice of its cluster's partial row
// (write_cluster_partials, when the planner forms clusters): a third or a quarter of the
// register path's partial rows at 4,096 columns, half that again in clusters of 2. The column sums
// live in registers (2 x V x W floats per thread for layer_norm). Rows are dealt to groups as in
// the register path (group g of block b takes rows b * G + g, then + G * grid, ...): the result is
// the same every run.
#include <vector>

#include "backends/cuda/kernels/norm/backward_impl.cuh"
#include "backends/cuda/kernels/norm/staging.cuh"

namespace fusebox::cuda::norm {

namespace {

constexpr int kMaxStages = 3;  // 3 x 64 KB at 16,384 bf16 columns: two rows in flight

// Dynamic shared memory: [G][kStages][x, dy][kVecs][R] vectors (thread t of a group owns
// column t of its group's slots: consecutive threads, consecutive 16-byte slots), then the
// scale, [kVecs][G * R] vectors (each thread's own copy of the vectors it uses); the stages
// are reused at the end to stage the block's column sums ([kAcc][cols] floats).
template <class T, bool kCentre, int kVecs, int kStages, int kCluster>
__device__ __forceinline__ void staged_rows(const BackwardArgs<T, float>& a) {
  constexpr int W = kVecWidth<T>;
  constexpr int kAcc = kCentre ? 2 : 1;  // dscale (and dbias) column sums
  extern __shared__ uint4 stage_smem[];
  __shared__ SumSlots<2> slots;
  const int R = a.threads_per_row;
  const int groups = blockDim.x / R;
  const int group = threadIdx.x / R, t = threadIdx.x % R;
  const int64_t cols = a.cols;
  const int nvec = int(cols / W);
  const float inv_cols = 1.0f / float(cols);
  // Row indices fit an int (the host checks): fewer registers than 64-bit ones.
  const int stride = int(gridDim.x) * groups;
  const int rows = int(a.rows);

  // This thread's slot of vector k of x (which = 0) or dy (1) in stage s, as a shared-window
  // address (32 bits: fewer registers than a generic pointer).
  const unsigned mine = unsigned(__cvta_generic_to_shared(stage_smem)) +
                        unsigned((group * kStages * 2 * kVecs * R + t) * kVecBytes);
  auto slot = [&](int s, int which, int k) {
    return mine + unsigned(((s * 2 + which) * kVecs + k) * R * kVecBytes);
  };
  auto issue = [&](int row, int s) {
    if (row < rows) {
      const uint4* x = reinterpret_cast<const uint4*>(a.x + int64_t(row) * cols);
      const uint4* dy = reinterpret_cast<const uint4*>(a.dy + int64_t(row) * cols);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int i = k * R + t;
        if (i < nvec) {
          copy_async16(slot(s, 0, k), x + i);
          copy_async16(slot(s, 1, k), dy + i);
        }
      }
    }
    commit_copies();  // an empty group past the last row: the wait count stays uniform
  };

  // The scale vectors this thread uses, in shared memory after the stages (read every row:
  // from shared memory they cost no L1 space, which the stages leave little of).
  const unsigned scale_slots = unsigned(__cvta_generic_to_shared(stage_smem)) +
                               unsigned((groups * kStages * 2 * kVecs * R) * kVecBytes) +
                               unsigned(threadIdx.x * kVecBytes);
  auto scale_slot = [&](int k) { return scale_slots + unsigned(k * blockDim.x * kVecBytes); };
  if (a.scale) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = k * R + t;
      if (i < nvec)
        store_shared16(scale_slot(k), __ldg(reinterpret_cast<const uint4*>(a.scale) + i));
    }
  }
  auto scale_at = [&](int k) {
    return a.scale ? packed<T>(load_shared16(scale_slot(k))) : ones_packed<T>();
  };

  float acc[kAcc][kVecs][W] = {};
  // The groups of a block step through their rows together (the row reduction is one
  // block-wide barrier); a group past the last row only takes part in the barriers.
  const int first_row = int(blockIdx.x) * groups + group;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(first_row + s * stride, s);
  int parity = 0, s = 0;  // s: the current row's stage
  for (int base = int(blockIdx.x) * groups; base < rows; base += stride) {
    const int row = base + group;
    const bool active = row < rows;
    // The stage this thread read in the last iteration (its own slots: their values were
    // used before this point) takes the row kStages - 1 ahead.
    issue(row + (kStages - 1) * stride, s == 0 ? kStages - 1 : s - 1);
    const float mean = kCentre && active ? a.mean[row] : 0.0f;
    const float rstd = active ? a.rstd[row] : 0.0f;
    wait_copies<kStages - 1>();  // this row's copies have landed

    // Row sums of g and g * x_hat; column sums of dy * x_hat (and dy). g rounded on its
    // own, as in the register path.
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = k * R + t;
      if (!active || i >= nvec) continue;
      const Packed x = packed<T>(load_shared16(slot(s, 0, k))),
                   dy = packed<T>(load_shared16(slot(s, 1, k)));
      const Packed scale = scale_at(k);
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float x_hat = (unpack<T>(x, w) - mean) * rstd;
        const float d = unpack<T>(dy, w);
        const float g = __fmul_rn(d, unpack<T>(scale, w));
        sums[0] += g;
        sums[1] += g * x_hat;
        acc[0][k][w] += d * x_hat;
        if constexpr (kCentre) acc[1][k][w] += d;
      }
    }
    group_sum(sums, slots, R, parity);
    parity ^= 1;
    const float mean_g = kCentre ? sums[0] * inv_cols : 0.0f;
    const float mean_gx = sums[1] * inv_cols;

    T* dx = a.dx + int64_t(row) * cols;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = k * R + t;
      if (!active || i >= nvec) continue;
      const Packed x = packed<T>(load_shared16(slot(s, 0, k))),
                   dy = packed<T>(load_shared16(slot(s, 1, k)));
      const Packed scale = scale_at(k);
      float out[W];
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float x_hat = (unpack<T>(x, w) - mean) * rstd;
        const float g = __fmul_rn(unpack<T>(dy, w), unpack<T>(scale, w));
        out[w] = rstd * (g - mean_g - x_hat * mean_gx);
      }
      store_packed_stream(dx, i, pack<T>(out));
    }
    if (++s == kStages) s = 0;
  }

  wait_copies<0>();
  __syncthreads();  // every slot is free: the staging below reuses them
  if constexpr (kCluster > 1) {
    write_cluster_partials<T, kAcc, kVecs, kCluster>(a, acc, reinterpret_cast<float4*>(stage_smem),
                                                     group, groups, t);
    return;
  }
  // This block's partial row: its groups' column sums added in group order (in the stages'
  // space, free by now), then copied out whole.
  float4* sums = reinterpret_cast<float4*>(stage_smem);  // [kAcc][cols / 4]
  stage_block_sums<T, kAcc, kVecs>(a, acc, sums, group, groups, t);
  const int64_t cols4 = cols / 4;
#pragma unroll
  for (int which = 0; which < kAcc; ++which) {
    float* partial = which == 0 ? a.partial_scale : a.partial_bias;
    if (partial == nullptr) continue;  // uniform over the block
    float4* out = reinterpret_cast<float4*>(partial + int64_t(blockIdx.x) * cols);
    for (int64_t j = threadIdx.x; j < cols4; j += blockDim.x) out[j] = sums[which * cols4 + j];
  }
}

template <class T, bool kCentre, int kVecs, int kStages>
__global__ void __launch_bounds__(kStagedBlock, 1)
    norm_backward_staged_rows(BackwardArgs<T, float> a) {
  staged_rows<T, kCentre, kVecs, kStages, 1>(a);
}
template <class T, bool kCentre, int kVecs, int kStages, int kCluster>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kStagedBlock, 1)
    norm_backward_staged_cluster_rows(BackwardArgs<T, float> a) {
  staged_rows<T, kCentre, kVecs, kStages, kCluster>(a);
}

template <class T, bool kCentre, int kVecs, int kStages>
BackwardKernel<T> bound_staged(int cluster) {
  switch (cluster) {
    case 2:
      return {&norm_backward_staged_cluster_rows<T, kCentre, kVecs, kStages, 2>, kStagedBlock};
    case 4:
      return {&norm_backward_staged_cluster_rows<T, kCentre, kVecs, kStages, 4>, kStagedBlock};
    case 8:
      return {&norm_backward_staged_cluster_rows<T, kCentre, kVecs, kStages, 8>, kStagedBlock};
    default:
      return {&norm_backward_staged_rows<T, kCentre, kVecs, kStages>, kStagedBlock};
  }
}

// The instantiated layouts: 2 vectors per thread (x and dy each; 4 would need 64
// registers of bf16 column sums alone), 2 or 3 stages. (1 vector per thread is left out:
// its kernels stopped with "illegal instruction" on the H100 at bf16 1024 columns, R =
// 128, 8 groups, for a reason not found; 2 vectors cover every width the path serves.)
constexpr int kStagedVecs = 2;
template <class T, bool kCentre>
BackwardKernel<T> staged_kernel(int stages, int cluster) {
  return stages == 2 ? bound_staged<T, kCentre, kStagedVecs, 2>(cluster)
                     : bound_staged<T, kCentre, kStagedVecs, 3>(cluster);
}

}  // namespace

// Two vectors per thread (R >= 32 threads per row), G = 1024 / R groups per block, and the
// most stages (3, else 2) whose shared memory fits; the first such kernel that launches
// without spilling wins, in clusters (write_cluster_partials) when the variant allows and
// a cluster size keeps the whole grid.
template <class T, bool kCentre>
RowPlan plan_backward_staged(Context& ctx, int64_t rows, int64_t cols, BackwardKernel<T>* kernel) {
  constexpr int W = kVecWidth<T>;
  RowPlan plan;
  const Variant& variant = norm_variant();
  // The kernel's row indices are ints, up to rows + 3 grid strides.
  if (variant.backward_staged == StagedUse::never || cols % W != 0 || rows > (int64_t(1) << 30)) {
    return plan;
  }
  const DeviceProperties& props = ctx.device.properties();
  int vecs = kStagedVecs, threads = 0;
  fit_row(cols / W, vecs, threads);
  if (vecs != kStagedVecs || threads < 32) return plan;  // rows too short (or too long)
  const int groups = kStagedBlock / threads;
  const int64_t work = (rows + groups - 1) / groups;  // row groups
  // The block's sums ([kAcc][cols] floats) are staged at the end in the space of two stages
  // (8 x W bytes per vector against 64: they always fit; checked all the same).
  if (size_t(kCentre ? 2 : 1) * cols * sizeof(float) >
      size_t(groups) * 2 * 2 * vecs * threads * kVecBytes)
    return plan;
  // Cluster sizes to try, largest first: those whose slices of the partial row are whole
  // float4s.
  std::vector<int> clusters;
  for (int c = variant.staged_cluster_partials; c >= 2; c /= 2)
    if (cols % (4 * c) == 0) clusters.push_back(c);
  for (int stages = kMaxStages; stages >= 2; --stages) {
    const size_t stage_bytes = size_t(groups) * stages * 2 * vecs * threads * kVecBytes;
    const size_t shared_bytes = stage_bytes + size_t(groups) * vecs * threads * kVecBytes;  // scale
    const BackwardKernel<T> plain = staged_kernel<T, kCentre>(stages, 1);
    const unsigned plain_grid = persistent_grid(plain, kStagedBlock, shared_bytes, props, work);
    if (plain_grid == 0 || !spill_free(plain, props)) continue;
    // The largest cluster whose grid keeps every block of the plain grid (a cluster must
    // fit in one GPC: 8 blocks of one per SM gave 120 of 132 on the H100, and the main
    // loop, bound by each SM's rate, slowed in proportion); else no cluster.
    int cluster = 1;
    unsigned grid = plain_grid;
    BackwardKernel<T> k = plain;
    for (const int c : clusters) {
      const BackwardKernel<T> ck = staged_kernel<T, kCentre>(stages, c);
      const unsigned cgrid =
          persistent_cluster_grid(ck, kStagedBlock, shared_bytes, props, c, (work + c - 1) / c);
      if (cgrid == 0 || !spill_free(ck, props) || cgrid < plain_grid) continue;
      cluster = c, grid = cgrid, k = ck;
      break;
    }
    plan.fast = true;
    plan.vecs = vecs;
    plan.threads_per_row = threads;
    plan.block = kStagedBlock;
    plan.shared_bytes = shared_bytes;
    plan.stages = stages;
    plan.cluster = cluster;
    plan.grid = grid;
    *kernel = k;
    return plan;
  }
  return plan;
}

#define FUSEBOX_STAGED_PLAN(T)                                                                    \
  template RowPlan plan_backward_staged<T, true>(Context&, int64_t, int64_t, BackwardKernel<T>*); \
  template RowPlan plan_backward_staged<T, false>(Context&, int64_t, int64_t, BackwardKernel<T>*);
FUSEBOX_STAGED_PLAN(float)
FUSEBOX_STAGED_PLAN(__half)
FUSEBOX_STAGED_PLAN(__nv_bfloat16)
#undef FUSEBOX_STAGED_PLAN

}  // namespace fusebox::cuda::norm
