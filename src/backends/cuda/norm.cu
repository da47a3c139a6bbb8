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
// Register path (f32, f16, bf16 rows of up to 16,384 elements; norm_rows.cuh): a row
// group loads its row once with 16-byte loads into registers (at most 32 values per
// thread), reduces the sum for the mean, then the squared deviations, and writes y from
// the same registers: x is read once and y written once, so the kernel should run at the
// device's copy bandwidth (about 2.8-2.9 TB/s of the H100's 3.0 TB/s copy for rows of
// 1K-16K elements; the statistics add 8 bytes per row).
//
// Long-row path (longer rows, unaligned data, cols not a multiple of the vector width,
// f64): a block per row, three passes over the row (sum, squared deviations, y) with
// scalar accesses; the second and third reads mostly hit L2. Correct, about a third of
// the register path's speed.
#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_common.h"
#include "backends/cuda/norm_rows.cuh"

namespace fusebox::cuda {

namespace {

using norm::RowPlan;
using norm::stats_t;

template <class T, class S>
struct ForwardArgs {
  const T* x;
  const T* scale;  // [cols] or null
  const T* bias;   // [cols] or null
  T* y;
  S* mean;  // [rows] or null
  S* rstd;  // [rows] or null
  int64_t rows;
  int64_t cols;
  S eps;
  int threads_per_row;  // register path only
};

// Register path: see norm_rows.cuh for the layout (row groups of R threads, V vectors
// of W elements per thread, persistent grid over rows).
//   1. load the row's vectors (V per thread) into registers;
//   2. mean = group sum / cols (layer_norm only);
//   3. var = group sum of (x - mean)^2 over the valid vectors / cols; rstd = rsqrt(var + eps);
//   4. y = (x - mean) * rstd * scale + bias from the registers, 16-byte stores.
template <class T, bool kCentre, int kVecs>
__global__ void __launch_bounds__(norm::kMaxRowThreads, norm::min_blocks_per_sm(kVecs* kVecBytes))
    norm_forward_rows(ForwardArgs<T, float> a) {
  using norm::Packed;
  using norm::unpack;
  constexpr int W = kVecWidth<T>;
  __shared__ float slots[32];
  const int R = a.threads_per_row;
  const int groups = blockDim.x / R;
  const int group = threadIdx.x / R, t = threadIdx.x % R;
  const int64_t nvec = a.cols / W;
  const float inv_cols = 1.0f / float(a.cols);
  for (int64_t base = int64_t(blockIdx.x) * groups; base < a.rows;
       base += int64_t(gridDim.x) * groups) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    const T* xr = a.x + row * a.cols;
    // The row stays in registers in its own type, packed (half the registers of f32 for
    // 2-byte types, so more rows are in flight per SM); each pass converts on the fly.
    bool valid[kVecs];
    Packed v[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t i = int64_t(k) * R + t;
      valid[k] = active && i < nvec;
      if (valid[k]) v[k] = norm::load_packed(xr, i);
    }

    float mean = 0.0f;
    if constexpr (kCentre) {
      float s[1] = {0.0f};
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (!valid[k]) continue;
#pragma unroll
        for (int w = 0; w < W; ++w) s[0] += unpack<T>(v[k], w);
      }
      norm::group_sum(s, slots, R);
      mean = s[0] * inv_cols;
    }
    float sq[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!valid[k]) continue;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float d = unpack<T>(v[k], w) - mean;
        sq[0] += d * d;
      }
    }
    norm::group_sum(sq, slots, R);
    const float rstd = rsqrtf(sq[0] * inv_cols + a.eps);
    if (!active) continue;  // no barrier follows in this iteration
    if (t == 0) {
      if (a.mean) a.mean[row] = mean;
      if (a.rstd) a.rstd[row] = rstd;
    }

    T* yr = a.y + row * a.cols;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!valid[k]) continue;
      const int64_t i = int64_t(k) * R + t;
      Packed scale{}, bias{};
      if (a.scale) scale = norm::load_packed(a.scale, i);
      if (a.bias) bias = norm::load_packed(a.bias, i);
      float out[W];
#pragma unroll
      for (int w = 0; w < W; ++w) {
        float r = (unpack<T>(v[k], w) - mean) * rstd;
        if (a.scale) r *= unpack<T>(scale, w);
        if (a.bias) r += unpack<T>(bias, w);
        out[w] = r;
      }
      norm::store_packed(yr, i, norm::pack<T>(out));
    }
  }
}

// Long-row path: a block per row (grid-stride over rows), three passes over the row:
// the sum (layer_norm), the squared deviations, then y. C is f32 (f64 for f64).
template <class T, bool kCentre>
__global__ void norm_forward_long(ForwardArgs<T, stats_t<T>> a) {
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
    T* yr = a.y + row * a.cols;
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      C r = (load_compute(xr, j) - mean) * rstd;
      if (a.scale) r *= load_compute(a.scale, j);
      if (a.bias) r += load_compute(a.bias, j);
      store_compute(yr, j, r);
    }
  }
}

template <class T, bool kCentre>
auto forward_rows_kernel(int vecs) {
  constexpr int W = kVecWidth<T>;
  switch (vecs) {
    case 1:
      return &norm_forward_rows<T, kCentre, 1>;
    case 2:
      return &norm_forward_rows<T, kCentre, 2>;
    case 4:
      return &norm_forward_rows<T, kCentre, 4>;
    default:
      if constexpr (8 * W <= norm::kMaxForwardElems) return &norm_forward_rows<T, kCentre, 8>;
      return &norm_forward_rows<T, kCentre, 4>;  // unreachable: plan_rows caps vecs
  }
}

template <class T, bool kCentre>
void launch_forward(Context& ctx, const ForwardArgs<T, stats_t<T>>& args, const BufferList& reads,
                    const BufferList& writes) {
  const int sms = ctx.device.properties().sm_count;
  if constexpr (!std::is_same_v<T, double>) {
    const bool aligned = norm::aligned16(args.x) && norm::aligned16(args.y) &&
                         norm::aligned16(args.scale) && norm::aligned16(args.bias);
    const RowPlan plan = norm::plan_rows(args.cols, kVecWidth<T>, norm::kPreferredElems,
                                         norm::kMaxForwardElems, aligned);
    if (plan.fast) {
      ForwardArgs<T, float> a = args;
      a.threads_per_row = plan.threads_per_row;
      auto kernel = forward_rows_kernel<T, kCentre>(plan.vecs);
      const int64_t row_blocks = (args.rows + plan.groups() - 1) / plan.groups();
      const unsigned grid = norm::persistent_grid(kernel, plan.block, 0, sms, row_blocks);
      ctx.encoder.launch(kernel, dim3(grid), dim3(plan.block), 0, reads, writes, a);
      return;
    }
  }
  const unsigned grid =
      norm::persistent_grid(&norm_forward_long<T, kCentre>, norm::kLongRowBlock, 0, sms, args.rows);
  ctx.encoder.launch(&norm_forward_long<T, kCentre>, dim3(grid), dim3(norm::kLongRowBlock), 0,
                     reads, writes, args);
}

// The forward of layer_norm (centre) and rms_norm. Inputs x, scale?, bias? (layer_norm
// only); outputs y and the statistics (each may be absent).
void norm_forward(Context& ctx, const Node& n, Inputs in, Outputs out, bool centre) {
  const std::string where = node_label(n);
  const DeviceTensor& x = *in[0];
  const norm::RowsView view = norm::rows_view(where, x.shape, std::get<NormAttrs>(n.attrs).axis);
  FUSEBOX_CHECK(!out.empty() && out[0].dtype == x.dtype && out[0].shape == x.shape, where,
                "output y must be ", dtype_name(x.dtype), " ", shape_str(x.shape));
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
  for (const DeviceTensor* p : {scale, bias}) {
    FUSEBOX_CHECK(!p || p->dtype == x.dtype, where, "scale and bias must be ", dtype_name(x.dtype));
  }
  if (view.rows == 0) return;

  const BufferList reads = norm::ranges({&x, scale, bias});
  const BufferList writes = norm::ranges({&out[0], mean, rstd});
  visit_device_float(n, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    using S = stats_t<T>;
    ForwardArgs<T, S> args{x.as<const T>(),
                           scale ? scale->as<const T>() : nullptr,
                           bias ? bias->as<const T>() : nullptr,
                           out[0].as<T>(),
                           mean ? mean->as<S>() : nullptr,
                           rstd ? rstd->as<S>() : nullptr,
                           view.rows,
                           view.cols,
                           S(std::get<NormAttrs>(n.attrs).epsilon),
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

}  // namespace fusebox::cuda
