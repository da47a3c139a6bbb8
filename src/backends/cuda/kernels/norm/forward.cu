// layer_norm and rms_norm, forward.
//
// Each of `rows` rows of `cols` elements (cols = the product of the normalised dims,
// x's dims from `axis` on) becomes
//   y = (x - mean) * rstd * scale + bias,   rstd = 1 / sqrt(var + eps)
// with mean and var the row's mean and population variance (layer_norm), or, without
// centring (rms_norm), mean = 0 and var = mean(x^2). The statistics go to the outputs
// mean and inv_std_dev (layer_norm) or inv_rms (rms_norm), one per row, in f32 (f64 for
// f64 x). Arithmetic runs in f32 (f64 for f64), and the variance is always the second
// pass over the row, sum((x - mean)^2), never E[x^2] - E[x]^2.
//
// Register path (f32, f16, bf16 rows of up to 8,192 16-byte vectors: 32K f32 or 64K
// f16/bf16 elements; kernels/norm/rows.cuh): a row group of R threads loads its row once with
// 16-byte streaming loads into registers (V vectors per thread), reduces the sum for the
// mean, then the squared deviations, and writes y from the same registers. With prefetch
// (the default where registers allow) the group's next row is already loading while it
// reduces this one. x is read once and y written once, so the kernel should run near the
// device's copy bandwidth (target: 90% of a device-to-device copy; the statistics add 8
// bytes per row). The layout (V, R, prefetch) comes from plan_forward and the tuning
// variant (kernels/norm/tuning.h).
//
// Long-row path (longer rows, unaligned data, cols not a multiple of the vector width,
// f64): a block per row, three passes over the row (sum, squared deviations, y) with
// scalar accesses; the second and third reads mostly hit L2. Correct, about a third of
// the register path's speed.
#include <atomic>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/norm/common.h"
#include "backends/cuda/kernels/norm/forward_impl.cuh"
#include "backends/cuda/kernels/norm/rows.cuh"
#include "backends/cuda/runtime/settings.h"

namespace fusebox::cuda {

namespace norm {

namespace {

// Variant 0 is the default; the others are what the benchmark compares it with. The
// default: the forward prefetches the next row, the backward does not (its prefetch
// registers halve the blocks per SM) and caps f16/bf16 kernels at 80 registers, drops the
// partial column sums from L2 once summed, takes the staged path only where the register
// path would keep its column sums in shared memory, and uses clusters of 2 on LayerNorm's
// 80-register layout only. Measurements behind each choice: bench/results/norm_tuning.md.
constexpr StagedUse kNoStaged = StagedUse::never, kStagedAlways = StagedUse::always,
                    kStagedForSharedSums = StagedUse::for_shared_sums,
                    kStagedForLongRows = StagedUse::for_long_rows;
constexpr Variant kVariants[] = {
    // Fields not named keep Variant's defaults (kernels/norm/tuning.h).
    {.name = "r80-discard-staged",
     .backward_max_regs = 80,
     .backward_staged = kStagedForSharedSums,
     .discard_partials = true,
     .cluster_partials = 8,
     .forward_staged = kStagedForLongRows},
    {.name = "v2-fwd-prefetch-r80", .backward_max_regs = 80},
    {.name = "v2-fwd-prefetch"},
    {.name = "v2-prefetch", .backward_prefetch = true},
    {.name = "v4-prefetch", .forward_vecs = 4, .backward_vecs = 1, .backward_prefetch = true},
    {.name = "v2-plain", .forward_prefetch = false},
    {.name = "v1-smem-acc",
     .forward_vecs = 1,
     .backward_prefetch = true,
     .backward_smem_acc = true},
    {.name = "v2-cluster",
     .backward_prefetch = true,
     .backward_cluster = true,
     .backward_cluster_min_cols = 8192},
    // Backward register caps (kernels/norm/backward.cu: kCappedLayouts), for f16 / bf16 LayerNorm,
    // whose two column sums per element otherwise take 88 registers at V=2 (2 blocks of 256
    // per SM). 64 registers: 1024-thread blocks of 2 row groups of 512 at 4096 columns
    // (one partial row per block, 32 warps per SM); RMSNorm at V=2: 4 groups of 256.
    // 80 (the default's): blocks of 256, 3 per SM. Layouts without a capped kernel get the
    // ordinary one.
    {.name = "v1-plain-r64", .backward_vecs = 1, .backward_max_regs = 64},
    {.name = "v1-prefetch-r64",
     .backward_vecs = 1,
     .backward_prefetch = true,
     .backward_max_regs = 64},
    {.name = "v2-plain-r64", .backward_max_regs = 64},
    // The staged backward (kernels/norm/backward_staged.cu), else the default's layouts; the
    // partial column sums discarded from L2 after the final sum, or kept; both in clusters
    // of up to 8 blocks where one keeps the grid (2 on the H100).
    {.name = "staged-v2",
     .backward_max_regs = 80,
     .backward_staged = kStagedAlways,
     .discard_partials = true,
     .cluster_partials = 8,
     .staged_cluster_partials = 8},
    {.name = "staged-v2-keep",
     .backward_max_regs = 80,
     .backward_staged = kStagedAlways,
     .cluster_partials = 8,
     .staged_cluster_partials = 8},
    {.name = "v2-fwd-prefetch-r80-discard", .backward_max_regs = 80, .discard_partials = true},
    // The default without clusters (one partial row per block).
    {.name = "r80-discard-staged-noclu",
     .backward_max_regs = 80,
     .backward_staged = kStagedForSharedSums,
     .discard_partials = true,
     .forward_staged = kStagedForLongRows},
    // The forward's staged path for every width it fits.
    {.name = "fwd-staged",
     .backward_max_regs = 80,
     .backward_staged = kStagedForSharedSums,
     .discard_partials = true,
     .cluster_partials = 8,
     .forward_staged = kStagedAlways},
};

int variant_from_settings() {
  const size_t index = settings().norm_variant;
  FUSEBOX_CHECK(index < std::size(kVariants), "FUSEBOX_NORM_VARIANT", "is ", index,
                "; the variants are 0 to ", std::size(kVariants) - 1);
  return int(index);
}

std::atomic<int> selected{-1};  // -1: the settings' variant

}  // namespace

std::span<const Variant> norm_variants() {
  return kVariants;
}

const Variant& norm_variant() {
  const int index = selected.load(std::memory_order_relaxed);
  return kVariants[index >= 0 ? index : variant_from_settings()];
}

void select_norm_variant(int index) {
  FUSEBOX_CHECK(index >= 0 && size_t(index) < std::size(kVariants), "select_norm_variant",
                "no variant ", index, "; the variants are 0 to ", std::size(kVariants) - 1);
  selected.store(index, std::memory_order_relaxed);
}

}  // namespace norm

namespace {

using norm::RowPlan;
using norm::stats_t;

using norm::ForwardArgs;
using norm::ForwardKernel;

// Register path: see kernels/norm/rows.cuh for the layout (row groups of R threads, V vectors
// of W elements per thread, persistent grid over rows). Per row:
//   1. (kPrefetch: issue the loads of the group's next row into `next`);
//   2. mean = group sum / cols (layer_norm only);
//   3. var = group sum of (x - mean)^2 over the valid vectors / cols; rstd = rsqrt(var + eps);
//   4. y = (x - mean) * rstd * scale + bias from the registers, 16-byte streaming stores.
// x is read once (streaming loads) and y written once.
// The block the kernel is compiled for (its __launch_bounds__): from the registers of row
// data a thread holds (V vectors, twice with prefetch).
template <int kVecs, bool kPrefetch>
constexpr int forward_max_block() {
  return norm::max_block_for(kVecs * (kPrefetch ? 2 : 1) * kVecBytes / 4);
}

template <class T, bool kCentre, int kVecs, bool kPrefetch, class P, class Y>
__global__ void __launch_bounds__(forward_max_block<kVecs, kPrefetch>())
    norm_forward_rows(ForwardArgs<T, float, P, Y> a) {
  using norm::Packed;
  constexpr int W = kVecWidth<T>;
  __shared__ norm::SumSlots<1> slots;
  const int R = a.threads_per_row;
  const int groups = blockDim.x / R;
  const int group = threadIdx.x / R, t = threadIdx.x % R;
  const int nvec = int(a.cols / W);
  const int64_t stride = int64_t(gridDim.x) * groups;
  // The row stays in registers in its own type, packed (half the registers of f32 for
  // 2-byte types, so more rows are in flight per SM); each pass converts on the fly.
  Packed v[kVecs] = {}, next[kVecs] = {};
  auto load_row = [&](Packed(&dst)[kVecs], int64_t row) {
    if (row >= a.rows) return;
    const T* xr = a.x + row * a.cols;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = k * R + t;
      if (i < nvec) dst[k] = norm::load_packed_stream(xr, i);
    }
  };
  int parity = 0;
  int64_t row = int64_t(blockIdx.x) * groups + group;
  if constexpr (kPrefetch) load_row(v, row);
  // The loop runs alike for every thread of the block (base is uniform), so shuffles and
  // barriers see every thread; rows past the end are computed on but never stored.
  for (int64_t base = int64_t(blockIdx.x) * groups; base < a.rows; base += stride, row += stride) {
    if constexpr (kPrefetch) {
      load_row(next, row + stride);
    } else {
      load_row(v, row);
    }
    const bool active = row < a.rows;
    bool valid[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) valid[k] = active && k * R + t < nvec;

    norm::normalize_row<T, kCentre, kVecs>(a, v, valid, row, active, R, t, slots, parity);
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) v[k] = next[k];
    }
  }
}

// Long-row path: a block per row (grid-stride over rows), three passes over the row:
// the sum (layer_norm), the squared deviations, then y. C is f32 (f64 for f64).
template <class T, bool kCentre, class P, class Y>
__global__ void norm_forward_long(ForwardArgs<T, stats_t<T>, P, Y> a) {
  using C = compute_t<T>;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* xr = a.x + row * a.cols;
    C mean = 0;
    if constexpr (kCentre) {
      C s = 0;
      for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) s += load_compute(xr, j);
      mean = block_reduce(s, SumOp{}, C(0)) / C(a.cols);
    }
    C sq = 0;
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      const C d = load_compute(xr, j) - mean;
      sq += d * d;
    }
    const C rstd = C(1) / sqrt(block_reduce(sq, SumOp{}, C(0)) / C(a.cols) + C(a.eps));
    if (threadIdx.x == 0) {
      if (a.mean) a.mean[row] = mean;
      if (a.rstd) a.rstd[row] = rstd;
    }
    Y* yr = a.y + row * a.cols;
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      C r = (load_compute(xr, j) - mean) * rstd;
      if (a.scale) r *= load_compute(a.scale, j);
      if (a.bias) r += load_compute(a.bias, j);
      store_compute(yr, j, r);
    }
  }
}

template <class T, bool kCentre, int kVecs, bool kPrefetch, class P, class Y>
ForwardKernel<T, P, Y> bound_forward_rows() {
  return {&norm_forward_rows<T, kCentre, kVecs, kPrefetch, P, Y>,
          forward_max_block<kVecs, kPrefetch>()};
}

template <class T, bool kCentre, bool kPrefetch, class P, class Y>
ForwardKernel<T, P, Y> forward_rows_kernel(int vecs) {
  switch (vecs) {
    case 1:
      return bound_forward_rows<T, kCentre, 1, kPrefetch, P, Y>();
    case 2:
      return bound_forward_rows<T, kCentre, 2, kPrefetch, P, Y>();
    case 4:
      return bound_forward_rows<T, kCentre, 4, kPrefetch, P, Y>();
    default:  // 8 vectors and their prefetch would spill
      if constexpr (kPrefetch) return {};
      return bound_forward_rows<T, kCentre, 8, false, P, Y>();
  }
}

// The register path's layout for rows of `cols` elements, or plan.fast == false. Tries,
// in order: prefetching layouts (when the variant allows) from the variant's vectors per
// thread up, then the same without prefetch; the first that fits kMaxRowThreads threads
// per row and launches (norm::launchable: block within the kernel's bounds, registers,
// shared memory) wins. The mixed form (P or Y not T) has no staged path.
template <class T, bool kCentre, class P = T, class Y = T>
norm::RowPlan plan_forward(int64_t rows, int64_t cols, bool aligned, const DeviceProperties& props,
                           ForwardKernel<T, P, Y>* kernel) {
  constexpr int W = kVecWidth<T>;
  norm::RowPlan plan;
  if (!aligned || cols % W != 0) return plan;
  const norm::Variant& variant = norm::norm_variant();
  const norm::StagedUse staged = variant.forward_staged;
  if constexpr (std::is_same_v<P, T> && std::is_same_v<Y, T>) {
    if (staged == norm::StagedUse::always ||
        (staged == norm::StagedUse::for_long_rows && cols / W >= norm::kStagedForwardMinVecs)) {
      plan = norm::plan_forward_staged<T, kCentre>(rows, cols, props, kernel);
      if (plan.fast) return plan;
    }
  }
  for (bool prefetch : {true, false}) {
    if (prefetch && !variant.forward_prefetch) continue;
    for (int preferred = variant.forward_vecs; preferred <= norm::kMaxVecs; preferred *= 2) {
      int vecs = preferred, threads = 0;
      norm::fit_row(cols / W, vecs, threads);
      if (threads == 0) continue;
      const ForwardKernel<T, P, Y> k = prefetch
                                           ? forward_rows_kernel<T, kCentre, true, P, Y>(vecs)
                                           : forward_rows_kernel<T, kCentre, false, P, Y>(vecs);
      if (!k) continue;
      const int block = threads <= 32 ? norm::kSmallGroupBlock : threads;  // R > 32: one group
      const int groups = block / threads;
      const unsigned grid = norm::persistent_grid(k, block, 0, props, (rows + groups - 1) / groups);
      if (grid == 0) continue;
      plan.fast = true;
      plan.vecs = vecs;
      plan.threads_per_row = threads;
      plan.block = block;
      plan.prefetch = prefetch;
      plan.grid = grid;
      *kernel = k;
      return plan;
    }
  }
  return plan;
}

template <class T, bool kCentre, class P, class Y>
void launch_forward(Context& ctx, const ForwardArgs<T, stats_t<T>, P, Y>& args,
                    const BufferList& reads, const BufferList& writes) {
  const DeviceProperties& props = ctx.device.properties();
  if constexpr (!std::is_same_v<T, double>) {
    const bool aligned = norm::aligned16(args.x) && norm::aligned16(args.y) &&
                         norm::aligned16(args.scale) && norm::aligned16(args.bias);
    ForwardKernel<T, P, Y> kernel;
    const RowPlan plan =
        plan_forward<T, kCentre, P, Y>(args.rows, args.cols, aligned, props, &kernel);
    if (plan.fast) {
      ForwardArgs<T, float, P, Y> a = args;
      a.threads_per_row = plan.threads_per_row;
      ctx.encoder.launch(kernel.fn, dim3(plan.grid), dim3(plan.block), plan.shared_bytes, reads,
                         writes, a);
      return;
    }
  }
  // The long-row kernel has no launch bounds and few registers: it always launches.
  const norm::BoundKernel<void (*)(ForwardArgs<T, stats_t<T>, P, Y>)> long_row{
      &norm_forward_long<T, kCentre, P, Y>, norm::kUnbounded};
  const unsigned grid = norm::persistent_grid(long_row, norm::kLongRowBlock, 0, props, args.rows);
  FUSEBOX_CHECK(grid > 0, "layer_norm / rms_norm", "the long-row kernel does not launch");
  ctx.encoder.launch(long_row.fn, dim3(grid), dim3(norm::kLongRowBlock), 0, reads, writes, args);
}

// Calls f(T{}, P{}, Y{}) with the device types of x, the parameters and y: all x's type, or
// the mixed form (ForwardArgs), whose parameters are f32. A combination the kernels are not
// built for is an Error naming the node (inference refuses it first: ir/ops.h NormAttrs).
template <class F>
void visit_norm_types(const std::string& where, DType x, DType params, DType y, F&& f) {
  if (params == x && y == x) {
    visit_device_float(where, x, [&](auto t) { f(t, t, t); });
    return;
  }
  const bool low_x = x == DType::f16 || x == DType::bf16,
             low_y = y == DType::f16 || y == DType::bf16;
  FUSEBOX_CHECK(params == DType::f32 &&
                    (x == y ? low_x : (x == DType::f32 && low_y) || (low_x && y == DType::f32)),
                where, "no kernel for x ", dtype_name(x), ", scale/bias ", dtype_name(params),
                ", y ", dtype_name(y),
                " (mixed forms: f32 scale and bias, x and y of one dtype or one of them f32)");
  visit_device_float(where, x, [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, double>) {
      visit_device_float(where, y, [&](auto u) {
        using Y = decltype(u);
        // Only the mixed forms are instantiated (each is 14 register-path kernels).
        constexpr bool half_t = is_half_v<T>, half_y = is_half_v<Y>;
        constexpr bool f32_t = std::is_same_v<T, float>, f32_y = std::is_same_v<Y, float>;
        if constexpr ((half_t && std::is_same_v<T, Y>) || (f32_t && half_y) || (half_t && f32_y))
          f(t, float{}, u);
      });
    }
  });
}

// The forward of layer_norm (centre) and rms_norm. Inputs x, scale?, bias? (layer_norm
// only); outputs y and the statistics (each may be absent). y is x's dtype, or NormAttrs's
// y_dtype (the mixed form).
void norm_forward(Context& ctx, const Node& n, Inputs in, Outputs out, bool centre) {
  const std::string where = node_label(n);
  const DeviceTensor& x = *in[0];
  const NormAttrs& attrs = std::get<NormAttrs>(n.attrs);
  const norm::RowsView view = norm::rows_view(where, x.shape, attrs.axis);
  const DType y_dtype = attrs.y_dtype.value_or(x.dtype);
  FUSEBOX_CHECK(!out.empty() && out[0].dtype == y_dtype && out[0].shape == x.shape, where,
                "output y must be ", dtype_name(y_dtype), " ", shape_str(x.shape));
  const DeviceTensor* mean = centre && out.size() > 1 ? &out[1] : nullptr;
  const DeviceTensor* rstd = out.size() > (centre ? 2u : 1u) ? &out[centre ? 2 : 1] : nullptr;
  const DType stats = x.dtype == DType::f64 ? DType::f64 : DType::f32;
  for (const DeviceTensor* s : {mean, rstd}) {
    FUSEBOX_CHECK(!s || (s->dtype == stats && s->numel() == view.rows), where,
                  "statistics outputs must be ", dtype_name(stats), " with ", view.rows,
                  " elements");
  }
  DeviceTensor scale_storage, bias_storage;
  const DeviceTensor* scale =
      norm::expand_param(ctx, where, in.size() > 1 ? in[1] : nullptr, view, scale_storage);
  const DeviceTensor* bias =
      norm::expand_param(ctx, where, centre && in.size() > 2 ? in[2] : nullptr, view, bias_storage);
  const DType params = scale                ? scale->dtype
                       : bias               ? bias->dtype
                       : x.dtype == y_dtype ? x.dtype
                                            : DType::f32;
  FUSEBOX_CHECK(!scale || !bias || scale->dtype == bias->dtype, where,
                "scale and bias must have one dtype");
  if (view.rows == 0) return;

  const BufferList reads = norm::ranges({&x, scale, bias});
  const BufferList writes = norm::ranges({&out[0], mean, rstd});
  visit_norm_types(where, x.dtype, params, y_dtype, [&](auto t, auto p, auto y) {
    using T = decltype(t);
    using P = decltype(p);
    using Y = decltype(y);
    using S = stats_t<T>;
    ForwardArgs<T, S, P, Y> args{x.as<const T>(),
                                 scale ? scale->as<const P>() : nullptr,
                                 bias ? bias->as<const P>() : nullptr,
                                 out[0].as<Y>(),
                                 mean ? mean->as<S>() : nullptr,
                                 rstd ? rstd->as<S>() : nullptr,
                                 view.rows,
                                 view.cols,
                                 S(attrs.epsilon),
                                 0};
    if (centre)
      launch_forward<T, true>(ctx, args, reads, writes);
    else
      launch_forward<T, false>(ctx, args, reads, writes);
  });
}

}  // namespace

void layer_norm(Context& ctx, const Node& n, Inputs in, Outputs out) {
  norm_forward(ctx, n, in, out, true);
}

void rms_norm(Context& ctx, const Node& n, Inputs in, Outputs out) {
  norm_forward(ctx, n, in, out, false);
}

namespace norm {

std::string forward_layout(Context& ctx, DType dtype, int64_t rows, int64_t cols, bool centre) {
  std::string text = "long-row";
  if (dtype == DType::f64) return text;
  const DeviceProperties& props = ctx.device.properties();
  visit_device_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || is_half_v<T>) {
      ForwardKernel<T> kernel;
      text = layout_text(centre ? plan_forward<T, true>(rows, cols, true, props, &kernel)
                                : plan_forward<T, false>(rows, cols, true, props, &kernel),
                         false);
    }
  });
  return text;
}

}  // namespace norm

}  // namespace fusebox::cuda
