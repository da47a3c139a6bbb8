// batch_norm (inference and training forward), batch_norm_apply (stage 3 alone, from a training
// forward's saved statistics) and batch_norm_backward (kernels/batch_norm/direct.h).
//
// Layouts: the activation operands (x, y; dy, x, dx) are all contiguous [N, C, D...] or all
// dense channels-last (N, D..., C in memory; the layout pass chooses); anything else is an
// Error naming the node. The three stages below are the same for both: stages 1 and 3 come
// in one kernel per layout (the contiguous ones here, the channels-last ones in
// kernels/batch_norm/channels_last.cu), stage 2 is shared (kernels/batch_norm/common.cuh).
//
// Contiguous x is N * C contiguous planes of `inner` = prod(D) elements; channel c owns
// planes c, C + c, 2C + c, ... Every pass over x walks it flat and tracks (channel,
// position in plane) incrementally, so the inner loops do no integer division.
//
// Forward, per channel c: y = (x - mean_c) * k_c + bias_c with k_c = scale_c * inv_std_c.
//   inference: mean and var are the running statistics;
//   training:  1. stats: grid (C, chunks); each block reduces its chunk of the channel's
//                 N * inner elements to a Welford triple (count, mean, M2): each thread
//                 updates its own triple per element, then the block merges the threads'
//                 triples pairwise (Chan et al.) in a fixed tree;
//              2. finalize: a warp per channel merges its chunks' triples in a fixed order,
//                 in f64: batch mean and population variance, the new running statistics
//                 (running * momentum + batch * (1 - momentum)), the saved mean and
//                 inverse std, and the (mean, k, bias) coefficients;
//   3. apply: y from the coefficients, 16-byte vectors when inner is a multiple of the
//      vector width and the pointers are aligned; a fused residual added, then a fused
//      relu (common.cuh: the unfused add's and relu's arithmetic).
// Training reads x twice and writes y once (plus per-channel work): expect about 2/3 of
// the copy bandwidth; the stats pass runs a division per element (Welford), which keeps
// it near, not at, the bandwidth limit. Deterministic (no atomics).
//
// Sync (BatchNormAttrs::sync, training: data-parallel synchronized batch norm): stage 2 runs
// twice around one NCCL all-gather over ctx.world (RankTotals). Forward: the first pass merges
// this rank's chunks into one f64 triple per channel, the gather brings every rank's, the
// second pass merges those in rank order (so every rank gets the same statistics, bit for bit)
// and writes what stage 2 always writes. Backward: the first pass writes dscale and dbias (this
// rank's sums) and its (sum dy, sum dy * x_hat); the second sums the ranks' in rank order into
// dx's coefficients. Stages 1 and 3 are unchanged; a world of one gives the unsynced bits.
//
// Mixed precision: with f16 / bf16 activations the per-channel operands (scale, bias,
// running and saved statistics, dscale, dbias) may be f32 (the IR's rule, as PyTorch AMP and
// cuDNN). Their device type P is a template parameter of the kernels that read or write
// them: stage 2, and the backward stage 1, which reads saved_mean and saved_inv_std once per
// thread. Stage 3 reads only the coefficients, in the compute type, so it does not depend
// on P: the activation passes run exactly as without mixed precision.
//
// Backward: the same three stages: per-chunk partial sums of dy and dy * x_hat (f32, f64
// for f64), per-channel totals (dbias, dscale) and dx coefficients, then dx elementwise.
// With a fused relu, stages 1 and 3 read y too and mask dy as they load it (common.cuh).
// The training form subtracts the batch statistics' dependence on x (mean(dy) and
// x_hat * mean(dy * x_hat)); the inference form (the IR op's training = false) treats
// mean and inv_std as constants: dx = scale * inv_std * dy. The IR op batch_norm_backward
// (dy, x, scale, saved_mean, saved_inv_std, y?) -> (dx, dscale, dbias) and the direct call
// of kernels/batch_norm/direct.h (always the training form, no relu) share this code.
#include <initializer_list>
#include <utility>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/batch_norm/common.cuh"
#include "backends/cuda/kernels/batch_norm/direct.h"
#include "backends/cuda/kernels/norm/common.h"
#include "backends/cuda/runtime/nccl.h"

namespace fusebox::cuda {
namespace bn {

namespace {

constexpr int kFinalizeWarps = 4;  // channels per block of the stage 2 kernels (a warp each)

// Where flat element e of x sits: its channel and its position in its plane. Advancing by
// a fixed step costs two compares (the step's own channel and position parts are
// precomputed on the host).
struct ChannelWalk {
  int64_t inner = 1;      // elements per plane (in units of the walk: elements or vectors)
  int64_t channels = 1;   // C
  int64_t step_pos = 0;   // step % inner
  int64_t step_chan = 0;  // (step / inner) % C

  static ChannelWalk make(int64_t inner, int64_t channels, int64_t step) {
    return {inner, channels, step % inner, (step / inner) % channels};
  }
  __device__ void start(int64_t e, int64_t& chan, int64_t& pos) const {
    pos = e % inner;
    chan = (e / inner) % channels;
  }
  __device__ void advance(int64_t& chan, int64_t& pos) const {
    pos += step_pos;
    chan += step_chan;
    if (pos >= inner) {
      pos -= inner;
      ++chan;
    }
    if (chan >= channels) chan -= channels;
  }
};

// A channel's elements seen as N rows of `inner`: element f of channel c is at
// (f / inner * C + c) * inner + f % inner. Stepping by a fixed stride, as ChannelWalk.
struct RowWalk {
  int64_t inner = 1;
  int64_t step_pos = 0;  // step % inner
  int64_t step_row = 0;  // step / inner

  static RowWalk make(int64_t inner, int64_t step) { return {inner, step % inner, step / inner}; }
  __device__ void advance(int64_t& row, int64_t& pos) const {
    pos += step_pos;
    row += step_row;
    if (pos >= inner) {
      pos -= inner;
      ++row;
    }
  }
};

// ---- forward ------------------------------------------------------------------------

// Stage 1 (training): the Welford triple of chunk blockIdx.y of channel blockIdx.x.
// Chunk j covers the channel's flat elements [j * per_chunk, min((j+1) * per_chunk, M)).
template <class T>
__global__ void bn_stats(const T* x, int64_t channels, int64_t inner, int64_t per_chunk,
                         int64_t count, RowWalk walk, Moments<compute_t<T>>* partial) {
  using C = compute_t<T>;
  __shared__ Moments<C> shared[kThreads];
  const int64_t c = blockIdx.x;
  const int64_t first = int64_t(blockIdx.y) * per_chunk;
  const int64_t last = min(count, first + per_chunk);
  Moments<C> m{0, 0, 0};
  int64_t f = first + threadIdx.x;
  int64_t row = f / inner, pos = f % inner;
  for (; f < last; f += blockDim.x) {
    const C v = load_compute(x, (row * channels + c) * inner + pos);
    m.count += C(1);
    const C d = v - m.mean;
    m.mean += d / m.count;
    m.m2 += d * (v - m.mean);
    walk.advance(row, pos);
  }
  shared[threadIdx.x] = m;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      shared[threadIdx.x] = merge(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[c * gridDim.y + blockIdx.y] = shared[0];
}

// Where stage 2 finds channel c's entries: entry j at c * channel_stride + j * entry_stride
// (stage 1's partials: [C][chunks]; the ranks' gathered totals of a sync batch norm:
// [world][C]).
struct Entries {
  int64_t count = 0;
  int64_t channel_stride = 0;
  int64_t entry_stride = 1;
  __device__ int64_t at(int64_t c, int64_t j) const {
    return c * channel_stride + j * entry_stride;
  }
};

// The merge of channel c's entries by its warp, in a fixed order (the result in lane 0):
// lane l merges entries l, l + 32, ... in order, then the lanes' triples merge down a fixed
// shuffle tree (lane l takes lane l + s's for s = 16, 8, ..., 1).
template <class Q>
__device__ Moments<double> merge_channel(const Moments<Q>* entries, Entries e, int64_t c,
                                         int lane) {
  // The lane's entries loaded kAhead at a time before they are merged (in the same order):
  // one dependent load per merge left ~12 L2 round trips per lane at 396 chunks.
  constexpr int kAhead = 4;
  Moments<double> m{0, 0, 0};
  for (int64_t j0 = lane; j0 < e.count; j0 += 32 * kAhead) {
    Moments<Q> p[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      if (j0 + 32 * u < e.count) p[u] = entries[e.at(c, j0 + 32 * u)];
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      if (j0 + 32 * u < e.count)
        m = merge(m, Moments<double>{double(p[u].count), double(p[u].mean), double(p[u].m2)});
  }
  for (int s = 16; s > 0; s /= 2) {
    const Moments<double> other{__shfl_down_sync(0xffffffffu, m.count, s),
                                __shfl_down_sync(0xffffffffu, m.mean, s),
                                __shfl_down_sync(0xffffffffu, m.m2, s)};
    if (lane < s) m = merge(m, other);
  }
  return m;
}

// Stage 2 (training): warp w of the grid merges channel w's entries in f64; lane 0 writes
// the statistics outputs and the coefficients. With `totals` (a sync batch norm's first
// pass) it writes only the merged triple there: this rank's part of the gather.
template <class T, class P, class Q>
__global__ void bn_finalize_training(const Moments<Q>* entries, Entries e, int64_t channels,
                                     const P* scale, const P* bias, const P* running_mean,
                                     const P* running_var, double eps, double momentum, P* new_mean,
                                     P* new_var, P* saved_mean, P* saved_inv_std,
                                     Coefficients<compute_t<T>>* coef, Moments<double>* totals) {
  using C = compute_t<T>;
  const int64_t c = int64_t(blockIdx.x) * kFinalizeWarps + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (c >= channels) return;  // the whole warp: the shuffles need every lane
  const Moments<double> m = merge_channel(entries, e, c, lane);
  if (lane != 0) return;
  if (totals) {
    totals[c] = m;
    return;
  }
  const double var = m.count > 0 ? m.m2 / m.count : 0.0;
  const double inv_std = 1.0 / sqrt(var + eps);
  if (new_mean)
    new_mean[c] = convert<P>(convert<double>(running_mean[c]) * momentum + m.mean * (1 - momentum));
  if (new_var)
    new_var[c] = convert<P>(convert<double>(running_var[c]) * momentum + var * (1 - momentum));
  if (saved_mean) saved_mean[c] = convert<P>(m.mean);
  if (saved_inv_std) saved_inv_std[c] = convert<P>(inv_std);
  // Where the statistics are stored in the compute type, k from inv_std as stored, as the
  // backward computes it: its relu mask recomputed from x (MaskFrom::x) is this pass's.
  C k;
  if constexpr (std::is_same_v<P, C>)
    k = scaled_inv_std<C>(scale[c], convert<P>(inv_std));
  else
    k = C(inv_std * convert<double>(scale[c]));
  coef[c] = {C(m.mean), k, convert<C>(bias[c]), C(inv_std), C(0), C(0)};
}

// Inference: the coefficients from the running statistics.
template <class T, class P>
__global__ void bn_coefficients_inference(int64_t channels, const P* scale, const P* bias,
                                          const P* running_mean, const P* running_var, double eps,
                                          Coefficients<compute_t<T>>* coef) {
  using C = compute_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const double inv_std = 1.0 / sqrt(convert<double>(running_var[c]) + eps);
  coef[c] = {convert<C>(running_mean[c]),
             C(inv_std * convert<double>(scale[c])),
             convert<C>(bias[c]),
             C(inv_std),
             C(0),
             C(0)};
}

// batch_norm_apply: the training forward's coefficients from its saved statistics, as stage 2
// computes them where the statistics are stored in the compute type (P = C: the mean as
// rounded, k from inv_std as stored), so stage 3 then writes the forward's y bit for bit.
template <class T, class P>
__global__ void bn_coefficients_saved(int64_t channels, const P* scale, const P* bias,
                                      const P* saved_mean, const P* saved_inv_std,
                                      Coefficients<compute_t<T>>* coef) {
  using C = compute_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  coef[c] = {convert<C>(saved_mean[c]),
             scaled_inv_std<C>(scale[c], saved_inv_std[c]),
             convert<C>(bias[c]),
             convert<C>(saved_inv_std[c]),
             C(0),
             C(0)};
}

// Stage 3: y = (x - mean) * k + bias (+ residual when given; relu'd with kRelu) over a
// grid-stride walk of `units` units of kWidth elements (kWidth = the vector width, or 1).
template <class T, int kWidth, bool kRelu>
__global__ void bn_apply(const T* x, const T* residual, T* y, int64_t units, ChannelWalk walk,
                         const Coefficients<compute_t<T>>* coef) {
  using C = compute_t<T>;
  int64_t u = global_thread_index(), chan, pos;
  walk.start(u, chan, pos);
  for (; u < units; u += grid_stride()) {
    const Coefficients<C> k = coef[chan];
    if constexpr (kWidth == 1) {
      C v = affine(load_compute(x, u), k.mean, k.k, k.bias);
      if (residual) v = add_residual<T>(v, load_compute(residual, u));
      store_compute(y, u, activate<T, kRelu>(v));
    } else {
      const Vec<T> in = load_vec(x, u);
      Vec<T> r{};
      if (residual) r = load_vec(residual, u);
      Vec<T> out;
#pragma unroll
      for (int w = 0; w < kWidth; ++w) {
        C v = affine(convert<C>(in.v[w]), k.mean, k.k, k.bias);
        if (residual) v = add_residual<T>(v, convert<C>(r.v[w]));
        out.v[w] = convert<T>(activate<T, kRelu>(v));
      }
      store_vec(y, u, out);
    }
    walk.advance(chan, pos);
  }
}

// ---- backward -----------------------------------------------------------------------

// Stage 1: per chunk of a channel, sums of dy and dy * x_hat (fixed tree per block); dy plus
// addend when given, masked by relu's gradient at y as kMask says (scale and bias: with
// MaskFrom::x), and stored to `used` when given.
template <class T, class P, MaskFrom kMask>
__global__ void bn_backward_sums(const T* x, const T* dy, const T* addend, const T* y,
                                 const P* saved_mean, const P* saved_inv_std, const P* scale,
                                 const P* bias, T* used, int64_t channels, int64_t inner,
                                 int64_t per_chunk, int64_t count, RowWalk walk,
                                 compute_t<T>* partial /* [C][chunks][2] */) {
  using C = compute_t<T>;
  __shared__ C shared[2][kThreads];
  const int64_t c = blockIdx.x;
  const C mean = convert<C>(saved_mean[c]), inv_std = convert<C>(saved_inv_std[c]);
  C k = 0, shift = 0;
  if constexpr (kMask == MaskFrom::x) {
    k = scaled_inv_std<C>(scale[c], saved_inv_std[c]);
    shift = convert<C>(bias[c]);
  }
  const int64_t first = int64_t(blockIdx.y) * per_chunk;
  const int64_t last = min(count, first + per_chunk);
  C sum_dy = 0, sum_dyx = 0;
  int64_t f = first + threadIdx.x;
  int64_t row = f / inner, pos = f % inner;
  for (; f < last; f += blockDim.x) {
    const int64_t at = (row * channels + c) * inner + pos;
    const C xv = load_compute(x, at);
    const C g = load_dy<kMask>(dy, addend, y, at, xv, mean, k, shift);
    if (used) store_compute(used, at, g);
    sum_dy += g;
    sum_dyx += g * (xv - mean) * inv_std;
    walk.advance(row, pos);
  }
  shared[0][threadIdx.x] = sum_dy;
  shared[1][threadIdx.x] = sum_dyx;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      shared[0][threadIdx.x] += shared[0][threadIdx.x + half];
      shared[1][threadIdx.x] += shared[1][threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    C* out = partial + (c * gridDim.y + blockIdx.y) * 2;
    out[0] = shared[0][0];
    out[1] = shared[1][0];
  }
}

// Stage 2: per channel totals in f64 of the entries' (sum dy, sum dy * x_hat) pairs (a warp
// per channel, in a fixed order as bn_finalize_training), dscale / dbias, and the dx
// coefficients with `count` elements behind the totals. A sync batch norm's first pass
// (`totals` given) writes dscale and dbias (this rank's sums) and the totals (its part of the
// gather), not the coefficients; its second pass sums the gathered totals into them.
template <class T, class P, class G, class Q>
__global__ void bn_backward_finalize(const Q* entries /* pairs */, Entries e, int64_t channels,
                                     int64_t count, bool training, const P* scale, const P* bias,
                                     const P* saved_mean, const P* saved_inv_std, G* dscale,
                                     G* dbias, Coefficients<compute_t<T>>* coef, double* totals) {
  using C = compute_t<T>;
  const int64_t c = int64_t(blockIdx.x) * kFinalizeWarps + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (c >= channels) return;  // the whole warp
  double sum_dy = 0, sum_dyx = 0;
  for (int64_t j = lane; j < e.count; j += 32) {
    sum_dy += double(entries[e.at(c, j) * 2]);
    sum_dyx += double(entries[e.at(c, j) * 2 + 1]);
  }
  for (int s = 16; s > 0; s /= 2) {
    const double other_dy = __shfl_down_sync(0xffffffffu, sum_dy, s);
    const double other_dyx = __shfl_down_sync(0xffffffffu, sum_dyx, s);
    if (lane < s) {
      sum_dy += other_dy;
      sum_dyx += other_dyx;
    }
  }
  if (lane != 0) return;
  if (dscale) dscale[c] = convert<G>(sum_dyx);
  if (dbias) dbias[c] = convert<G>(sum_dy);
  if (totals) {
    totals[2 * c] = sum_dy;
    totals[2 * c + 1] = sum_dyx;
    return;
  }
  const double inv_std = convert<double>(saved_inv_std[c]);
  coef[c] = {convert<C>(saved_mean[c]),
             scaled_inv_std<C>(scale[c], saved_inv_std[c]),
             bias ? convert<C>(bias[c]) : C(0),
             C(inv_std),
             C(training ? sum_dy / double(count) : 0.0),
             C(training ? sum_dyx / double(count) : 0.0)};
}

// Stage 3: dx = k * (dy - mean_dy - x_hat * mean_dyx), grid-stride over elements (dy summed
// and masked as stage 1's; with MaskFrom::x the coefficients hold the forward's bias).
template <class T, MaskFrom kMask>
__global__ void bn_backward_dx(const T* x, const T* dy, const T* addend, const T* y, T* dx,
                               int64_t total, ChannelWalk walk,
                               const Coefficients<compute_t<T>>* coef) {
  using C = compute_t<T>;
  int64_t e = global_thread_index(), chan, pos;
  walk.start(e, chan, pos);
  for (; e < total; e += grid_stride()) {
    const Coefficients<C> k = coef[chan];
    const C xv = load_compute(x, e);
    const C x_hat = (xv - k.mean) * k.inv_std;
    const C g = load_dy<kMask>(dy, addend, y, e, xv, k.mean, k.k, k.bias);
    store_compute(dx, e, k.k * (g - k.mean_dy - x_hat * k.mean_dyx));
    walk.advance(chan, pos);
  }
}

// ---- host -----------------------------------------------------------------------------

struct Geometry {
  int64_t batch = 0, channels = 0, inner = 1;
  int64_t per_channel() const { return batch * inner; }
  int64_t total() const { return batch * channels * inner; }
};

Geometry geometry_of(const std::string& where, const Shape& x) {
  FUSEBOX_CHECK(x.size() >= 2, where, "expects x of rank >= 2, got ", shape_str(x));
  return {x[0], x[1], numel(Shape(x.begin() + 2, x.end()))};
}

enum class Layout { contiguous, channels_last };

// The layout the activation operands share (null ones skipped): all contiguous, else all
// dense channels-last (a tensor with C == 1 or every spatial extent 1 is both). Anything
// else is an Error naming the node: the kernels index every operand in one layout.
Layout layout_of(const std::string& where,
                 std::initializer_list<std::pair<const char*, const DeviceTensor*>> operands) {
  bool contiguous = true, channels_last = true;
  std::string found;
  for (const auto& [name, t] : operands) {
    if (t == nullptr) continue;
    contiguous = contiguous && t->is_contiguous();
    channels_last = channels_last && t->is_channels_last();
    found += cat(found.empty() ? "" : ", ", name, " ", shape_str(t->shape), " with strides ",
                 shape_str(t->strides));
  }
  if (contiguous) return Layout::contiguous;
  FUSEBOX_CHECK(channels_last, where,
                "expects its activation operands all contiguous or all dense channels-last, got ",
                found);
  return Layout::channels_last;
}

// Per-channel operands are contiguous [C]-element vectors of one dtype (param_dtype).
void check_per_channel(const std::string& where, const char* what, const DeviceTensor* p,
                       DType dtype, int64_t channels) {
  FUSEBOX_CHECK(p && p->numel() == channels && p->dtype == dtype && p->is_contiguous(), where, what,
                " must be a contiguous ", dtype_name(dtype), " tensor of ", channels, " elements");
}

// The per-channel operands' dtype, given the first one's: x's, or f32 for f16 / bf16 x.
DType param_dtype(const std::string& where, DType x, DType first) {
  FUSEBOX_CHECK(first == x || ((x == DType::f16 || x == DType::bf16) && first == DType::f32), where,
                "per-channel operands are ", dtype_name(first), " but x is ", dtype_name(x),
                ": they must have x's dtype, or f32 when x is f16 or bf16");
  return first;
}

// Calls f(P{}) with P the device type of the per-channel operands for activations of device
// type T: T itself, or float (only instantiated for __half / __nv_bfloat16 activations).
template <class T, class F>
void visit_param_type(DType x, DType param, F&& f) {
  if constexpr (is_half_v<T>) {
    if (param != x) return f(float{});
  }
  f(T{});
}

// Chunks per channel for the contiguous reductions: about 4 blocks per SM in all, each
// chunk at least 4096 elements.
int64_t chunks_for(const Geometry& g, int sms) {
  const int64_t wanted = (4 * int64_t(sms) + g.channels - 1) / std::max<int64_t>(g.channels, 1);
  const int64_t most = std::max<int64_t>(1, (g.per_channel() + 4095) / 4096);
  return std::clamp<int64_t>(wanted, 1, std::min<int64_t>(most, 65535));
}

// Stage 1 of the contiguous training forward.
template <class T>
Partials contiguous_stats(Context& ctx, const Geometry& g, const DeviceTensor& x) {
  using C = compute_t<T>;
  const int64_t chunks = chunks_for(g, ctx.device.properties().sm_count);
  const int64_t per_chunk = (g.per_channel() + chunks - 1) / chunks;
  Partials p{ctx.encoder.temporary(ctx.allocator, size_t(g.channels * chunks) * sizeof(Moments<C>)),
             chunks};
  ctx.encoder.launch(&bn_stats<T>, dim3(unsigned(g.channels), unsigned(chunks)), dim3(kThreads), 0,
                     {x.range()}, {p.buffer}, x.as<const T>(), g.channels, g.inner, per_chunk,
                     g.per_channel(), RowWalk::make(g.inner, kThreads),
                     static_cast<Moments<C>*>(p.buffer.data()));
  return p;
}

// Stage 3 of the contiguous forward.
template <class T>
void contiguous_apply(Context& ctx, const Geometry& g, const DeviceTensor& x, const DeviceTensor& y,
                      const BufferRange& coef, bool relu, const DeviceTensor* residual) {
  using C = compute_t<T>;
  constexpr int W = kVecWidth<T>;
  BufferList reads = norm::ranges({&x, residual});
  reads.push_back(coef);
  const bool vector = W > 1 && g.inner % W == 0 && is_aligned(x.data(), kVecBytes) &&
                      is_aligned(y.data(), kVecBytes) &&
                      (!residual || is_aligned(residual->data(), kVecBytes));
  const T* r = residual ? residual->as<const T>() : nullptr;
  const int width = vector ? W : 1;
  const int64_t units = g.total() / width;
  const unsigned blocks = launch_blocks(units, kThreads);
  const ChannelWalk walk =
      ChannelWalk::make(g.inner / width, g.channels, int64_t(blocks) * kThreads);
  with_flag(relu, [&](auto fused) {
    constexpr bool kRelu = decltype(fused)::value;
    if (vector) {
      ctx.encoder.launch(&bn_apply<T, W, kRelu>, dim3(blocks), dim3(kThreads), 0, reads,
                         {y.range()}, x.as<const T>(), r, y.as<T>(), units, walk,
                         static_cast<const Coefficients<C>*>(coef.data()));
    } else {
      ctx.encoder.launch(&bn_apply<T, 1, kRelu>, dim3(blocks), dim3(kThreads), 0, reads,
                         {y.range()}, x.as<const T>(), r, y.as<T>(), units, walk,
                         static_cast<const Coefficients<C>*>(coef.data()));
    }
  });
}

// Stage 1 of the contiguous backward.
template <class T, class P>
Partials contiguous_backward_sums(Context& ctx, const Geometry& g, const DeviceTensor& x,
                                  const DyTerms& dy, const ReluMask& mask,
                                  const DeviceTensor& saved_mean,
                                  const DeviceTensor& saved_inv_std) {
  using C = compute_t<T>;
  const int64_t chunks = chunks_for(g, ctx.device.properties().sm_count);
  const int64_t per_chunk = (g.per_channel() + chunks - 1) / chunks;
  Partials p{ctx.encoder.temporary(ctx.allocator, size_t(g.channels * chunks * 2) * sizeof(C)),
             chunks};
  BufferList writes = norm::ranges({dy.used});
  writes.push_back(p.buffer);
  with_mask(mask.from, [&](auto from) {
    ctx.encoder.launch(&bn_backward_sums<T, P, decltype(from)::value>,
                       dim3(unsigned(g.channels), unsigned(chunks)), dim3(kThreads), 0,
                       norm::ranges({&x, dy.dy, dy.addend, mask.y, &saved_mean, &saved_inv_std,
                                     mask.scale, mask.bias}),
                       writes, x.as<const T>(), dy.dy->as<const T>(), dy.addend_data<T>(),
                       mask.y_data<T>(), saved_mean.as<const P>(), saved_inv_std.as<const P>(),
                       mask.scale_data<P>(), mask.bias_data<P>(), dy.used_data<T>(), g.channels,
                       g.inner, per_chunk, g.per_channel(), RowWalk::make(g.inner, kThreads),
                       static_cast<C*>(p.buffer.data()));
  });
  return p;
}

// Stage 3 of the contiguous backward.
template <class T>
void contiguous_backward_dx(Context& ctx, const Geometry& g, const DeviceTensor& x,
                            const DyTerms& dy, const ReluMask& mask, const DeviceTensor& dx,
                            const BufferRange& coef) {
  using C = compute_t<T>;
  const unsigned blocks = launch_blocks(g.total(), kThreads);
  BufferList reads = norm::ranges({&x, dy.dy, dy.addend, mask.y});
  reads.push_back(coef);
  with_mask(mask.from, [&](auto from) {
    ctx.encoder.launch(&bn_backward_dx<T, decltype(from)::value>, dim3(blocks), dim3(kThreads), 0,
                       reads, {dx.range()}, x.as<const T>(), dy.dy->as<const T>(),
                       dy.addend_data<T>(), mask.y_data<T>(), dx.as<T>(), g.total(),
                       ChannelWalk::make(g.inner, g.channels, int64_t(blocks) * kThreads),
                       static_cast<const Coefficients<C>*>(coef.data()));
  });
}

unsigned finalize_blocks(int64_t channels) {
  return unsigned((channels + kFinalizeWarps - 1) / kFinalizeWarps);
}

// A sync batch norm's per-channel totals of every rank: [world][bytes of one rank]. Each rank
// writes its own slot, then one NCCL all-gather over ctx.world fills the others (no world:
// a world of one, nothing to gather). The gather declares the communicator's order byte like
// every collective, so the encoder issues it in recording order on every rank.
struct RankTotals {
  DeviceBuffer buffer;
  size_t bytes = 0;  // one rank's
  int rank = 0, ranks = 1;

  static RankTotals make(Context& ctx, size_t bytes) {
    RankTotals t;
    t.bytes = bytes;
    if (ctx.world != nullptr) {
      t.rank = ctx.world->rank();
      t.ranks = ctx.world->world_size();
    }
    t.buffer = ctx.allocator.allocate(bytes * size_t(t.ranks));
    ctx.encoder.add_temporary(t.buffer);
    return t;
  }
  template <class E>
  E* own() const {
    return reinterpret_cast<E*>(static_cast<char*>(buffer.data()) + size_t(rank) * bytes);
  }
  BufferRange own_range() const { return BufferRange(buffer, size_t(rank) * bytes, bytes); }
  BufferRange whole() const { return BufferRange(buffer, 0, bytes * size_t(ranks)); }
  void gather(Context& ctx) const {
    if (ctx.world == nullptr) return;
    NcclCommunicator& world = *ctx.world;
    const BufferRange order(world.order(), 0, world.order().size());
    ctx.encoder.capture_library_call(
        {own_range(), order}, {whole(), order},
        [&](cudaStream_t stream) { world.comm().all_gather(buffer.data(), bytes, stream); });
  }
};

// From a producer's tile sums (BatchNormTileSums), the first of two merges: block x of the
// grid takes a segment of kTilesPerSegment consecutive tiles, thread c of it channel c's triple
// of them in f64 (tile t's from its sum s and sum of squares q over n rows: mean s / n, m2 =
// q - s * mean, cancellation within one tile of f32 sums; merged in tile order), written
// [segment][channels] for bn_finalize_training's fixed-order merge. Two levels because one warp
// walking a channel's every tile (6,272 at 56x56, batch 256) took ~0.09 ms, the statistics
// GEMM that made them 0.21.
constexpr int64_t kTilesPerSegment = 32;
constexpr int kSegmentThreads = 128;

__global__ void bn_tile_segments(const float* sums, const float* squares, int64_t tiles,
                                 int64_t pitch, int64_t tile_rows, int64_t rows, int64_t channels,
                                 Moments<double>* out) {
  const int64_t c = int64_t(blockIdx.y) * kSegmentThreads + threadIdx.x;
  if (c >= channels) return;
  const int64_t segment = blockIdx.x, first = segment * kTilesPerSegment;
  const int64_t last = min(tiles, first + kTilesPerSegment);
  Moments<double> m{0.0, 0.0, 0.0};
#pragma unroll 4
  for (int64_t t = first; t < last; ++t) {
    const double n = double(min(tile_rows, rows - t * tile_rows));
    const double s = sums[t * pitch + c], q = squares[t * pitch + c];
    const double mean = s / n;
    m = merge(m, Moments<double>{n, mean, max(q - s * mean, 0.0)});
  }
  out[segment * channels + c] = m;
}

// Stage 2's merge alone (bn_finalize_training's `totals` form: no coefficients, no statistics
// outputs): each channel's entries into one f64 triple, written to `out` (range `written`).
template <class Q>
void merge_into_triples(Context& ctx, const BufferRange& entries, Entries e, int64_t channels,
                        const BufferRange& written, Moments<double>* out) {
  const float* none = nullptr;
  float* no_output = nullptr;
  ctx.encoder.launch(&bn_finalize_training<float, float, Q>, dim3(finalize_blocks(channels)),
                     dim3(32 * kFinalizeWarps), 0, {entries}, {written},
                     static_cast<const Moments<Q>*>(entries.data()), e, channels, none, none, none,
                     none, 0.0, 0.0, no_output, no_output, no_output, no_output,
                     static_cast<Coefficients<float>*>(nullptr), out);
}

// The channel triples f64 [channels, 3] (ir/ops.h ConvAttrs::channel_stats) checked.
void check_triples(const std::string& where, const DeviceTensor& t, int64_t channels,
                   const char* what) {
  FUSEBOX_CHECK(t.dtype == DType::f64 && t.shape == Shape({channels, 3}) && t.is_contiguous(),
                where, what, " must be contiguous f64 [", channels,
                ", 3] (count, mean, M2 per channel), got ", dtype_name(t.dtype), " ",
                shape_str(t.shape));
}

// batch_norm, and batch_norm_apply (its stage 3 from a training forward's saved statistics).
// A training batch_norm given x's statistics (input 6, batch_stats: f64 [C][count, mean, M2])
// skips stage 1: stage 2 merges the one triple per channel (exactly: merged with nothing).
void run_batch_norm(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const auto& attrs = std::get<BatchNormAttrs>(n.attrs);
  const bool apply = n.op == OpKind::batch_norm_apply;
  FUSEBOX_CHECK(apply ? in.size() == 5 && in[0] && out.size() == 1
                      : in.size() >= 5 && in.size() <= 7 && in[0] && !out.empty(),
                where,
                apply ? "expects (x, scale, bias, saved_mean, saved_inv_std) -> y"
                      : "expects (x, scale, bias, running_mean, running_var, residual?, "
                        "batch_stats?) -> (y, ...)");
  const DeviceTensor& x = *in[0];
  const DeviceTensor* residual = in.size() > 5 ? in[5] : nullptr;
  const DeviceTensor* given = in.size() > 6 ? in[6] : nullptr;
  FUSEBOX_CHECK(!residual || (residual->dtype == x.dtype && residual->shape == x.shape), where,
                "the residual must be ", dtype_name(x.dtype), " ", shape_str(x.shape), " like x");
  const Geometry g = geometry_of(where, x.shape);
  FUSEBOX_CHECK(in[1], where, "scale is absent");
  const DType param = param_dtype(where, x.dtype, in[1]->dtype);
  const char* names[] = {"x", "scale", "bias", "running_mean", "running_var"};
  const char* apply_names[] = {"x", "scale", "bias", "saved_mean", "saved_inv_std"};
  for (size_t i = 1; i <= 4; ++i)
    check_per_channel(where, (apply ? apply_names : names)[i], in[i], param, g.channels);
  FUSEBOX_CHECK(out[0].dtype == x.dtype && out[0].shape == x.shape, where, "output y must be ",
                dtype_name(x.dtype), " ", shape_str(x.shape));
  for (size_t o = 1; o < out.size(); ++o)
    check_per_channel(where, cat("output ", o).c_str(), &out[o], param, g.channels);
  const Layout layout = layout_of(where, {{"x", &x}, {"y", &out[0]}, {"residual", residual}});
  if (g.channels == 0) return;
  visit_device_float(n, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const BufferRange coef =
        ctx.encoder.temporary(ctx.allocator, size_t(g.channels) * sizeof(Coefficients<C>));
    const BufferList params = norm::ranges({in[1], in[2], in[3], in[4]});
    // Stage 2 (or the inference coefficients) is the only forward kernel that reads or
    // writes the per-channel tensors.
    visit_param_type<T>(x.dtype, param, [&](auto param_tag) {
      using P = decltype(param_tag);
      const P *scale = in[1]->as<const P>(), *bias = in[2]->as<const P>();
      const P *running_mean = in[3]->as<const P>(), *running_var = in[4]->as<const P>();
      if (apply) {  // inputs 3 and 4 are the saved mean and inverse std
        ctx.encoder.launch(&bn_coefficients_saved<T, P>, dim3(unsigned((g.channels + 127) / 128)),
                           dim3(128), 0, params, {coef}, g.channels, scale, bias, running_mean,
                           running_var, static_cast<Coefficients<C>*>(coef.data()));
        return;
      }
      if (!attrs.training) {
        ctx.encoder.launch(&bn_coefficients_inference<T, P>,
                           dim3(unsigned((g.channels + 127) / 128)), dim3(128), 0, params, {coef},
                           g.channels, scale, bias, running_mean, running_var, attrs.epsilon,
                           static_cast<Coefficients<C>*>(coef.data()));
        return;
      }
      FUSEBOX_CHECK(g.per_channel() > 0, where, "training needs batch statistics but x ",
                    shape_str(x.shape), " has no elements per channel");
      auto output = [&](size_t o) { return o < out.size() ? out[o].as<P>() : nullptr; };
      BufferList writes = {coef};
      for (size_t o = 1; o < out.size() && o <= 4; ++o) writes.push_back(out[o].range());
      const dim3 grid(finalize_blocks(g.channels)), block(32 * kFinalizeWarps);
      if (given != nullptr) {
        FUSEBOX_CHECK(!attrs.sync, where, "batch_stats given to a synchronized batch norm");
        check_triples(where, *given, g.channels, "batch_stats");
        BufferList reads = params;
        reads.push_back(given->range());
        ctx.encoder.launch(&bn_finalize_training<T, P, double>, grid, block, 0, reads, writes,
                           given->as<const Moments<double>>(), Entries{1, 1, 1}, g.channels, scale,
                           bias, running_mean, running_var, attrs.epsilon, attrs.momentum,
                           output(1), output(2), output(3), output(4),
                           static_cast<Coefficients<C>*>(coef.data()),
                           static_cast<Moments<double>*>(nullptr));
        return;
      }
      const Partials partial = layout == Layout::channels_last ? channels_last_stats<T>(ctx, x)
                                                               : contiguous_stats<T>(ctx, g, x);
      const Entries chunks{partial.chunks, partial.chunks, 1};
      if (!attrs.sync) {
        BufferList reads = params;
        reads.push_back(partial.buffer);
        ctx.encoder.launch(&bn_finalize_training<T, P, C>, grid, block, 0, reads, writes,
                           static_cast<const Moments<C>*>(partial.buffer.data()), chunks,
                           g.channels, scale, bias, running_mean, running_var, attrs.epsilon,
                           attrs.momentum, output(1), output(2), output(3), output(4),
                           static_cast<Coefficients<C>*>(coef.data()),
                           static_cast<Moments<double>*>(nullptr));
        return;
      }
      // Sync: this rank's triples, gathered from every rank, merged in rank order.
      const RankTotals totals = RankTotals::make(ctx, size_t(g.channels) * sizeof(Moments<double>));
      merge_into_triples<C>(ctx, partial.buffer, chunks, g.channels, totals.own_range(),
                            totals.own<Moments<double>>());
      totals.gather(ctx);
      BufferList reads = params;
      reads.push_back(totals.whole());
      ctx.encoder.launch(
          &bn_finalize_training<T, P, double>, grid, block, 0, reads, writes,
          static_cast<const Moments<double>*>(totals.buffer.data()),
          Entries{totals.ranks, 1, g.channels}, g.channels, scale, bias, running_mean, running_var,
          attrs.epsilon, attrs.momentum, output(1), output(2), output(3), output(4),
          static_cast<Coefficients<C>*>(coef.data()), static_cast<Moments<double>*>(nullptr));
    });
    if (g.total() == 0) return;
    if (layout == Layout::channels_last)
      channels_last_apply<T>(ctx, x, out[0], coef, attrs.relu, residual);
    else
      contiguous_apply<T>(ctx, g, x, out[0], coef, attrs.relu, residual);
  });
}

// dy: the gradient (dy, or the two terms dy + addend) and where stage 1 writes the dy it used
// (DyTerms::used, or null). relu_y: the forward's output y of a fused relu (masks dy), or
// null; relu_bias (with relu_y, or null): the forward's bias, by which the mask is recomputed
// from x where the saved statistics are in the compute type (ReluMask), y then not read.
// sync (training only): the dx coefficients from every rank's sums (BatchNormAttrs::sync).
void run_batch_norm_backward(Context& ctx, const std::string& where, bool training, bool sync,
                             const DeviceTensor& x, const DyTerms& dy, const DeviceTensor* relu_y,
                             const DeviceTensor* relu_bias, const DeviceTensor& scale,
                             const DeviceTensor& saved_mean, const DeviceTensor& saved_inv_std,
                             DeviceTensor* dx, DeviceTensor* dscale, DeviceTensor* dbias) {
  const Geometry g = geometry_of(where, x.shape);
  const auto like_x = [&](const DeviceTensor* t) {
    return !t || (t->dtype == x.dtype && t->shape == x.shape);
  };
  FUSEBOX_CHECK(
      like_x(dy.dy) && like_x(dy.addend) && like_x(dy.used) && like_x(dx) && like_x(relu_y), where,
      "dy, dy_addend, dy_used, dx and y must be ", dtype_name(x.dtype), " ", shape_str(x.shape),
      " like x");
  const Layout layout = layout_of(where, {{"x", &x},
                                          {"dy", dy.dy},
                                          {"dy_addend", dy.addend},
                                          {"dy_used", dy.used},
                                          {"y", relu_y},
                                          {"dx", dx}});
  const DType param = param_dtype(where, x.dtype, scale.dtype);
  check_per_channel(where, "scale", &scale, param, g.channels);
  check_per_channel(where, "saved_mean", &saved_mean, param, g.channels);
  check_per_channel(where, "saved_inv_std", &saved_inv_std, param, g.channels);
  if (relu_bias) check_per_channel(where, "bias", relu_bias, param, g.channels);
  const DType grad_dtype = dscale ? dscale->dtype : dbias ? dbias->dtype : param;
  for (const DeviceTensor* p : {dscale, dbias}) {
    FUSEBOX_CHECK(!p || (p->numel() == g.channels && p->is_contiguous() && p->dtype == grad_dtype &&
                         (grad_dtype == x.dtype || grad_dtype == DType::f32)),
                  where, "dscale and dbias must be contiguous with ", g.channels,
                  " elements, both in ", dtype_name(x.dtype), " or both in f32");
  }
  if (g.channels == 0) return;
  if (g.per_channel() == 0) {
    for (DeviceTensor* p : {dscale, dbias})
      if (p) ctx.encoder.memset(p->range(), 0);
    return;  // dy_used, like dx, has no elements
  }
  visit_device_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_float_v<T>) {
      throw Error(where, cat("expects a floating-point x, got ", dtype_name(x.dtype)));
    } else {
      using C = compute_t<T>;
      const BufferRange coef =
          ctx.encoder.temporary(ctx.allocator, size_t(g.channels) * sizeof(Coefficients<C>));
      // Stages 1 and 2 read the per-channel tensors; stage 3 only the coefficients.
      ReluMask mask;
      visit_param_type<T>(x.dtype, param, [&](auto param_tag) {
        using P = decltype(param_tag);
        if (relu_y != nullptr) {
          mask = relu_bias != nullptr && std::is_same_v<P, C>
                     ? ReluMask{MaskFrom::x, nullptr, &scale, relu_bias}
                     : ReluMask{MaskFrom::y, relu_y, nullptr, nullptr};
        }
        const P* bias = mask.bias_data<P>();
        const Partials partial =
            layout == Layout::channels_last
                ? channels_last_backward_sums<T, P>(ctx, x, dy, mask, saved_mean, saved_inv_std)
                : contiguous_backward_sums<T, P>(ctx, g, x, dy, mask, saved_mean, saved_inv_std);
        const Entries chunks{partial.chunks, partial.chunks, 1};
        const dim3 grid(finalize_blocks(g.channels)), block(32 * kFinalizeWarps);
        auto finalize = [&](auto grad_tag) {
          using G = decltype(grad_tag);
          G* dscale_out = dscale ? dscale->as<G>() : nullptr;
          G* dbias_out = dbias ? dbias->as<G>() : nullptr;
          BufferList reads = norm::ranges({&scale, mask.bias, &saved_mean, &saved_inv_std});
          reads.insert(reads.begin(), partial.buffer);
          BufferList writes = norm::ranges({dscale, dbias});
          if (!(sync && training)) {
            writes.push_back(coef);
            ctx.encoder.launch(&bn_backward_finalize<T, P, G, C>, grid, block, 0, reads, writes,
                               static_cast<const C*>(partial.buffer.data()), chunks, g.channels,
                               g.per_channel(), training, scale.as<const P>(), bias,
                               saved_mean.as<const P>(), saved_inv_std.as<const P>(), dscale_out,
                               dbias_out, static_cast<Coefficients<C>*>(coef.data()),
                               static_cast<double*>(nullptr));
            return;
          }
          // Sync: this rank's sums are dscale and dbias; every rank's, gathered and summed in
          // rank order, make the coefficients (the shards have one shape: count * world).
          const RankTotals totals = RankTotals::make(ctx, size_t(g.channels) * 2 * sizeof(double));
          writes.push_back(totals.own_range());
          ctx.encoder.launch(&bn_backward_finalize<T, P, G, C>, grid, block, 0, reads, writes,
                             static_cast<const C*>(partial.buffer.data()), chunks, g.channels,
                             g.per_channel(), training, scale.as<const P>(), bias,
                             saved_mean.as<const P>(), saved_inv_std.as<const P>(), dscale_out,
                             dbias_out, static_cast<Coefficients<C>*>(nullptr),
                             totals.own<double>());
          totals.gather(ctx);
          reads[0] = totals.whole();
          ctx.encoder.launch(
              &bn_backward_finalize<T, P, G, double>, grid, block, 0, reads, {coef},
              static_cast<const double*>(totals.buffer.data()),
              Entries{totals.ranks, 1, g.channels}, g.channels, g.per_channel() * totals.ranks,
              training, scale.as<const P>(), bias, saved_mean.as<const P>(),
              saved_inv_std.as<const P>(), static_cast<G*>(nullptr), static_cast<G*>(nullptr),
              static_cast<Coefficients<C>*>(coef.data()), static_cast<double*>(nullptr));
        };
        if (grad_dtype == DType::f32)
          finalize(float{});
        else
          finalize(T{});
      });
      if (!dx) return;
      // Stage 3 reads the dy stage 1 wrote (summed and masked) where it wrote one.
      const DyTerms dx_dy = dy.used ? DyTerms{dy.used} : DyTerms{dy.dy, dy.addend};
      const ReluMask dx_mask = dy.used ? ReluMask{} : mask;
      if (layout == Layout::channels_last)
        channels_last_backward_dx<T>(ctx, x, dx_dy, dx_mask, *dx, coef);
      else
        contiguous_backward_dx<T>(ctx, g, x, dx_dy, dx_mask, *dx, coef);
    }
  });
}

}  // namespace
}  // namespace bn

// x [N, C, D...], scale, bias, running_mean, running_var [C] -> y (inference), or y, new
// running mean, new running var, saved mean, saved inverse std (training).
void batch_norm(Context& ctx, const Node& n, Inputs in, Outputs out) {
  bn::run_batch_norm(ctx, n, in, out);
}

void batch_norm_apply(Context& ctx, const Node& n, Inputs in, Outputs out) {
  bn::run_batch_norm(ctx, n, in, out);
}

// x's statistics, written as the triples f64 [C, 3] (stage 1, then stage 2's merge alone, as a
// sync norm writes this rank's part).
void channel_moments(Context& ctx, const std::string& where, const DeviceTensor& x,
                     DeviceTensor& moments) {
  using namespace bn;
  const Geometry g = geometry_of(where, x.shape);
  check_triples(where, moments, g.channels, "the channel statistics");
  FUSEBOX_CHECK(g.per_channel() > 0, where, "channel statistics of x ", shape_str(x.shape),
                ", which has no elements per channel");
  if (g.channels == 0) return;
  const Layout layout = layout_of(where, {{"x", &x}});
  visit_device_float(where, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const Partials partial = layout == Layout::channels_last ? channels_last_stats<T>(ctx, x)
                                                             : contiguous_stats<T>(ctx, g, x);
    merge_into_triples<C>(ctx, partial.buffer, Entries{partial.chunks, partial.chunks, 1},
                          g.channels, moments.range(), moments.as<Moments<double>>());
  });
}

void channel_moments_from_tile_sums(Context& ctx, const std::string& where,
                                    const BatchNormTileSums& sums, int64_t channels,
                                    DeviceTensor& moments) {
  using namespace bn;
  check_triples(where, moments, channels, "the channel statistics");
  FUSEBOX_CHECK(sums.rows > 0 && sums.tiles > 0 && sums.tile_rows > 0 &&
                    sums.tiles == (sums.rows + sums.tile_rows - 1) / sums.tile_rows &&
                    sums.pitch >= channels && channels <= 65535 * kSegmentThreads,
                where, "tile sums of ", sums.tiles, " tiles of ", sums.tile_rows, " rows (pitch ",
                sums.pitch, ") do not describe ", sums.rows, " rows of ", channels, " channels");
  if (channels == 0) return;
  const int64_t segments = (sums.tiles + kTilesPerSegment - 1) / kTilesPerSegment;
  const BufferRange merged =
      ctx.encoder.temporary(ctx.allocator, size_t(segments * channels) * sizeof(Moments<double>));
  ctx.encoder.launch(
      &bn_tile_segments,
      dim3(unsigned(segments), unsigned((channels + kSegmentThreads - 1) / kSegmentThreads)),
      dim3(kSegmentThreads), 0, sums.ranges, {merged}, sums.sums, sums.squares, sums.tiles,
      sums.pitch, sums.tile_rows, sums.rows, channels,
      static_cast<Moments<double>*>(merged.data()));
  merge_into_triples<double>(ctx, merged, Entries{segments, 1, channels}, channels, moments.range(),
                             moments.as<Moments<double>>());
}

void batch_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                         const DeviceTensor& scale, const DeviceTensor& saved_mean,
                         const DeviceTensor& saved_inv_std, DeviceTensor* dx, DeviceTensor* dscale,
                         DeviceTensor* dbias) {
  bn::run_batch_norm_backward(ctx, "batch_norm_backward", true, false, x, bn::DyTerms{&dy}, nullptr,
                              nullptr, scale, saved_mean, saved_inv_std, dx, dscale, dbias);
}

// (dy, x, scale, saved_mean, saved_inv_std, y?, bias?, dy_addend?) -> (dx, dscale, dbias,
// dy_used?): dx in x's dtype, dscale and dbias in scale's (x's, or f32 for f16 / bf16 x); y
// exactly with relu, bias optionally with it (the mask then recomputed from x where it can be:
// ReluMask); dy_used (dy + dy_addend, masked) with dy_output.
void batch_norm_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<BatchNormAttrs>(n.attrs);
  const auto input = [&](size_t i) { return i < in.size() ? in[i] : nullptr; };
  FUSEBOX_CHECK(in.size() >= 5 && in.size() <= 8 && out.size() == (attrs.dy_output ? 4u : 3u) &&
                    in[0] && in[1] && in[2] && in[3] && in[4] && (!attrs.relu || input(5)) &&
                    (attrs.relu || (!input(5) && !input(6))),
                node_label(n), "expects (dy, x, scale, saved_mean, saved_inv_std",
                attrs.relu ? ", y, bias?" : "", ", dy_addend?) -> (dx, dscale, dbias",
                attrs.dy_output ? ", dy_used" : "", ")");
  FUSEBOX_CHECK(out[1].dtype == in[2]->dtype && out[2].dtype == in[2]->dtype, node_label(n),
                "dscale and dbias must be ", dtype_name(in[2]->dtype), " like scale");
  const bn::DyTerms dy{in[0], input(7), attrs.dy_output ? &out[3] : nullptr};
  bn::run_batch_norm_backward(ctx, node_label(n), attrs.training, attrs.sync, *in[1], dy,
                              attrs.relu ? in[5] : nullptr, input(6), *in[2], *in[3], *in[4],
                              &out[0], &out[1], &out[2]);
}

}  // namespace fusebox::cuda
