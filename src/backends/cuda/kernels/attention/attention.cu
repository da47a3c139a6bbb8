// attention and attention_backward (ir/ops.h) on the GPU. The forward tries, in order, the
// short-sequence kernel (short_attention.h: bf16/f16, Tq, Tk, d, dv <= 64, e.g. windowed
// attention), cuDNN's fused flash attention (cudnn/attention.h) for bf16/f16 where cuDNN takes
// the problem, and the project's row kernels below; the backward, cuDNN then the row kernels.
// Which one ran and why goes to stderr once per problem (FUSEBOX_ATTENTION=own forces the row
// kernels).
//
// The row kernels are the fallback and the test oracle, not fast. One block per (leading
// index, query row), the row's Tk scores in shared memory:
//   forward   s_j = scale q . k_j + bias_ij (the kept keys); m = max s, p_j = exp(s_j - m),
//             l = sum p; y = sum_j p_j v_j / l, lse = m + log l.
//   backward  p_j = exp(s_j - lse); D = dy . y; ds_j = p_j (dy . v_j - D);
//             dq = scale sum_j ds_j k_j (written), dk_j += scale ds_j q, dv_j += p_j dy and
//             dbias_ij += ds_j (f32 atomics into zeroed scratch, then rounded into dk, dv
//             and dbias: rows of one leading index all add to its keys).
//
// The bias (an additive mask) reaches cuDNN as [Bb, Hb, Tq, Tk] in the io dtype (Bb, Hb: 1
// or the extent; cuDNN broadcasts those), converted / expanded into a temporary when it is
// not already that (a padding mask [B, 1, 1, Tk], an f32 mask); the row kernels read it as
// f32 in its own shape through broadcast strides, and so does the short-sequence kernel.
//
// A bias shared by the whole batch whose gradient is asked for (Swin's relative position bias:
// [1, 3, 49, 49] over 4,096 windows) makes cuDNN's backward sum dbias over the batch, which it
// does slowly for thousands (6.4 ms for Swin-T's first stage on an H200, where the same work
// shaped [64 batch, 192 heads] takes 0.63 ms): such a backward is regrouped, the batch B = G B'
// folded into the heads ([B', G H, T, d], the contiguous operands as they lie), the bias
// repeated G times ([1, G H, Tq, Tk], a temporary) and cuDNN's dbias summed over G after.
//
// q, k, v (and the backward's dy) may be strided views (the executable plans the head split
// of a packed projection, reshape -> transpose -> reshape, as a view of the projection):
// cuDNN reads them where they lie when its rows (the last dim) are dense and 16-byte aligned;
// the other paths get contiguous copies.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>

#include "backends/cuda/cudnn/attention.h"
#include "backends/cuda/device/block_reduce.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/attention/short_attention.h"
#include "backends/cuda/kernels/common/converted_inputs.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/elementwise.cuh"
#include "backends/cuda/runtime/settings.h"

namespace fusebox::cuda {

namespace {

struct RowGeometry {
  int64_t tq, tk, d, dv, heads;
  float scale;
  bool causal;
  BiasStrides bias;
};

__device__ __forceinline__ int64_t bias_offset(const RowGeometry& g, int64_t lead, int64_t i,
                                               int64_t j) {
  return (lead / g.heads) * g.bias.batch + (lead % g.heads) * g.bias.head + i * g.bias.query +
         j * g.bias.key;
}

// s_j = scale q_i . k_j + bias_ij into scores (the kept keys); returns their count.
template <class T>
__device__ int64_t row_scores(const T* qi, const T* kb, const float* bias, const RowGeometry& g,
                              int64_t lead, int64_t i, float* scores) {
  const int64_t keys = g.causal ? min(g.tk, i + 1) : g.tk;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    float s = 0.f;
    for (int64_t c = 0; c < g.d; ++c) s += convert<float>(qi[c]) * convert<float>(kb[j * g.d + c]);
    scores[j] = g.scale * s + (bias != nullptr ? bias[bias_offset(g, lead, i, j)] : 0.f);
  }
  return keys;
}

template <class T>
__global__ void attention_rows(const T* q, const T* k, const T* v, const float* bias, T* y,
                               float* lse, RowGeometry g) {
  extern __shared__ float scores[];
  const int64_t row = blockIdx.x, lead = row / g.tq, i = row % g.tq;
  const int64_t keys = row_scores(q + row * g.d, k + lead * g.tk * g.d, bias, g, lead, i, scores);
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) m = fmaxf(m, scores[j]);
  m = block_max(m);
  float l = 0.f;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) l += (scores[j] = __expf(scores[j] - m));
  l = block_sum(l);  // its barriers also make every score visible to every thread
  const T* vb = v + lead * g.tk * g.dv;
  for (int64_t c = threadIdx.x; c < g.dv; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < keys; ++j) acc += scores[j] * convert<float>(vb[j * g.dv + c]);
    y[row * g.dv + c] = convert<T>(acc / l);
  }
  if (lse != nullptr && threadIdx.x == 0) lse[row] = m + logf(l);
}

template <class T>
__global__ void attention_rows_backward(const T* dy, const T* q, const T* k, const T* v, const T* y,
                                        const float* lse, const float* bias, T* dq, float* dk,
                                        float* dv, float* dbias, RowGeometry g) {
  extern __shared__ float p[];
  const int64_t row = blockIdx.x, lead = row / g.tq, i = row % g.tq;
  const T* qi = q + row * g.d;
  const T* kb = k + lead * g.tk * g.d;
  const T* vb = v + lead * g.tk * g.dv;
  const T* dyi = dy + row * g.dv;
  const int64_t keys = row_scores(qi, kb, bias, g, lead, i, p);
  float D = 0.f;
  for (int64_t c = threadIdx.x; c < g.dv; c += blockDim.x)
    D += convert<float>(dyi[c]) * convert<float>(y[row * g.dv + c]);
  D = block_sum(D);
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    const float pj = __expf(p[j] - lse[row]);
    float dp = 0.f;
    for (int64_t c = 0; c < g.dv; ++c) {
      const float gc = convert<float>(dyi[c]);
      dp += gc * convert<float>(vb[j * g.dv + c]);
      atomicAdd(dv + (lead * g.tk + j) * g.dv + c, pj * gc);
    }
    const float ds = pj * (dp - D);
    p[j] = ds;
    if (dbias != nullptr) atomicAdd(dbias + bias_offset(g, lead, i, j), ds);
    for (int64_t c = 0; c < g.d; ++c)
      atomicAdd(dk + (lead * g.tk + j) * g.d + c, g.scale * ds * convert<float>(qi[c]));
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < g.d; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < keys; ++j) acc += p[j] * convert<float>(kb[j * g.d + c]);
    dq[row * g.d + c] = convert<T>(g.scale * acc);
  }
}

template <class T>
__global__ void round_into(const float* from, T* to, int64_t n) {
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) to[i] = convert<T>(from[i]);
}

// Reports once per problem which implementation attention got.
void note_once(const AttentionProblem& p, const std::string& what) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  const std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(p.describe()).second)
    std::fprintf(stderr, "fusebox: attention %s: %s\n", p.describe().c_str(), what.c_str());
}

// The bias viewed with four dims aligned to the scores [B, H, Tq, Tk] (H = 1 for [B, T, d]
// problems of rank 3): its own extents (1 where it broadcasts) and strides.
DeviceTensor bias_view4(const DeviceTensor& bias, size_t rank) {
  Shape dims(rank - bias.shape.size(), 1), strides(rank - bias.shape.size(), 0);
  dims.insert(dims.end(), bias.shape.begin(), bias.shape.end());
  strides.insert(strides.end(), bias.strides.begin(), bias.strides.end());
  if (rank == 3) dims.insert(dims.begin() + 1, 1), strides.insert(strides.begin() + 1, 0);
  return bias.view(bias.offset, dims, strides);
}

// A 4-d bias view's strides as the row kernels walk it: 0 along the dims of extent 1.
BiasStrides strides_of(const DeviceTensor& view4) {
  auto along = [&](int d) { return view4.shape[size_t(d)] == 1 ? 0 : view4.strides[size_t(d)]; };
  return {along(0), along(1), along(2), along(3)};
}

AttentionProblem problem_of(const Node& n, const DeviceTensor& q, const DeviceTensor& k,
                            const DeviceTensor& v, const DeviceTensor* bias, bool backward) {
  const auto& a = std::get<AttentionAttrs>(n.attrs);
  const size_t r = q.shape.size();
  AttentionProblem p;
  p.dtype = q.dtype;
  p.tq = q.shape[r - 2], p.d = q.shape[r - 1], p.tk = k.shape[r - 2], p.dv = v.shape[r - 1];
  p.batch = q.shape[0], p.heads = r == 4 ? q.shape[1] : 1;
  p.scale = a.scale, p.causal = a.causal, p.with_lse = a.with_lse || backward;
  p.backward = backward;
  if (bias != nullptr) {
    const Shape dims = bias_view4(*bias, r).shape;
    p.bias_batch = dims[0], p.bias_heads = dims[1];
    p.bias_grad = backward && a.bias_grad;
  }
  return p;
}

template <class Out>
struct ConvertTo {
  template <class In>
  __device__ __forceinline__ Out operator()(In v) const {
    return convert<Out>(v);
  }
};

// dst (contiguous) = src converted to dst's dtype; src any float dtype and strides.
void convert_into(Context& ctx, const Node& n, const DeviceTensor& src, const DeviceTensor& dst) {
  visit_device_float(n, src.dtype, [&](auto from_tag) {
    visit_device_float(n, dst.dtype, [&](auto to_tag) {
      using From = decltype(from_tag);
      using To = decltype(to_tag);
      launch_map1<From, To>(ctx, n, src, dst, ConvertTo<To>{});
    });
  });
}

// The bias as cuDNN reads it: [Bb, Hb, Tq, Tk] dense in the io dtype; the bias itself when
// it is that already, else a converted / expanded temporary.
DeviceTensor bias_for_cudnn(Context& ctx, const Node& n, const AttentionProblem& p,
                            const DeviceTensor& bias, size_t rank) {
  const Shape to = {p.bias_batch, p.bias_heads, p.tq, p.tk};
  if (bias.dtype == p.dtype && numel(bias.shape) == numel(to))  // contiguous (checked)
    return bias.view(bias.offset, to, contiguous_strides(to));
  const DeviceTensor own = bias_view4(bias, rank);
  const DeviceTensor wide = own.view(own.offset, to, broadcast_strides(own.shape, own.strides, to));
  const DeviceTensor dense = temporary_tensor(ctx, p.dtype, to);
  convert_into(ctx, n, wide, dense);
  return dense;
}

// Whether cuDNN has a plan for `p` (built and cached on first use); `why` says why not.
bool cudnn_takes(Context& ctx, const AttentionProblem& p, std::string& why) {
  if (settings().attention_own) {
    why = "FUSEBOX_ATTENTION=own";
    return false;
  }
  return attention_plan(ctx.device.cudnn_handle(ctx.encoder.stream()), p, why) != nullptr;
}

// Records cuDNN's plan for `p` on `b`; false with `why` when cuDNN refuses or the plan does not
// run (tried once outside any capture, so that a failure is found here, not in a recording).
bool record_cudnn(Context& ctx, const Node& n, const AttentionProblem& p, const AttentionBuffers& b,
                  const BufferList& reads, BufferList writes, std::string& why) {
  cudnnHandle_t handle = ctx.device.cudnn_handle(ctx.encoder.stream());
  std::shared_ptr<AttentionPlan> plan = attention_plan(handle, p, why);
  if (!plan) return false;
  const BufferRange workspace =
      ctx.encoder.scratch(ctx.allocator, size_t(attention_workspace_bytes(*plan)));
  if (workspace.bytes > 0) writes.push_back(workspace);
  static std::mutex mutex;
  static std::set<AttentionPlan*> warmed;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!warmed.count(plan.get())) {
      if (!execute_attention(*plan, handle, b, workspace.data(), why)) return false;
      warmed.insert(plan.get());
    }
  }
  ctx.encoder.keep_alive(plan);
  ctx.encoder.capture_library_call(reads, writes, [&](cudaStream_t s) {
    std::string failed;
    if (!execute_attention(*plan, ctx.device.cudnn_handle(s), b, workspace.data(), failed))
      throw Error(node_label(n), "cuDNN attention failed while recorded: " + failed);
  });
  note_once(p, "cuDNN fused attention");
  return true;
}

void check_row_kernel(Context& ctx, const Node& n, const AttentionProblem& p,
                      const std::string& why) {
  note_once(p, "the project's row kernel (" + why + ")");
  FUSEBOX_CHECK(
      size_t(p.tk) * sizeof(float) <= ctx.device.properties().shared_memory_per_block_optin,
      node_label(n), "the fallback attention kernel keeps a row's ", p.tk,
      " scores in shared memory, more than the device has (cuDNN: ", why, ")");
  FUSEBOX_CHECK(p.batch * p.heads * p.tq <= int64_t(INT32_MAX), node_label(n),
                "too many query rows for the fallback attention kernel");
}

// The bias as the row kernels and the short-sequence kernel read it: f32 in its own (4-d) shape,
// and its strides over (batch, head, query, key), 0 where it broadcasts. An f32 bias is read where
// it is.
std::pair<DeviceTensor, BiasStrides> bias_for_rows(Context& ctx, const Node& n,
                                                   const DeviceTensor& bias, size_t rank) {
  DeviceTensor own = bias_view4(bias, rank);
  if (own.dtype != DType::f32) {
    const DeviceTensor dense = temporary_tensor(ctx, DType::f32, own.shape);
    convert_into(ctx, n, own, dense);
    own = dense;
  }
  return {own, strides_of(own)};
}

// Operands the dense paths take as they are: contiguous at a 16-byte aligned address (a view
// may be either or neither).
std::optional<MemoryFormat> unless_dense(const DeviceTensor& t) {
  const bool aligned = reinterpret_cast<uintptr_t>(t.data()) % 16 == 0;
  return t.is_contiguous() && aligned ? std::nullopt : std::optional(MemoryFormat::contiguous);
}

// [B, H, T, d] strides of a rank-4 operand, or of a rank-3 one ([B, T, d]: one head).
std::vector<int64_t> strides4(const DeviceTensor& t) {
  if (t.rank() == 4) return {t.strides[0], t.strides[1], t.strides[2], t.strides[3]};
  return {t.strides[0], t.strides[0], t.strides[1], t.strides[2]};
}

// Whether cuDNN reads `t` where it lies: its rows dense, its start and strides 16-byte aligned.
bool cudnn_reads_in_place(const DeviceTensor& t) {
  const int64_t bytes = int64_t(dtype_size(t.dtype));
  if (t.shape.back() != 1 && t.strides.back() != 1) return false;
  if (reinterpret_cast<uintptr_t>(t.data()) % 16 != 0) return false;
  for (size_t i = 0; i + 1 < t.shape.size(); ++i)
    if (t.shape[i] != 1 && (t.strides[i] * bytes) % 16 != 0) return false;
  return true;
}

// cuDNN's forward on these operands (p names q, k, v's strides where they are views).
bool record_cudnn_forward(Context& ctx, const Node& n, const AttentionProblem& p,
                          const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                          const DeviceTensor* bias, const DeviceTensor& y, float* lse,
                          const BufferList& writes, std::string& why) {
  BufferList reads{q.range(), k.range(), v.range()};
  AttentionBuffers b;
  b.q = q.data(), b.k = k.data(), b.v = v.data(), b.o = y.data(), b.lse = lse;
  if (bias) {
    const DeviceTensor dense = bias_for_cudnn(ctx, n, p, *bias, q.shape.size());
    b.bias = dense.data(), reads.push_back(dense.range());
  }
  return record_cudnn(ctx, n, p, b, reads, writes, why);
}

// cuDNN's backward on these operands (p names dy, q, k, v's strides where they are views);
// dbias, when asked for, in the io dtype (converted after where dbias has another).
bool record_cudnn_backward(Context& ctx, const Node& n, const AttentionProblem& p, Inputs in,
                           Outputs out, std::string& why) {
  const DeviceTensor &dy = *in[0], &q = *in[1], &k = *in[2], &v = *in[3], &y = *in[4],
                     &lse = *in[5];
  const DeviceTensor* bias = in.size() > 6 ? in[6] : nullptr;
  const DeviceTensor &dq = out[0], &dk = out[1], &dv = out[2];
  const DeviceTensor* dbias = out.size() > 3 ? &out[3] : nullptr;
  BufferList reads{dy.range(), q.range(), k.range(), v.range(), y.range(), lse.range()};
  BufferList writes{dq.range(), dk.range(), dv.range()};
  AttentionBuffers b;
  b.q = q.data(), b.k = k.data(), b.v = v.data(), b.o = y.data(), b.lse = lse.data();
  b.d_o = dy.data(), b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data();
  if (bias) {
    const DeviceTensor dense = bias_for_cudnn(ctx, n, p, *bias, q.shape.size());
    b.bias = dense.data(), reads.push_back(dense.range());
  }
  DeviceTensor dbias_io;
  if (dbias) {
    dbias_io = dbias->dtype == p.dtype ? *dbias : temporary_tensor(ctx, p.dtype, dbias->shape);
    b.dbias = dbias_io.data(), writes.push_back(dbias_io.range());
  }
  if (!record_cudnn(ctx, n, p, b, reads, writes, why)) return false;
  if (dbias && dbias->dtype != p.dtype) convert_into(ctx, n, dbias_io, *dbias);
  return true;
}

// The batch a regrouped backward leaves cuDNN at most, and the most bytes its repeated bias and
// dbias may take.
constexpr int64_t kRegroupedBatch = 64;
constexpr int64_t kRegroupedBiasBytes = int64_t(64) << 20;

// out[e] = the sum over g of wide[g * per_group + e] (f32 sums, g ascending).
template <class T, class D>
__global__ void sum_groups(const T* wide, int64_t groups, int64_t per_group, D* out) {
  for (int64_t e = global_thread_index(); e < per_group; e += grid_stride()) {
    float sum = 0;
    for (int64_t g = 0; g < groups; ++g) sum += float(load_compute(wide, g * per_group + e));
    store_compute(out, e, sum);
  }
}

// The regrouped backward (above): false (nothing recorded) where it does not apply -- no dbias,
// a bias with a batch extent or broadcast heads, a batch of at most kRegroupedBatch, an operand
// that is not contiguous or not rank 4, a repeated bias past kRegroupedBiasBytes -- or cuDNN
// refuses the regrouped problem.
bool regrouped_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  if (out.size() <= 3 || in.size() <= 6 || settings().attention_own) return false;
  const DeviceTensor &q = *in[1], &k = *in[2], &v = *in[3], &bias = *in[6];
  if (q.shape.size() != 4 || q.numel() == 0) return false;
  const AttentionProblem p = problem_of(n, q, k, v, &bias, true);
  if (p.batch <= kRegroupedBatch || p.bias_batch != 1 || p.bias_heads != p.heads ||
      numel(bias.shape) != p.heads * p.tq * p.tk)
    return false;
  int64_t groups = 2;  // the fewest groups that leave cuDNN at most kRegroupedBatch
  while (p.batch % groups != 0 || p.batch / groups > kRegroupedBatch) ++groups;
  if (groups * numel(bias.shape) * int64_t(dtype_size(p.dtype)) > kRegroupedBiasBytes) return false;
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].is_contiguous()) return false;
  // [B, H, ...] -> [B / G, G H, ...]: contiguous, so the same bytes.
  auto regrouped = [&](const DeviceTensor& t) {
    Shape shape = t.shape;
    shape[0] /= groups, shape[1] *= groups;
    return t.view(t.offset, shape, contiguous_strides(shape));
  };
  AttentionProblem wide = p;
  wide.batch /= groups, wide.heads *= groups, wide.bias_heads = wide.heads;
  std::string why;
  if (!cudnn_takes(ctx, wide, why)) return false;
  const Shape wide_shape = {1, wide.heads, p.tq, p.tk};
  const DeviceTensor wide_dbias = temporary_tensor(ctx, p.dtype, wide_shape);
  const ConvertedInputs dense(ctx, in, unless_contiguous);
  std::vector<DeviceTensor> ins;
  for (size_t i = 0; i < 6; ++i) ins.push_back(regrouped(*dense.get()[i]));
  const DeviceTensor bias4 = bias_view4(*dense.get()[6], 4);
  const Shape repeated = {groups, p.heads, p.tq, p.tk};
  const DeviceTensor wide_bias = temporary_tensor(ctx, p.dtype, repeated);
  convert_into(
      ctx, n,
      bias4.view(bias4.offset, repeated, broadcast_strides(bias4.shape, bias4.strides, repeated)),
      wide_bias);
  ins.push_back(wide_bias.view(wide_bias.offset, wide_shape, contiguous_strides(wide_shape)));
  std::vector<DeviceTensor> outs{regrouped(out[0]), regrouped(out[1]), regrouped(out[2]),
                                 wide_dbias};
  std::vector<const DeviceTensor*> in_ptrs;
  for (const DeviceTensor& t : ins) in_ptrs.push_back(&t);
  if (!record_cudnn_backward(ctx, n, wide, in_ptrs, outs, why)) return false;
  const DeviceTensor& dbias = out[3];
  visit_device_float(n, p.dtype, [&](auto io_tag) {
    visit_device_float(n, dbias.dtype, [&](auto out_tag) {
      using T = decltype(io_tag);
      using D = decltype(out_tag);
      ctx.encoder.launch(&sum_groups<T, D>, dim3(launch_blocks(dbias.numel())),
                         dim3(kDefaultThreads), 0, {wide_dbias.range()}, {dbias.range()},
                         wide_dbias.as<const T>(), groups, dbias.numel(), dbias.as<D>());
    });
  });
  return true;
}

void attention_dense(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<AttentionAttrs>(n.attrs);
  const DeviceTensor &q = *in[0], &k = *in[1], &v = *in[2];
  const DeviceTensor* bias = in.size() > 3 ? in[3] : nullptr;
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && y.is_contiguous() &&
                    (!bias || bias->is_contiguous()),
                node_label(n), "expects contiguous q, k, v, bias and y");
  const AttentionProblem p = problem_of(n, q, k, v, bias, false);
  if (y.numel() == 0) return;
  float* lse = a.with_lse ? out[1].as<float>() : nullptr;
  BufferList writes{y.range()};
  if (lse) writes.push_back(out[1].range());
  std::string why;
  if (!settings().attention_own && short_attention_takes(p, why)) {
    BufferList reads{q.range(), k.range(), v.range()};
    const float* bias32 = nullptr;
    BiasStrides strides;
    if (bias) {
      const auto [own, own_strides] = bias_for_rows(ctx, n, *bias, q.shape.size());
      bias32 = own.as<float>(), strides = own_strides, reads.push_back(own.range());
    }
    if (record_short_attention(ctx, n, p, q, k, v, y, lse, bias32, strides, reads, writes, why)) {
      note_once(p, "the short-sequence kernel");
      return;
    }
  }
  if (cudnn_takes(ctx, p, why) &&
      record_cudnn_forward(ctx, n, p, q, k, v, bias, y, lse, writes, why))
    return;
  check_row_kernel(ctx, n, p, why);
  RowGeometry g{p.tq, p.tk, p.d, p.dv, p.heads, float(p.scale), p.causal, {}};
  BufferList reads{q.range(), k.range(), v.range()};
  const float* bias32 = nullptr;
  if (bias) {
    const auto [own, strides] = bias_for_rows(ctx, n, *bias, q.shape.size());
    bias32 = own.as<float>(), g.bias = strides, reads.push_back(own.range());
  }
  visit_device_float(n, q.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(attention_rows<T>, dim3(unsigned(p.batch * p.heads * p.tq)), dim3(128),
                       size_t(p.tk) * sizeof(float), reads, writes, q.as<T>(), k.as<T>(), v.as<T>(),
                       bias32, y.as<T>(), lse, g);
  });
}

void attention_backward_dense(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor &dy = *in[0], &q = *in[1], &k = *in[2], &v = *in[3], &y = *in[4],
                     &lse = *in[5];
  const DeviceTensor* bias = in.size() > 6 ? in[6] : nullptr;
  const DeviceTensor &dq = out[0], &dk = out[1], &dv = out[2];
  const DeviceTensor* dbias = out.size() > 3 ? &out[3] : nullptr;
  for (const DeviceTensor* t : {&dy, &q, &k, &v, &y, &lse, &dq, &dk, &dv})
    FUSEBOX_CHECK(t->is_contiguous(), node_label(n), "expects contiguous operands");
  FUSEBOX_CHECK((!bias || bias->is_contiguous()) && (!dbias || dbias->is_contiguous()),
                node_label(n), "expects a contiguous bias and dbias");
  const AttentionProblem p = problem_of(n, q, k, v, bias, true);
  if (q.numel() == 0 && k.numel() == 0) return;
  std::string why;
  if (dbias && numel(bias->shape) != p.bias_batch * p.bias_heads * p.tq * p.tk) {
    why = cat("cuDNN's dBias takes a bias of whole [Tq, Tk] rows, not ", shape_str(bias->shape));
  } else if (cudnn_takes(ctx, p, why) && record_cudnn_backward(ctx, n, p, in, out, why)) {
    return;
  }
  check_row_kernel(ctx, n, p, why);
  RowGeometry g{p.tq, p.tk, p.d, p.dv, p.heads, float(p.scale), p.causal, {}};
  BufferList reads{dy.range(), q.range(), k.range(), v.range(), y.range(), lse.range()};
  const float* bias32 = nullptr;
  if (bias) {
    const auto [own, strides] = bias_for_rows(ctx, n, *bias, q.shape.size());
    bias32 = own.as<float>(), g.bias = strides, reads.push_back(own.range());
  }
  const BufferRange dk32 = ctx.encoder.temporary(ctx.allocator, size_t(dk.numel()) * 4);
  const BufferRange dv32 = ctx.encoder.temporary(ctx.allocator, size_t(dv.numel()) * 4);
  ctx.encoder.memset(dk32, 0);
  ctx.encoder.memset(dv32, 0);
  BufferList all_writes = {dq.range(), dk32, dv32};
  DeviceTensor dbias32;
  if (dbias) {
    // The atomics land at dbias32's dense offsets, which are the (contiguous) bias's too.
    dbias32 = temporary_tensor(ctx, DType::f32, dbias->shape);
    g.bias = strides_of(bias_view4(dbias32, q.shape.size()));
    ctx.encoder.memset(dbias32.range(), 0);
    all_writes.push_back(dbias32.range());
  }
  visit_device_float(n, q.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(attention_rows_backward<T>, dim3(unsigned(p.batch * p.heads * p.tq)),
                       dim3(128), size_t(p.tk) * sizeof(float), reads, all_writes, dy.as<T>(),
                       q.as<T>(), k.as<T>(), v.as<T>(), y.as<T>(), lse.as<float>(), bias32,
                       dq.as<T>(), static_cast<float*>(dk32.data()),
                       static_cast<float*>(dv32.data()),
                       dbias ? dbias32.as<float>() : static_cast<float*>(nullptr), g);
    ctx.encoder.launch(round_into<T>, launch_blocks(dk.numel()), kDefaultThreads, 0, {dk32},
                       {dk.range()}, static_cast<const float*>(dk32.data()), dk.as<T>(),
                       dk.numel());
    ctx.encoder.launch(round_into<T>, launch_blocks(dv.numel()), kDefaultThreads, 0, {dv32},
                       {dv.range()}, static_cast<const float*>(dv32.data()), dv.as<T>(),
                       dv.numel());
  });
  if (dbias) convert_into(ctx, n, dbias32, *dbias);
}

}  // namespace

void attention(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor &q = *in[0], &k = *in[1], &v = *in[2];
  const DeviceTensor* bias = in.size() > 3 ? in[3] : nullptr;
  if (unless_dense(q) || unless_dense(k) || unless_dense(v)) {
    // Views: cuDNN reads them where it would have run anyway (not where the short-sequence
    // kernel takes the problem: that one is faster even after the copies).
    AttentionProblem p = problem_of(n, q, k, v, bias, false);
    std::string why;
    const auto& a = std::get<AttentionAttrs>(n.attrs);
    if (out[0].numel() > 0 && !settings().attention_own && !short_attention_takes(p, why) &&
        cudnn_reads_in_place(q) && cudnn_reads_in_place(k) && cudnn_reads_in_place(v) &&
        out[0].is_contiguous() && (!bias || !unless_dense(*bias))) {
      p.q_strides = strides4(q), p.k_strides = strides4(k), p.v_strides = strides4(v);
      float* lse = a.with_lse ? out[1].as<float>() : nullptr;
      BufferList writes{out[0].range()};
      if (lse) writes.push_back(out[1].range());
      if (cudnn_takes(ctx, p, why) &&
          record_cudnn_forward(ctx, n, p, q, k, v, bias, out[0], lse, writes, why))
        return;
    }
  }
  const ConvertedInputs dense(ctx, in, unless_dense);
  attention_dense(ctx, n, dense.get(), out);
}

void attention_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  if (regrouped_backward(ctx, n, in, out)) return;
  const DeviceTensor &dy = *in[0], &q = *in[1], &k = *in[2], &v = *in[3];
  const DeviceTensor* bias = in.size() > 6 ? in[6] : nullptr;
  const DeviceTensor& o = *in[4];
  // Views among dy, q, k, v, o (o: the rows the output projection keeps, read back through the
  // inverse transpose): cuDNN reads them where they lie, the rest as they are.
  const bool views =
      unless_dense(dy) || unless_dense(q) || unless_dense(k) || unless_dense(v) || unless_dense(o);
  const bool dense_rest =
      !unless_dense(*in[5]) && (!bias || !unless_dense(*bias)) &&
      std::all_of(out.begin(), out.end(), [](const DeviceTensor& t) { return t.is_contiguous(); });
  if (views && dense_rest && !settings().attention_own && q.numel() > 0 &&
      cudnn_reads_in_place(dy) && cudnn_reads_in_place(q) && cudnn_reads_in_place(k) &&
      cudnn_reads_in_place(v) && cudnn_reads_in_place(o)) {
    AttentionProblem p = problem_of(n, q, k, v, bias, true);
    if (out.size() <= 3 || numel(bias->shape) == p.bias_batch * p.bias_heads * p.tq * p.tk) {
      p.do_strides = strides4(dy), p.q_strides = strides4(q), p.k_strides = strides4(k),
      p.v_strides = strides4(v), p.o_strides = strides4(o);
      std::string why;
      if (cudnn_takes(ctx, p, why) && record_cudnn_backward(ctx, n, p, in, out, why)) return;
    }
  }
  const ConvertedInputs dense(ctx, in, unless_dense);
  attention_backward_dense(ctx, n, dense.get(), out);
}

}  // namespace fusebox::cuda
