// layer_norm / rms_norm forward, staged path (kernels/norm/forward.cu has the algorithm, the
// register path and the planner; a variant's forward_staged asks for this one,
// kernels/norm/tuning.h).
//
// The register path's arithmetic, but a row reaches its threads through shared memory:
// each thread copies its own 16-byte vectors of x for the row kStages - 1 rows ahead with
// cp.async (kernels/norm/staging.cuh), so two rows' loads stay in flight through the current
// row's reductions and its writes of y without holding registers. The register path's
// prefetch holds the next row in registers instead: at f32 16,384 columns that is 16 more
// registers per thread, one row ahead, one block of 1024 per SM, and LayerNorm ran at
// 89-90% of a copy (bench/results/2026-11-22_h100_session4/). Per row, after the wait:
//   1. the thread's vectors move from its stage slots to registers (the slots are then
//      free: the next issue reuses them);
//   2. the register path's normalize_row (kernels/norm/forward_impl.cuh): statistics, then y.
// A block is G row groups of R threads (G * R = 1024), rows dealt as in the register path
// (group g of block b takes rows b * G + g, then + G * grid, ...).
#include "backends/cuda/kernels/norm/forward_impl.cuh"
#include "backends/cuda/kernels/norm/staging.cuh"

namespace fusebox::cuda::norm {

namespace {

constexpr int kMaxStages = 3;  // 3 x 64 KB at 16,384 f32 columns: two rows in flight

// Dynamic shared memory: [G][kStages][kVecs][R] vectors (thread t of a group owns column t
// of its group's slots: consecutive threads, consecutive 16-byte slots).
template <class T, bool kCentre, int kVecs, int kStages>
__global__ void __launch_bounds__(kStagedBlock, 1)
    norm_forward_staged_rows(ForwardArgs<T, float> a) {
  constexpr int W = kVecWidth<T>;
  extern __shared__ uint4 stage_smem[];
  __shared__ SumSlots<1> slots;
  const int R = a.threads_per_row;
  const int groups = blockDim.x / R;
  const int group = threadIdx.x / R, t = threadIdx.x % R;
  const int64_t cols = a.cols;
  const int nvec = int(cols / W);
  // Row indices fit an int (the host checks): fewer registers than 64-bit ones.
  const int stride = int(gridDim.x) * groups;
  const int rows = int(a.rows);

  const unsigned mine = unsigned(__cvta_generic_to_shared(stage_smem)) +
                        unsigned((group * kStages * kVecs * R + t) * kVecBytes);
  auto slot = [&](int s, int k) { return mine + unsigned((s * kVecs + k) * R * kVecBytes); };
  auto issue = [&](int row, int s) {
    if (row < rows) {
      const uint4* x = reinterpret_cast<const uint4*>(a.x + int64_t(row) * cols);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int i = k * R + t;
        if (i < nvec) copy_async16(slot(s, k), x + i);
      }
    }
    commit_copies();  // an empty group past the last row: the wait count stays uniform
  };

  const int first_row = int(blockIdx.x) * groups + group;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(first_row + s * stride, s);
  int parity = 0, s = 0;  // s: the current row's stage
  // Every thread of the block runs every iteration (base is uniform), so the barriers of
  // group_sum see them all; a group past the last row computes on zeros, stores nothing.
  for (int base = int(blockIdx.x) * groups; base < rows; base += stride) {
    const int row = base + group;
    const bool active = row < rows;
    // The stage read in the last iteration (its values are in registers since) takes the
    // row kStages - 1 ahead.
    issue(row + (kStages - 1) * stride, s == 0 ? kStages - 1 : s - 1);
    wait_copies<kStages - 1>();  // this row's copies have landed
    Packed v[kVecs] = {};
    bool valid[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      valid[k] = active && k * R + t < nvec;
      if (valid[k]) {
        const uint4 u = load_shared16(slot(s, k));
        v[k] = {{u.x, u.y, u.z, u.w}};
      }
    }

    normalize_row<T, kCentre, kVecs>(a, v, valid, row, active, R, t, slots, parity);
    if (++s == kStages) s = 0;
  }
  wait_copies<0>();  // no copy outlives the block
}

// The instantiated layouts: 4 vectors per thread (a 16,384-column f32 row over 1024
// threads), 2 or 3 stages.
constexpr int kStagedVecs = 4;
template <class T, bool kCentre>
ForwardKernel<T> staged_kernel(int stages) {
  if (stages == 2) return {&norm_forward_staged_rows<T, kCentre, kStagedVecs, 2>, kStagedBlock};
  return {&norm_forward_staged_rows<T, kCentre, kStagedVecs, 3>, kStagedBlock};
}

}  // namespace

// Four vectors per thread (fit_row: R >= 32 threads per row, else no staged layout),
// G = 1024 / R groups per block, and the most stages (3, else 2) whose shared memory fits;
// the first that launches without spilling wins.
template <class T, bool kCentre>
RowPlan plan_forward_staged(int64_t rows, int64_t cols, const DeviceProperties& props,
                            ForwardKernel<T>* kernel) {
  constexpr int W = kVecWidth<T>;
  RowPlan plan;
  // The kernel's row indices are ints, up to rows + 3 grid strides.
  if (cols % W != 0 || rows > (int64_t(1) << 30)) return plan;
  int vecs = kStagedVecs, threads = 0;
  fit_row(cols / W, vecs, threads);
  if (vecs != kStagedVecs || threads < 32) return plan;  // rows too short (or too long)
  const int groups = kStagedBlock / threads;
  for (int stages = kMaxStages; stages >= 2; --stages) {
    const size_t shared_bytes = size_t(groups) * stages * vecs * threads * kVecBytes;
    const ForwardKernel<T> k = staged_kernel<T, kCentre>(stages);
    const unsigned grid =
        persistent_grid(k, kStagedBlock, shared_bytes, props, (rows + groups - 1) / groups);
    if (grid == 0 || !spill_free(k, props)) continue;
    plan.fast = true;
    plan.vecs = vecs;
    plan.threads_per_row = threads;
    plan.block = kStagedBlock;
    plan.shared_bytes = shared_bytes;
    plan.stages = stages;
    plan.grid = grid;
    *kernel = k;
    return plan;
  }
  return plan;
}

#define FUSEBOX_FORWARD_STAGED_PLAN(T)                                                      \
  template RowPlan plan_forward_staged<T, true>(int64_t, int64_t, const DeviceProperties&,  \
                                                ForwardKernel<T>*);                         \
  template RowPlan plan_forward_staged<T, false>(int64_t, int64_t, const DeviceProperties&, \
                                                 ForwardKernel<T>*);
FUSEBOX_FORWARD_STAGED_PLAN(float)
FUSEBOX_FORWARD_STAGED_PLAN(__half)
FUSEBOX_FORWARD_STAGED_PLAN(__nv_bfloat16)
#undef FUSEBOX_FORWARD_STAGED_PLAN

}  // namespace fusebox::cuda::norm
