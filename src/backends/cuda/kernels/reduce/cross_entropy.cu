// cross_entropy on the GPU (ops.h semantics, the CPU backend's formulas).
//
// logits [N, C, D...] are viewed as [outer = N, len = C, inner = D...]; row p = (n, d) is
// also the label's flat position. Pass 1, per row (a warp, a block reading the row once
// (the online softmax) or a thread: kernels/reduce/softmax_rows.cuh; or, for D > 1 and a long
// class axis, a block per 32
// adjacent rows: a decoder's [batch, vocab, tokens] logits have too few rows for a thread
// each, GPT-2's 16 x 1024 rows of 50,257 took 28.9 ms that way on an H200), with m and lse
// of the row:
//   log_prob[n, :, d] = x - m - lse                               (second output)
//   label l = labels[p]: ignore_index -> weight 0, loss 0
//                        outside [0, C) -> raises the node's ErrorRecord with (p, l):
//                        the run fails at check_error_flags with "label l at position
//                        [n, d...] is outside [0, C)", as the CPU's message
//                        else weight w = weight[l] (1 without weights),
//                             loss = -w * (x[n, l, d] - m - lse)
//   reduction none: loss[p] is the output; sum/mean: loss[p] and w go to f64 temporaries.
// The lse_stash form (ops.h) writes lse[p] = m + lse instead of log_prob and reads only the
// first `classes` entries of each row (the rest padding); its loss, lse and weight are S =
// compute_t<T> (f32 for f16/bf16 logits), the plain form's T.
// Pass 2 (sum/mean): a deterministic two-level sum in f64: up to kSumBlocks blocks each
// sum a contiguous range of rows into (loss, weight) partials, then one block adds the
// partials in order and writes sum, or sum / total weight for the mean (all ignored:
// 0 / 0 = NaN, as PyTorch).
//
// cross_entropy_backward (dloss, log_prob, labels, weight?) -> dlogits, in f64 as the CPU:
// per position p with label l and weight w (weight[l], 1 without weights, 0 when ignored),
//   k = w * dloss[p] (none), w * dloss (sum), w * dloss / total weight (mean; 0 where
//   w == 0, so all zeros when every label is ignored, as PyTorch)
//   dlogits[n, j, d] = k * (exp(log_prob[n, j, d]) - [j == l]), 0 where k == 0.
// One thread per element of dlogits (each finds its position and label), or, for D > 1 and
// a long class axis, a block per 32 adjacent positions (lanes) whose warps split the class
// axis (the label and k found once per thread); the mean's total weight comes first from a
// two-level f64 sum over the positions (as the forward's).
// The lse_stash form's backward (dloss, lse, labels, weight?, logits) computes in compute_t<T>:
//   dlogits[n, j, d] = k * (exp(logits[n, j, d] - lse[p]) - [j == l]), 0 for j >= classes,
// a block per row for the last axis (k found once per row; 16-byte accesses where the row is
// aligned), else a thread per element.
// Bad labels raise the node's ErrorRecord as the forward's.
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/reduce/softmax_rows.cuh"
#include "backends/cuda/runtime/error_flags.h"

namespace fusebox::cuda {

namespace {

constexpr int kRowsPerWarpBlock = 8;
constexpr int kBlockRowThreads = 512;
constexpr int kSumThreads = 512;
constexpr int kSumBlocks = 264;
// The column walk (above): 16 warps split the class axis of 32 adjacent rows.
constexpr int kColumnThreads = 512;

// Whether the column walk runs rows of `len` elements `inner` apart.
bool column_walk(int64_t len, int64_t inner) {
  return inner > 1 && len >= 256;
}

// Blocks for the column walk: one per tile of 32 adjacent columns, grid-strided.
unsigned column_blocks(int64_t outer, int64_t inner) {
  return unsigned(std::min(outer * ((inner + 31) / 32), kMaxGridStrideBlocks));
}

struct LossArgs {
  int64_t outer, len, inner;  // len: dim 1's extent
  int64_t classes;            // its counted entries: len, or fewer (the lse_stash form's padding)
  bool has_ignore;
  int64_t ignore_index;
  ErrorRecord* error;
  int32_t* halt;  // set with the error (error_flags.h): the step's updates do nothing
};

// The loss of row p (given its statistics) and its weight; every thread of the walk may
// call it, `leader` is the one that stores.
template <class C, class T, class S, class L, class Out>
__device__ __forceinline__ void row_loss(const T* row, int64_t stride, RowStats<C> s,
                                         const L* labels, const S* weight, Out* loss, S* lse,
                                         double* label_weight, int64_t p, const LossArgs& a,
                                         bool leader) {
  if (!leader) return;
  if (lse) lse[p] = convert<S>(s.max + s.lse);
  const int64_t l = int64_t(labels[p]);
  C w = C(0), value = C(0);
  if (a.has_ignore && l == a.ignore_index) {
    // ignored: weight 0, loss 0
  } else if (l < 0 || l >= a.classes) {
    raise_error(a.error, p, l);
    raise_halt(a.halt);
  } else {
    w = weight ? convert<C>(weight[l]) : C(1);
    if (w != C(0)) value = -w * (convert<C>(row[l * stride]) - s.max - s.lse);
  }
  loss[p] = convert<Out>(value);
  if (label_weight) label_weight[p] = double(w);
}

// Out is S (reduction none: loss is the output) or double (a temporary: f64 keeps an f64
// loss exact before the sum). log_prob (the plain form) or lse (lse_stash) is null.
template <RowWalk kWalk, class T, class S, class L, class Out>
__global__ void cross_entropy_rows(const T* x, const L* labels, const S* weight, T* log_prob,
                                   S* lse, Out* loss, double* label_weight, LossArgs a) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  auto write = [&](const T* row, T* out_row, int64_t stride, RowStats<C> s, int first, int step) {
    if (!log_prob) return;
    for (int64_t j = first; j < a.len; j += step)
      out_row[j * stride] = convert<T>(convert<C>(row[j * stride]) - s.max - s.lse);
  };
  if constexpr (kWalk == RowWalk::warp) {
    const int lane = threadIdx.x % 32;
    for (int64_t r = int64_t(blockIdx.x) * kRowsPerWarpBlock + threadIdx.x / 32; r < a.outer;
         r += int64_t(gridDim.x) * kRowsPerWarpBlock) {
      const RowStats<C> s = warp_row_stats<C>(x + r * a.len, a.classes, 1);
      write(x + r * a.len, log_prob + r * a.len, 1, s, lane, 32);
      row_loss(x + r * a.len, 1, s, labels, weight, loss, lse, label_weight, r, a, lane == 0);
    }
  } else if constexpr (kWalk == RowWalk::block) {
    for (int64_t r = blockIdx.x; r < a.outer; r += gridDim.x) {
      const RowStats<C> s = block_row_stats_online<C>(x + r * a.len, a.classes);
      write(x + r * a.len, log_prob + r * a.len, 1, s, threadIdx.x, blockDim.x);
      row_loss(x + r * a.len, 1, s, labels, weight, loss, lse, label_weight, r, a,
               threadIdx.x == 0);
    }
  } else {
    for (int64_t t = global_thread_index(); t < a.outer * a.inner; t += grid_stride()) {
      const int64_t base = (t / a.inner) * a.len * a.inner + t % a.inner;
      const RowStats<C> s = thread_row_stats<C>(x + base, a.classes, a.inner);
      write(x + base, log_prob + base, a.inner, s, 0, 1);
      row_loss(x + base, a.inner, s, labels, weight, loss, lse, label_weight, t, a, true);
    }
  }
}

// The column walk: block tiles of 32 adjacent rows (lanes), the warps splitting each row.
template <class T, class S, class L, class Out>
__global__ void cross_entropy_columns(const T* x, const L* labels, const S* weight, T* log_prob,
                                      S* lse, Out* loss, double* label_weight, LossArgs a) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  __shared__ C scratch[kColumnThreads + 64];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t tiles = (a.inner + 31) / 32;
  for (int64_t tile = blockIdx.x; tile < a.outer * tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles, i = tile % tiles * 32 + lane;
    const bool valid = i < a.inner;
    const int64_t base = o * a.len * a.inner + (valid ? i : 0);
    const RowStats<C> s = column_tile_stats<C>(x + base, a.classes, a.inner, valid, scratch);
    if (!valid) continue;
    if (log_prob)
      for (int64_t j = warp; j < a.len; j += warps)
        log_prob[base + j * a.inner] =
            convert<T>(convert<C>(x[base + j * a.inner]) - s.max - s.lse);
    row_loss(x + base, a.inner, s, labels, weight, loss, lse, label_weight, o * a.inner + i, a,
             warp == 0);
  }
}

// Block b sums rows [b * per_block, (b + 1) * per_block) of loss and weight (f64, a fixed
// order) into partials[2b], partials[2b + 1].
__global__ void sum_loss_partials(const double* loss, const double* weight, int64_t rows,
                                  int64_t per_block, double* partials) {
  const int64_t begin = int64_t(blockIdx.x) * per_block;
  const int64_t end = begin + per_block < rows ? begin + per_block : rows;
  double l = 0.0, w = 0.0;
  for (int64_t p = begin + threadIdx.x; p < end; p += blockDim.x) {
    l += double(loss[p]);
    w += double(weight[p]);
  }
  l = block_reduce(l, SumOp{}, 0.0);
  w = block_reduce(w, SumOp{}, 0.0);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = l;
    partials[2 * blockIdx.x + 1] = w;
  }
}

// One block: adds the partials in order and writes the loss.
template <class T>
__global__ void finish_loss(const double* partials, int blocks, bool mean, T* y) {
  double l = 0.0, w = 0.0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    l += partials[2 * b];
    w += partials[2 * b + 1];
  }
  l = block_reduce(l, SumOp{}, 0.0);
  w = block_reduce(w, SumOp{}, 0.0);
  if (threadIdx.x == 0) y[0] = convert<T>(mean ? l / w : l);
}

template <class T>
__global__ void fill_scalar(T* y, double value) {
  y[0] = convert<T>(value);
}

// The node's ErrorRecord for labels outside [0, classes), with the forward's message.
ErrorSlot reserve_label_error(Context& ctx, const Node& n, const Shape& label_shape,
                              int64_t classes) {
  return ErrorFlags::of(ctx.encoder)
      .reserve(node_label(n), [label_shape, classes](int64_t p, int64_t l) {
        return cat("label ", l, " at position ", position_str(p, label_shape), " is outside [0, ",
                   classes, ")");
      });
}

// `stash`: log_prob (T), or the lse_stash form's lse (S).
template <class T, class S, class L>
void run_cross_entropy(Context& ctx, const Node& n, const DeviceTensor& logits,
                       const DeviceTensor& labels, const DeviceTensor* weight,
                       const DeviceTensor& loss, const DeviceTensor& stash, LossArgs a) {
  const CrossEntropyAttrs& attrs = std::get<CrossEntropyAttrs>(n.attrs);
  const int64_t rows = a.outer * a.inner;
  T* log_prob = attrs.lse_stash ? nullptr : stash.as<T>();
  S* lse = attrs.lse_stash ? stash.as<S>() : nullptr;
  const ErrorSlot slot = reserve_label_error(ctx, n, labels.shape, a.classes);
  a.error = slot.record;
  const ErrorFlags& flags = ErrorFlags::of(ctx.encoder);
  a.halt = flags.halt_word();

  BufferList reads{logits.range(), labels.range()};
  if (weight) reads.push_back(weight->range());
  const S* pw = weight ? weight->as<S>() : nullptr;
  const RowWalk walk = pick_row_walk(a.classes, a.inner);
  dim3 grid, block;
  switch (walk) {
    case RowWalk::warp:
      grid = unsigned(
          std::min((a.outer + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock, kMaxGridStrideBlocks));
      block = kRowsPerWarpBlock * 32;
      break;
    case RowWalk::block:
      grid = unsigned(std::min(a.outer, kMaxGridStrideBlocks));
      block = kBlockRowThreads;
      break;
    case RowWalk::thread:
      grid = launch_blocks(rows);
      block = kDefaultThreads;
      break;
  }
  auto launch_rows = [&](auto* loss_out, double* label_weight, BufferList writes) {
    using Out = std::remove_pointer_t<decltype(loss_out)>;
    writes.push_back(stash.range());
    writes.push_back(slot.range);
    if (flags.halt()) writes.push_back(*flags.halt());
    if (column_walk(a.classes, a.inner)) {
      ctx.encoder.launch(cross_entropy_columns<T, S, L, Out>, column_blocks(a.outer, a.inner),
                         unsigned(kColumnThreads), 0, reads, writes, logits.as<T>(), labels.as<L>(),
                         pw, log_prob, lse, loss_out, label_weight, a);
      return;
    }
    auto kernel = walk == RowWalk::warp    ? cross_entropy_rows<RowWalk::warp, T, S, L, Out>
                  : walk == RowWalk::block ? cross_entropy_rows<RowWalk::block, T, S, L, Out>
                                           : cross_entropy_rows<RowWalk::thread, T, S, L, Out>;
    ctx.encoder.launch(kernel, grid, block, 0, reads, writes, logits.as<T>(), labels.as<L>(), pw,
                       log_prob, lse, loss_out, label_weight, a);
  };

  if (attrs.reduction == Reduction::none) {
    launch_rows(loss.as<S>(), static_cast<double*>(nullptr), BufferList{loss.range()});
    return;
  }
  DeviceBuffer row_loss = ctx.allocator.allocate(size_t(rows) * sizeof(double));
  DeviceBuffer row_weight = ctx.allocator.allocate(size_t(rows) * sizeof(double));
  const int64_t per_block = std::max<int64_t>(kSumThreads, (rows + kSumBlocks - 1) / kSumBlocks);
  const int blocks = int(std::max<int64_t>(1, (rows + per_block - 1) / per_block));
  DeviceBuffer partials = ctx.allocator.allocate(size_t(blocks) * 2 * sizeof(double));
  ctx.encoder.add_temporary(row_loss);
  ctx.encoder.add_temporary(row_weight);
  ctx.encoder.add_temporary(partials);
  launch_rows(row_loss.as<double>(), row_weight.as<double>(), BufferList{row_loss, row_weight});
  ctx.encoder.launch(sum_loss_partials, unsigned(blocks), kSumThreads, 0,
                     BufferList{row_loss, row_weight}, BufferList{partials}, row_loss.as<double>(),
                     row_weight.as<double>(), rows, per_block, partials.as<double>());
  ctx.encoder.launch(finish_loss<S>, 1u, kSumThreads, 0, BufferList{partials},
                     BufferList{loss.range()}, partials.as<double>(), blocks,
                     attrs.reduction == Reduction::mean, loss.as<S>());
}

// ---- backward ----------------------------------------------------------------------------

struct GradArgs {
  int64_t len, inner, total;  // len: dim 1's extent; total = N * len * inner
  int64_t classes;            // dim 1's counted entries (len, or fewer: lse_stash's padding)
  Reduction reduction;
  bool has_ignore;
  int64_t ignore_index;
  ErrorRecord* error;
};

// Position p's weight: 0 when ignored (or a bad label, which raises), else weight[l] or 1.
template <class S, class L>
__device__ __forceinline__ double label_weight(const L* labels, const S* weight, int64_t p,
                                               const GradArgs& a, int64_t* label) {
  const int64_t l = int64_t(labels[p]);
  *label = l;
  if (a.has_ignore && l == a.ignore_index) return 0.0;
  if (l < 0 || l >= a.classes) {
    raise_error(a.error, p, l);
    return 0.0;
  }
  return weight ? double(convert<compute_t<S>>(weight[l])) : 1.0;
}

// The mean's denominator, stage 1: block b sums the weights of positions
// [b * per_block, (b + 1) * per_block) into partials[b] (f64, a fixed order).
template <class S, class L>
__global__ void weight_partials(const L* labels, const S* weight, int64_t positions,
                                int64_t per_block, GradArgs a, double* partials) {
  const int64_t begin = int64_t(blockIdx.x) * per_block;
  const int64_t end = begin + per_block < positions ? begin + per_block : positions;
  double w = 0.0;
  int64_t label;
  for (int64_t p = begin + threadIdx.x; p < end; p += blockDim.x)
    w += label_weight(labels, weight, p, a, &label);
  w = block_reduce(w, SumOp{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = w;
}

// Stage 2: one block adds the partials in order.
__global__ void weight_total(const double* partials, int blocks, double* total) {
  double w = 0.0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) w += partials[b];
  w = block_reduce(w, SumOp{}, 0.0);
  if (threadIdx.x == 0) total[0] = w;
}

// Position p's k (see the top of the file) and its label; total_weight is read for the mean
// only. dloss and weight are S.
template <class S, class L>
__device__ __forceinline__ double grad_scale(const S* dloss, const L* labels, const S* weight,
                                             const double* total_weight, int64_t p,
                                             const GradArgs& a, int64_t* label) {
  using C = compute_t<S>;
  const double w = label_weight(labels, weight, p, a, label);
  switch (a.reduction) {
    case Reduction::none:
      return w * double(convert<C>(dloss[p]));
    case Reduction::sum:
      return w * double(convert<C>(dloss[0]));
    case Reduction::mean:
      return w == 0.0 ? 0.0 : w * double(convert<C>(dloss[0])) / total_weight[0];
  }
  return 0.0;
}

// dlogits[idx] of class j at position p (k, l: p's).
template <class T>
__device__ __forceinline__ T grad_element(const T* log_prob, int64_t idx, int64_t j, double k,
                                          int64_t l) {
  // An ignored position (k = 0) gives 0 even where its log_prob is not finite.
  const double onehot = j == l ? 1.0 : 0.0;
  return convert<T>(k == 0.0 ? 0.0
                             : k * (::exp(double(convert<compute_t<T>>(log_prob[idx]))) - onehot));
}

// dlogits, one thread per element.
template <class T, class L>
__global__ void cross_entropy_grad(const T* dloss, const T* log_prob, const L* labels,
                                   const T* weight, const double* total_weight, T* dlogits,
                                   GradArgs a) {
  for (int64_t idx = global_thread_index(); idx < a.total; idx += grid_stride()) {
    const int64_t d = idx % a.inner, rest = idx / a.inner;
    const int64_t j = rest % a.len, p = rest / a.len * a.inner + d;
    int64_t l;
    const double k = grad_scale(dloss, labels, weight, total_weight, p, a, &l);
    dlogits[idx] = grad_element(log_prob, idx, j, k, l);
  }
}

// dlogits in the column walk: lanes take 32 adjacent positions, warps split the classes.
template <class T, class L>
__global__ void cross_entropy_grad_columns(const T* dloss, const T* log_prob, const L* labels,
                                           const T* weight, const double* total_weight, T* dlogits,
                                           GradArgs a, int64_t outer) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t tiles = (a.inner + 31) / 32;
  for (int64_t tile = blockIdx.x; tile < outer * tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles, i = tile % tiles * 32 + lane;
    if (i >= a.inner) continue;
    int64_t l;
    const double k = grad_scale(dloss, labels, weight, total_weight, o * a.inner + i, a, &l);
    const int64_t base = o * a.len * a.inner + i;
    for (int64_t j = warp; j < a.len; j += warps) {
      const int64_t idx = base + j * a.inner;
      dlogits[idx] = grad_element(log_prob, idx, j, k, l);
    }
  }
}

// The lse_stash form's dlogits element of class j (k, l, lse: its position's), in C.
template <class C, class T>
__device__ __forceinline__ T recomputed_grad(T x, int64_t j, C k, int64_t l, C lse,
                                             int64_t classes) {
  if (k == C(0) || j >= classes) return convert<T>(C(0));
  return convert<T>(k * (dm::exp(convert<C>(x) - lse) - (j == l ? C(1) : C(0))));
}

// The lse_stash form, the last axis: a block per row, k found once by each thread.
template <class T, class S, class L>
__global__ void cross_entropy_grad_recompute_rows(const S* dloss, const S* lse, const L* labels,
                                                  const S* weight, const double* total_weight,
                                                  const T* x, T* dlogits, GradArgs a,
                                                  int64_t rows) {
  using C = compute_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    int64_t l;
    const C k = C(grad_scale(dloss, labels, weight, total_weight, r, a, &l));
    const C row_lse = convert<C>(lse[r]);
    const T* row = x + r * a.len;
    T* out = dlogits + r * a.len;
    int64_t tail = 0;
    if (is_aligned(row, kVecBytes) && is_aligned(out, kVecBytes)) {  // 16-byte accesses
      constexpr int kWidth = kVecWidth<T>;
      const int64_t vecs = a.len / kWidth;
      for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) {
        const Vec<T> in = load_vec(row, v);
        Vec<T> grad;
#pragma unroll
        for (int e = 0; e < kWidth; ++e)
          grad.v[e] = recomputed_grad(in.v[e], v * kWidth + e, k, l, row_lse, a.classes);
        store_vec(out, v, grad);
      }
      tail = vecs * kWidth;
    }
    for (int64_t j = tail + threadIdx.x; j < a.len; j += blockDim.x)
      out[j] = recomputed_grad(row[j], j, k, l, row_lse, a.classes);
  }
}

// The lse_stash form, another axis: a thread per element.
template <class T, class S, class L>
__global__ void cross_entropy_grad_recompute(const S* dloss, const S* lse, const L* labels,
                                             const S* weight, const double* total_weight,
                                             const T* x, T* dlogits, GradArgs a) {
  using C = compute_t<T>;
  for (int64_t idx = global_thread_index(); idx < a.total; idx += grid_stride()) {
    const int64_t d = idx % a.inner, rest = idx / a.inner;
    const int64_t j = rest % a.len, p = rest / a.len * a.inner + d;
    int64_t l;
    const C k = C(grad_scale(dloss, labels, weight, total_weight, p, a, &l));
    dlogits[idx] = recomputed_grad(x[idx], j, k, l, convert<C>(lse[p]), a.classes);
  }
}

// `stash`: log_prob (T), or the lse_stash form's lse (S, with the logits x).
template <class T, class S, class L>
void run_cross_entropy_backward(Context& ctx, const Node& n, const DeviceTensor& dloss,
                                const DeviceTensor& stash, const DeviceTensor& labels,
                                const DeviceTensor* weight, const DeviceTensor* x,
                                const DeviceTensor& dlogits, GradArgs a) {
  const ErrorSlot slot = reserve_label_error(ctx, n, labels.shape, a.classes);
  a.error = slot.record;
  const S* pw = weight ? weight->as<S>() : nullptr;
  BufferList label_reads{labels.range()};
  if (weight) label_reads.push_back(weight->range());
  BufferList reads = label_reads;
  reads.push_back(dloss.range());
  reads.push_back(stash.range());
  if (x) reads.push_back(x->range());
  const double* total_weight = nullptr;
  if (a.reduction == Reduction::mean) {
    const int64_t positions = labels.numel();
    const int64_t per_block =
        std::max<int64_t>(kSumThreads, (positions + kSumBlocks - 1) / kSumBlocks);
    const int blocks = int(std::max<int64_t>(1, (positions + per_block - 1) / per_block));
    DeviceBuffer partials = ctx.allocator.allocate(size_t(blocks) * sizeof(double));
    DeviceBuffer total = ctx.allocator.allocate(sizeof(double));
    ctx.encoder.add_temporary(partials);
    ctx.encoder.add_temporary(total);
    ctx.encoder.launch(weight_partials<S, L>, unsigned(blocks), kSumThreads, 0, label_reads,
                       BufferList{partials, slot.range}, labels.as<L>(), pw, positions, per_block,
                       a, partials.as<double>());
    ctx.encoder.launch(weight_total, 1u, kSumThreads, 0, BufferList{partials}, BufferList{total},
                       partials.as<double>(), blocks, total.as<double>());
    reads.push_back(total);
    total_weight = total.as<double>();
  }
  const BufferList writes{dlogits.range(), slot.range};
  if (x) {
    if (a.inner == 1) {
      const int64_t rows = a.total / a.len;
      ctx.encoder.launch(cross_entropy_grad_recompute_rows<T, S, L>,
                         unsigned(std::min(rows, kMaxGridStrideBlocks)), unsigned(kBlockRowThreads),
                         0, reads, writes, dloss.as<S>(), stash.as<S>(), labels.as<L>(), pw,
                         total_weight, x->as<T>(), dlogits.as<T>(), a, rows);
    } else {
      ctx.encoder.launch(cross_entropy_grad_recompute<T, S, L>, launch_blocks(a.total),
                         kDefaultThreads, 0, reads, writes, dloss.as<S>(), stash.as<S>(),
                         labels.as<L>(), pw, total_weight, x->as<T>(), dlogits.as<T>(), a);
    }
    return;
  }
  if constexpr (std::is_same_v<S, T>) {
    if (column_walk(a.len, a.inner)) {
      const int64_t outer = a.total / (a.len * a.inner);
      ctx.encoder.launch(cross_entropy_grad_columns<T, L>, column_blocks(outer, a.inner),
                         unsigned(kColumnThreads), 0, reads, writes, dloss.as<T>(), stash.as<T>(),
                         labels.as<L>(), pw, total_weight, dlogits.as<T>(), a, outer);
      return;
    }
    ctx.encoder.launch(cross_entropy_grad<T, L>, launch_blocks(a.total), kDefaultThreads, 0, reads,
                       writes, dloss.as<T>(), stash.as<T>(), labels.as<L>(), pw, total_weight,
                       dlogits.as<T>(), a);
  }
}

// Calls f(T{}, S{}) for logits of dtype t: S = T in the plain form, compute_t<T> in the
// lse_stash form.
template <class F>
void visit_logits(const Node& n, DType t, bool lse_stash, F&& f) {
  visit_device_float(n, t, [&](auto tag) {
    using T = decltype(tag);
    if (lse_stash)
      f(T{}, compute_t<T>{});
    else
      f(T{}, T{});
  });
}

}  // namespace

void cross_entropy(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<CrossEntropyAttrs>(n.attrs);
  const DeviceTensor& logits = *in[0];
  const DeviceTensor& labels = *in[1];
  const DeviceTensor* weight = in.size() > 2 ? in[2] : nullptr;
  const std::string where = node_label(n);
  FUSEBOX_CHECK(logits.rank() >= 2, where, "expects logits [N, C, D...], got ",
                shape_str(logits.shape));
  const Shape& s = logits.shape;
  LossArgs a{s[0],
             s[1],
             numel(Shape(s.begin() + 2, s.end())),
             attrs.classes.value_or(s[1]),
             attrs.ignore_index.has_value(),
             attrs.ignore_index.value_or(0),
             nullptr,
             nullptr};
  FUSEBOX_CHECK(a.classes >= 1 && a.classes <= a.len, where, "classes ", a.classes,
                " is outside [1, ", a.len, "]");
  FUSEBOX_CHECK(labels.numel() == a.outer * a.inner, where, "labels ", shape_str(labels.shape),
                " do not match logits ", shape_str(logits.shape));
  FUSEBOX_CHECK(is_integer(labels.dtype), where, "labels must be i64 or i32, got ",
                dtype_name(labels.dtype));
  const DType stat = attrs.lse_stash ? stash_dtype(logits.dtype) : logits.dtype;
  FUSEBOX_CHECK(!weight || (weight->numel() == a.classes && weight->dtype == stat), where,
                "weight must be ", dtype_name(stat), " [", a.classes, "]");
  FUSEBOX_CHECK(
      out.size() == 2 && out[1].numel() == (attrs.lse_stash ? a.outer * a.inner : logits.numel()),
      where, "expects the outputs loss and ", attrs.lse_stash ? "lse" : "log_prob");
  visit_logits(n, logits.dtype, attrs.lse_stash, [&](auto tag, auto stat_tag) {
    using T = decltype(tag);
    using S = decltype(stat_tag);
    if (a.outer * a.inner == 0) {  // no rows: log_prob is empty; sum 0, mean 0 / 0 = NaN
      if (attrs.reduction != Reduction::none)
        ctx.encoder.launch(fill_scalar<S>, 1u, 1u, 0, BufferList{}, BufferList{out[0].range()},
                           out[0].as<S>(), attrs.reduction == Reduction::sum ? 0.0 : NAN);
      return;
    }
    if (labels.dtype == DType::i64)
      run_cross_entropy<T, S, int64_t>(ctx, n, logits, labels, weight, out[0], out[1], a);
    else
      run_cross_entropy<T, S, int32_t>(ctx, n, logits, labels, weight, out[0], out[1], a);
  });
}

// (dloss, log_prob, labels, weight?) -> dlogits, or (dloss, lse, labels, weight?, logits)
void cross_entropy_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<CrossEntropyAttrs>(n.attrs);
  const DeviceTensor &dloss = *in[0], &stash = *in[1], &labels = *in[2];
  const DeviceTensor* weight = in.size() > 3 ? in[3] : nullptr;
  const DeviceTensor* x = in.size() > 4 ? in[4] : nullptr;
  const DeviceTensor& dlogits = out[0];
  const std::string where = node_label(n);
  FUSEBOX_CHECK(attrs.lse_stash == (x != nullptr), where,
                attrs.lse_stash ? "the lse_stash form needs the input logits"
                                : "takes logits only in the lse_stash form");
  // The tensor of dlogits' type: log_prob, or the lse_stash form's logits.
  const DeviceTensor& like = x ? *x : stash;
  FUSEBOX_CHECK(like.rank() >= 2, where, "expects logits [N, C, D...], got ",
                shape_str(like.shape));
  const Shape& s = like.shape;
  const int64_t len = s[1], inner = numel(Shape(s.begin() + 2, s.end()));
  const int64_t classes = attrs.classes.value_or(len), positions = s[0] * inner;
  const DType stat = attrs.lse_stash ? stash_dtype(like.dtype) : like.dtype;
  FUSEBOX_CHECK(labels.numel() == positions && (!weight || weight->numel() == classes) &&
                    dloss.numel() == (attrs.reduction == Reduction::none ? positions : 1) &&
                    (!x || stash.numel() == positions) && classes >= 1 && classes <= len,
                where, "labels ", shape_str(labels.shape), ", dloss ", shape_str(dloss.shape),
                " and weight do not fit logits ", shape_str(like.shape));
  FUSEBOX_CHECK(is_integer(labels.dtype), where, "labels must be i64 or i32, got ",
                dtype_name(labels.dtype));
  FUSEBOX_CHECK(dloss.dtype == stat && stash.dtype == (x ? stat : like.dtype) &&
                    dlogits.dtype == like.dtype && dlogits.shape == like.shape &&
                    (!weight || weight->dtype == stat),
                where, "dloss and weight must be ", dtype_name(stat), ", dlogits ",
                dtype_name(like.dtype), " like the logits");
  if (dlogits.numel() == 0) return;
  const GradArgs a{len,
                   inner,
                   dlogits.numel(),
                   classes,
                   attrs.reduction,
                   attrs.ignore_index.has_value(),
                   attrs.ignore_index.value_or(0),
                   nullptr};
  visit_logits(n, like.dtype, attrs.lse_stash, [&](auto tag, auto stat_tag) {
    using T = decltype(tag);
    using S = decltype(stat_tag);
    if (labels.dtype == DType::i64)
      run_cross_entropy_backward<T, S, int64_t>(ctx, n, dloss, stash, labels, weight, x, dlogits,
                                                a);
    else
      run_cross_entropy_backward<T, S, int32_t>(ctx, n, dloss, stash, labels, weight, x, dlogits,
                                                a);
  });
}

}  // namespace fusebox::cuda
