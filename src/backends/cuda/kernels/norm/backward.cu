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
// Register path (f32, f16, bf16 rows of up to 8,192 16-byte vectors; kernels/norm/rows.cuh): a
// persistent grid of row groups. A group loads its row of x and dy once with 16-byte
// streaming loads into registers (with prefetch, the next row's loads are issued before
// this row is reduced); from the registers it forms the two row sums (g, g * x_hat), adds
// dy * x_hat and dy into per-column f32 accumulators (a thread owns the same columns in
// every row: in registers when they fit, else in shared memory), reduces the row sums
// over the group and writes dx from the same registers. At the end each block sums its
// groups' accumulators (in group order) into one partial row per block (per cluster of
// blocks where the layout runs in thread-block clusters: kernels/norm/backward_impl.cuh,
// write_cluster_partials); a second small kernel sums the partial rows in a fixed order
// into dscale and dbias. So x and dy come
// from DRAM once and dx is written once, plus 2 x (blocks x cols) f32 partials written
// and read (about 2-8% more bytes at 1K-16K columns): target 80% of the device's copy
// bandwidth or more, counting x, dy and dx. No atomics: the result is the same every run.
// The layout comes from plan_backward and the tuning variant (kernels/norm/tuning.h).
//
// Staged path (kernels/norm/backward_staged.cu; the variant's backward_staged): the same
// arithmetic with x and dy copied into shared memory rows ahead (cp.async), several
// row groups per block, one partial row per block.
//
// Long-row path (kernels/norm/backward_long.cu: longer rows, unaligned data, cols not a multiple
// of the vector width, f64): dx by a block per row in two passes over the row (row sums,
// then dx); dscale and dbias by a column kernel (32 columns x 8 row slices per block over
// chunks of rows, reduced in a fixed order to one partial row per chunk), then the same
// partial-row sum. About half the register path's speed.
//
// Every path ends with one kernel summing the partial rows of dscale and dbias in a fixed
// order (kernels/norm/backward_partials.cu), which may also drop them from L2 unwritten.
// kernels/norm/backward_op.cu has the IR ops and the direct-call entry points.
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/norm/backward_impl.cuh"
#include "backends/cuda/kernels/norm/backward_rows.cuh"
#include "backends/cuda/kernels/norm/common.h"
#include "backends/cuda/kernels/norm/rows.cuh"

namespace fusebox::cuda {

namespace {

using norm::RowPlan;
using norm::stats_t;

using norm::backward_max_block;
using norm::backward_rows;
using norm::BackwardArgs;
using norm::BackwardKernel;
using norm::BackwardTensors;

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

// The same in thread-block clusters of kPartialCluster blocks, one partial row per cluster.
template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc, int kBlock,
          int kMinBlocks, int kPartialCluster>
__global__ void __cluster_dims__(kPartialCluster, 1, 1) __launch_bounds__(kBlock, kMinBlocks)
    norm_backward_capped_cluster_rows(BackwardArgs<T, float> a) {
  backward_rows<T, kCentre, kVecs, kPrefetch, kSmemAcc, 1, kPartialCluster>(a);
}

// Pairs of blocks per row (f32 / f16 / bf16 rows too wide for one block to prefetch).
constexpr int kClusterBlocks = 2;
template <class T, bool kCentre, int kVecs, bool kPrefetch, bool kSmemAcc>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1)
    __launch_bounds__(backward_max_block<T, kCentre, kVecs, kPrefetch, kSmemAcc>())
        norm_backward_cluster_rows(BackwardArgs<T, float> a) {
  backward_rows<T, kCentre, kVecs, kPrefetch, kSmemAcc, kClusterBlocks>(a);
}

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

// The layout that also comes in clusters (the default's at 1,024-4,096 bf16 columns):
// clusters of 4 or 2 blocks, one partial row per cluster.
constexpr size_t kClusteredCapped = 3;
constexpr int kCappedClusters[] = {4, 2};

template <class T, bool kCentre, size_t I>
BackwardKernel<T> capped_kernel_at(int cluster) {
  constexpr CappedLayout l = kCappedLayouts[I];
  constexpr int min_blocks = 65536 / (l.block * l.max_regs);
  if constexpr (I == kClusteredCapped) {
    static_assert(!l.prefetch && !l.smem_acc);
    if (cluster == 4) {
      return {&norm_backward_capped_cluster_rows<T, kCentre, l.vecs, false, false, l.block,
                                                 min_blocks, 4>,
              l.block};
    }
    if (cluster == 2) {
      return {&norm_backward_capped_cluster_rows<T, kCentre, l.vecs, false, false, l.block,
                                                 min_blocks, 2>,
              l.block};
    }
  }
  if (cluster > 1) return {};
  return {
      &norm_backward_capped_rows<T, kCentre, l.vecs, l.prefetch, l.smem_acc, l.block, min_blocks>,
      l.block};
}

template <class T, bool kCentre, size_t... I>
BackwardKernel<T> capped_kernel(size_t index, int cluster, std::index_sequence<I...>) {
  BackwardKernel<T> k;
  if constexpr (is_half_v<T>) {
    ((index == I ? (void)(k = capped_kernel_at<T, kCentre, I>(cluster)) : void()), ...);
  } else {
    (void)index, (void)cluster;
  }
  return k;
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
          constexpr auto kLayouts = std::make_index_sequence<std::size(kCappedLayouts)>{};
          BackwardKernel<T> k = capped_kernel<T, kCentre>(i, 1, kLayouts);
          const int groups = l.block / threads;
          size_t shared_bytes = backward_shared_bytes<kCentre>(smem_acc, groups, cols);
          const int64_t work = (rows + groups - 1) / groups;
          unsigned grid = norm::persistent_grid(k, l.block, shared_bytes, props, work);
          if (grid == 0 || !norm::spill_free(k, props)) continue;
          // LayerNorm (two partial rows per block): clusters, one partial row each, where
          // one keeps the whole grid: the largest such, its blocks' sums staged in
          // [2][cols] floats of shared memory. Not RMSNorm, where clusters did not pay
          // (bench/results/norm_tuning.md).
          int cluster = 1;
          for (const int c : kCappedClusters) {
            if (!kCentre || i != kClusteredCapped || c > variant.cluster_partials ||
                cols % (4 * c) != 0)
              continue;
            const size_t cluster_bytes = size_t(kCentre ? 2 : 1) * size_t(cols) * sizeof(float);
            const BackwardKernel<T> ck = capped_kernel<T, kCentre>(i, c, kLayouts);
            const unsigned cgrid = norm::persistent_cluster_grid(ck, l.block, cluster_bytes, props,
                                                                 c, (work + c - 1) / c);
            if (cgrid < grid || !norm::spill_free(ck, props)) continue;
            k = ck, grid = cgrid, cluster = c, shared_bytes = cluster_bytes;
            break;
          }
          plan.fast = true;
          plan.cluster = cluster;
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
        const unsigned grid =
            norm::persistent_cluster_grid(k, threads, shared_bytes, props, kClusterBlocks, rows);
        if (grid == 0) continue;
        plan.fast = true;
        plan.vecs = vecs;
        plan.threads_per_row = threads;
        plan.block = threads;
        plan.prefetch = true;
        plan.smem_acc = smem_acc;
        plan.shared_bytes = shared_bytes;
        plan.cluster = kClusterBlocks;
        plan.grid = grid;
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
// the variant allows), then plain ones; within each, from the variant's vectors per thread
// up; for each layout the column sums in registers first (in shared memory first when the
// variant says so). A variant with a register cap tries its capped layouts
// (plan_backward_capped) before the ordinary ones. The first that fits kMaxRowThreads
// threads per row, the shared memory and the registers wins.
template <class T, bool kCentre>
norm::RowPlan plan_backward_registers(Context& ctx, int64_t rows, int64_t cols,
                                      BackwardKernel<T>* kernel) {
  constexpr int W = kVecWidth<T>;
  norm::RowPlan plan;
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

// The layout for aligned rows of `cols` elements (plan.fast == false: the long-row path):
// the staged path's (kernels/norm/backward_staged.cu) first when the variant always wants it, or
// where the register path's layout would keep the column sums in shared memory and the
// variant wants it there (the staged path keeps them in registers); else the register
// path's.
template <class T, bool kCentre>
norm::RowPlan plan_backward_uncached(Context& ctx, int64_t rows, int64_t cols, bool aligned,
                                     BackwardKernel<T>* kernel) {
  if (!aligned || cols % kVecWidth<T> != 0) return norm::RowPlan();
  const norm::StagedUse use = norm::norm_variant().backward_staged;
  if (use == norm::StagedUse::always) {
    const norm::RowPlan staged = norm::plan_backward_staged<T, kCentre>(ctx, rows, cols, kernel);
    if (staged.fast) return staged;
  }
  const norm::RowPlan plan = plan_backward_registers<T, kCentre>(ctx, rows, cols, kernel);
  if (plan.fast && plan.smem_acc && use == norm::StagedUse::for_shared_sums) {
    const norm::RowPlan staged = norm::plan_backward_staged<T, kCentre>(ctx, rows, cols, kernel);
    if (staged.fast) return staged;  // else *kernel is still the register path's
  }
  return plan;
}

// plan_backward_uncached, remembered per device, shape, alignment and variant: planning
// asks the driver for occupancies and attributes (a dozen calls for the staged path's
// cluster sizes), host time that an eager caller would pay on every call.
template <class T, bool kCentre>
norm::RowPlan plan_backward(Context& ctx, int64_t rows, int64_t cols, bool aligned,
                            BackwardKernel<T>* kernel) {
  using Key = std::tuple<int, int64_t, int64_t, bool, const norm::Variant*>;
  static std::mutex mutex;
  static std::map<Key, std::pair<norm::RowPlan, BackwardKernel<T>>> cache;
  const Key key{ctx.device.id(), rows, cols, aligned, &norm::norm_variant()};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) {
      *kernel = it->second.second;
      return it->second.first;
    }
  }
  const norm::RowPlan plan = plan_backward_uncached<T, kCentre>(ctx, rows, cols, aligned, kernel);
  const std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= 1024) cache.clear();  // shapes that vary without end: start over
  cache.insert_or_assign(key, std::make_pair(plan, *kernel));
  return plan;
}

template <class T, bool kCentre>
void launch_backward(Context& ctx, const BackwardTensors& b, int64_t rows, int64_t cols) {
  using S = stats_t<T>;
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
  if constexpr (!std::is_same_v<T, double>) {
    const bool aligned = norm::aligned16(args.x) && norm::aligned16(args.dy) &&
                         norm::aligned16(args.scale) && norm::aligned16(args.dx);
    BackwardKernel<T> kernel;
    const RowPlan plan = plan_backward<T, kCentre>(ctx, rows, cols, aligned, &kernel);
    if (plan.fast) {
      args.threads_per_row = plan.threads_per_row;
      // One partial row per block (per cluster).
      const norm::PartialRows partials =
          norm::make_partial_rows(ctx, b, plan.grid / plan.cluster, args);
      BufferList writes = norm::ranges({&b.dx});
      for (const BufferRange& r : norm::partial_ranges(partials)) writes.push_back(r);
      ctx.encoder.launch(kernel.fn, dim3(plan.grid), dim3(plan.block), plan.shared_bytes, reads,
                         writes, args);
      norm::finish_partials<S>(ctx, partials, cols, b.dscale, b.dbias);
      return;
    }
  }
  norm::launch_long_backward<T, kCentre>(ctx, b, args, reads);
}

}  // namespace

void norm::norm_backward(Context& ctx, const std::string& where, const BackwardTensors& b,
                         bool centre) {
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
