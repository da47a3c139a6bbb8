// Optimizer updates on the GPU, one fused elementwise pass per parameter tensor, with the
// CPU backend's arithmetic (backends/cpu/optimizer.cpp, PyTorch's update loops):
//
//   sgd_update:   g = grad + weight_decay * param
//                 buf = momentum * buf + (1 - dampening) * g
//                 g = nesterov ? g + momentum * buf : buf      (when momentum != 0)
//                 param = param - lr * g
//   adamw_update: param = param * (1 - lr * weight_decay)
//                 m = beta1 * m + (1 - beta1) * grad
//                 v = beta2 * v + (1 - beta2) * grad^2
//                 param = param - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) +
//                 eps)
//
// Per element in compute_t of the parameter (f32 for f16/bf16, f64 for f64). lr and step
// are rank-0 DEVICE inputs: each thread reads them (one cached load each) and computes the
// per-step scalars in f64, as the CPU does on the host, so a schedule never forces a host
// sync and a replayed graph picks up new values. The attribute-only scalars (1 - beta,
// 1 - dampening, ...) are computed on the host in f64 and rounded to the compute type, as
// the CPU. Every product and sum is rounded separately (__fmul_rn / __fadd_rn: no FMA
// contraction), so an SGD step gives the CPU backend's bits exactly; AdamW differs only by
// the device pow in the bias corrections (a few ulps of f64, below the f32 rounding).
// A step < 1 raises the node's ErrorRecord (the run fails, as the CPU's check).
// The optional grad_scale and skip inputs (f16 loss scaling) are device scalars too: with
// grad_scale, grad is grad * grad_scale rounded to the compute type (__fmul_rn); with a
// nonzero skip every thread writes its state inputs' elements back unchanged (in place
// that leaves them as they were). A compiled training step's halt word (a bad label was
// found: runtime/error_flags.h) skips the same way, and leaves loss_scale_update's state.
//
// A bf16/f16 grad beside an f32 param is read as its exact f32 value (the widening cast it
// replaces); with low_param, new_param is also stored rounded to its dtype (the low copy the
// step's products read: ops.h), in the same pass.
//
// 16-byte vectors of the param's type when every pointer is aligned (one load per operand per
// W elements; a low gradient or copy moves W elements in 8 bytes), a scalar tail; grid-stride
// loops.
//
// Multi-tensor updates (record_update_group): a step's consecutive updates of one kind, with
// the same attributes, scalar inputs and dtypes, every pointer aligned, run as one launch per
// kMultiTensorBatch tensors (as PyTorch's fused optimizers): each tensor gets blocks for its
// size (kPacksPerThread vectors per thread), the tensors' first blocks are in the launch's
// parameters, and a block finds its tensor by binary search, then walks that tensor's vectors
// with the same per-element code. ResNet-50's 161 parameter updates were 161 launches.
//
// f16 loss scaling:
//   nonfinite_any: the output zeroed, then one launch per kNonfiniteBatch inputs (grid.y
//   the input, grid.x a grid-stride loop over its elements) testing each element's
//   exponent bits (all ones: an infinity or a NaN, in any float format); a block that
//   found one sets the output to 1 (every writer writes 1: the result is deterministic).
//   Inputs are read as dense memory in whatever order they are stored (contiguous or
//   channels-last); anything else is first copied.
//   loss_scale_update: one thread reads the scaler state and writes the next
//   (backends/common/loss_scale.h, the CPU's rule), in place when the outputs alias it.
#include <algorithm>
#include <optional>
#include <type_traits>

#include "backends/common/loss_scale.h"
#include "backends/cuda/kernels/common/elementwise.cuh"
#include "backends/cuda/runtime/error_flags.h"
#include "fusebox/ir/op_info.h"

namespace fusebox::cuda {

namespace {

// Rounded arithmetic that the compiler may not contract into an FMA.
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rn(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ __forceinline__ float sub_rn(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ double sub_rn(double a, double b) {
  return __dsub_rn(a, b);
}
__device__ __forceinline__ float div_rn(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ double div_rn(double a, double b) {
  return __ddiv_rn(a, b);
}

// f(T{}) with T the device type of `dtype`, on the device (rank-0 operands of any dtype).
template <class F>
__device__ __forceinline__ double visit_scalar(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f64:
      return f(double{});
    case DType::f32:
      return f(float{});
    case DType::f16:
      return f(__half{});
    case DType::bf16:
      return f(__nv_bfloat16{});
    case DType::i64:
      return f(int64_t{});
    case DType::i32:
      return f(int32_t{});
    case DType::boolean:
      return f(bool{});
  }
  return 0.0;
}

// A rank-0 input (lr, step, grad_scale, ...) of any dtype, read as f64.
struct ScalarInput {
  const void* data;
  DType dtype;

  __device__ __forceinline__ double load() const {
    return visit_scalar(
        dtype, [&](auto tag) { return convert<double>(*static_cast<const decltype(tag)*>(data)); });
  }
};

// Input i of `in` as a ScalarInput; data nullptr when it is absent.
ScalarInput optional_scalar(Inputs in, size_t i) {
  if (i >= in.size() || in[i] == nullptr) return {nullptr, DType::f32};
  return {in[i]->data(), in[i]->dtype};
}

// A rank-0 output of any dtype, written from an f64 value by the conversion rule.
struct ScalarOutput {
  void* data;
  DType dtype;

  // Stores v in the dtype; returns the value stored.
  __device__ __forceinline__ double store(double v) const {
    return visit_scalar(dtype, [&](auto tag) {
      using T = decltype(tag);
      const T t = convert<T>(v);
      *static_cast<T*>(data) = t;
      return convert<double>(t);
    });
  }
};

// The optional trailing inputs of an update (ops.h): grad_scale and skip; and the halt word
// of a compiled training step (runtime/error_flags.h: a bad label was found), which skips
// like `skip`.
struct UpdateScalars {
  ScalarInput grad_scale, skip;
  const int32_t* halt;

  __device__ __forceinline__ bool skipped() const {
    return halted(halt) || (skip.data != nullptr && skip.load() != 0.0);  // NaN skips too
  }
};

// The halt word an update obeys (null outside a training step's recording), declared read.
const int32_t* halt_read_by(Context& ctx, BufferList& reads) {
  const ErrorFlags& flags = ErrorFlags::of(ctx.encoder);
  if (flags.halt()) reads.push_back(*flags.halt());
  return flags.halt_word();
}

// grad as an update reads it: times grad_scale (rounded) when there is one.
template <class C>
struct Unscale {
  C factor;
  bool scaled;

  __device__ __forceinline__ C operator()(C grad) const {
    return scaled ? mul_rn(grad, factor) : grad;
  }
};

template <class C>
__device__ __forceinline__ Unscale<C> unscale_of(const UpdateScalars& u) {
  const bool scaled = u.grad_scale.data != nullptr;
  return {scaled ? C(u.grad_scale.load()) : C(1), scaled};
}

// The low copy of W new params (L's rounding to nearest even, as the cast kernel's).
template <class L, int W, class T>
__device__ __forceinline__ void store_low(L* low, int64_t i, const Pack<T, W>& p) {
  Pack<L, W> l;
#pragma unroll
  for (int j = 0; j < W; ++j) l.v[j] = convert<L>(convert<float>(p.v[j]));
  store_pack<W>(low, i, l);
}

// ---- sgd -------------------------------------------------------------------------------

template <class C>
struct SgdArgs {
  C momentum, keep, decay;  // keep = 1 - dampening
  bool use_momentum, nesterov;
};

// One element: (param, grad, buf) -> (new_param, new_buf).
template <class T, class G>
__device__ __forceinline__ void sgd_element(const SgdArgs<compute_t<T>>& a, compute_t<T> rate,
                                            const Unscale<compute_t<T>>& unscale, bool skip,
                                            T param, G grad, T buf, T& new_param, T& new_buf) {
  using C = compute_t<T>;
  if (skip) {
    new_param = param;
    new_buf = buf;
    return;
  }
  const C p = convert<C>(param);
  C g = add_rn(unscale(convert<C>(grad)), mul_rn(a.decay, p));
  const C b = add_rn(mul_rn(a.momentum, convert<C>(buf)), mul_rn(a.keep, g));
  if (a.use_momentum) g = a.nesterov ? add_rn(g, mul_rn(a.momentum, b)) : b;
  new_param = convert<T>(sub_rn(p, mul_rn(rate, g)));
  new_buf = convert<T>(b);
}

// One tensor's operands. G: grad's type; L: the low copy's (low null: none).
template <class T, class G, class L>
struct SgdTensor {
  const T* param;
  const G* grad;
  const T* buf;
  T* new_param;
  T* new_buf;
  L* low;
  int64_t n;
};

// One tensor's update by the threads `first`, first + stride, ...: W elements per step (16-byte
// vectors) when W > 1, then the scalar tail.
template <int W, class T, class G, class L>
__device__ __forceinline__ void sgd_tensor(const SgdTensor<T, G, L>& t, int64_t first,
                                           int64_t stride, const SgdArgs<compute_t<T>>& a,
                                           compute_t<T> rate, const Unscale<compute_t<T>>& unscale,
                                           bool skip) {
  const int64_t packs = W > 1 ? t.n / W : 0;
  for (int64_t v = first; v < packs; v += stride) {
    const Pack<T, W> p = load_pack<W>(t.param, v), b = load_pack<W>(t.buf, v);
    const Pack<G, W> g = load_pack<W>(t.grad, v);
    Pack<T, W> np, nb;
#pragma unroll
    for (int j = 0; j < W; ++j)
      sgd_element(a, rate, unscale, skip, p.v[j], g.v[j], b.v[j], np.v[j], nb.v[j]);
    store_pack<W>(t.new_param, v, np);
    store_pack<W>(t.new_buf, v, nb);
    if (t.low != nullptr) store_low<L>(t.low, v, np);
  }
  for (int64_t i = packs * W + first; i < t.n; i += stride) {
    sgd_element(a, rate, unscale, skip, t.param[i], t.grad[i], t.buf[i], t.new_param[i],
                t.new_buf[i]);
    if (t.low != nullptr) t.low[i] = convert<L>(convert<float>(t.new_param[i]));
  }
}

template <class T, class G, class L, int W>
__global__ void sgd_kernel(SgdTensor<T, G, L> t, ScalarInput lr, UpdateScalars u,
                           SgdArgs<compute_t<T>> a) {
  using C = compute_t<T>;
  sgd_tensor<W>(t, global_thread_index(), grid_stride(), a, C(lr.load()), unscale_of<C>(u),
                u.skipped());
}

// ---- adamw -----------------------------------------------------------------------------

template <class C>
struct AdamWArgs {
  C beta1, beta2, eps, one_minus_beta1, one_minus_beta2;
  double beta1_f64, beta2_f64, weight_decay;
  ErrorRecord* error;
};

// The per-step scalars, in f64 as the CPU computes them on the host.
template <class C>
struct AdamWStep {
  C decay, size, correction2_sqrt;
};

template <class C>
__device__ __forceinline__ AdamWStep<C> adamw_step(const AdamWArgs<C>& a, ScalarInput lr_in,
                                                   ScalarInput step_in) {
  const double lr = lr_in.load(), step = step_in.load();
  if (!(step >= 1.0) && global_thread_index() == 0) raise_error(a.error, 0, int64_t(step));
  return {C(1.0 - lr * a.weight_decay), C(lr / (1.0 - ::pow(a.beta1_f64, step))),
          C(::sqrt(1.0 - ::pow(a.beta2_f64, step)))};
}

template <class T, class G>
__device__ __forceinline__ void adamw_element(const AdamWArgs<compute_t<T>>& a,
                                              const AdamWStep<compute_t<T>>& s,
                                              const Unscale<compute_t<T>>& unscale, bool skip,
                                              T param, G grad, T m_in, T v_in, T& new_param,
                                              T& m_out, T& v_out) {
  using C = compute_t<T>;
  if (skip) {
    new_param = param;
    m_out = m_in;
    v_out = v_in;
    return;
  }
  const C g = unscale(convert<C>(grad));
  const C m = add_rn(mul_rn(a.beta1, convert<C>(m_in)), mul_rn(a.one_minus_beta1, g));
  const C v = add_rn(mul_rn(a.beta2, convert<C>(v_in)), mul_rn(mul_rn(a.one_minus_beta2, g), g));
  const C p = mul_rn(convert<C>(param), s.decay);
  const C denominator = add_rn(div_rn(dm::sqrt(v), s.correction2_sqrt), a.eps);
  new_param = convert<T>(sub_rn(p, div_rn(mul_rn(s.size, m), denominator)));
  m_out = convert<T>(m);
  v_out = convert<T>(v);
}

template <class T, class G, class L>
struct AdamWTensor {
  const T* param;
  const G* grad;
  const T* m;
  const T* v;
  T* new_param;
  T* new_m;
  T* new_v;
  L* low;
  int64_t n;
};

// As sgd_tensor.
template <int W, class T, class G, class L>
__device__ __forceinline__ void adamw_tensor(const AdamWTensor<T, G, L>& t, int64_t first,
                                             int64_t stride, const AdamWArgs<compute_t<T>>& a,
                                             const AdamWStep<compute_t<T>>& s,
                                             const Unscale<compute_t<T>>& unscale, bool skip) {
  const int64_t packs = W > 1 ? t.n / W : 0;
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<T, W> p = load_pack<W>(t.param, i), mv = load_pack<W>(t.m, i),
                     vv = load_pack<W>(t.v, i);
    const Pack<G, W> g = load_pack<W>(t.grad, i);
    Pack<T, W> np, nm, nv;
#pragma unroll
    for (int j = 0; j < W; ++j)
      adamw_element(a, s, unscale, skip, p.v[j], g.v[j], mv.v[j], vv.v[j], np.v[j], nm.v[j],
                    nv.v[j]);
    store_pack<W>(t.new_param, i, np);
    store_pack<W>(t.new_m, i, nm);
    store_pack<W>(t.new_v, i, nv);
    if (t.low != nullptr) store_low<L>(t.low, i, np);
  }
  for (int64_t i = packs * W + first; i < t.n; i += stride) {
    adamw_element(a, s, unscale, skip, t.param[i], t.grad[i], t.m[i], t.v[i], t.new_param[i],
                  t.new_m[i], t.new_v[i]);
    if (t.low != nullptr) t.low[i] = convert<L>(convert<float>(t.new_param[i]));
  }
}

template <class T, class G, class L, int W>
__global__ void adamw_kernel(AdamWTensor<T, G, L> t, ScalarInput lr, ScalarInput step,
                             UpdateScalars u, AdamWArgs<compute_t<T>> a) {
  adamw_tensor<W>(t, global_thread_index(), grid_stride(), a, adamw_step(a, lr, step),
                  unscale_of<compute_t<T>>(u), u.skipped());
}

// ---- multi-tensor launches -------------------------------------------------------------

constexpr int kMultiTensorBatch = 192;  // tensors per launch (kernel parameters: < 16 KB)
constexpr int64_t kPacksPerThread = 16;

// A launch's tensors and each one's first block (ascending; blocks past the last tensor's
// first belong to it).
template <class Tensor>
struct TensorBatch {
  Tensor t[kMultiTensorBatch];
  int32_t first_block[kMultiTensorBatch];
  int count;
};

// This block's tensor, and the thread's place among that tensor's threads.
template <class Tensor>
__device__ __forceinline__ int tensor_of_block(const TensorBatch<Tensor>& b, int64_t& first,
                                               int64_t& stride) {
  int lo = 0, hi = b.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.first_block[mid] <= int32_t(blockIdx.x))
      lo = mid;
    else
      hi = mid - 1;
  }
  const int32_t end = lo + 1 < b.count ? b.first_block[lo + 1] : int32_t(gridDim.x);
  first = int64_t(blockIdx.x - uint32_t(b.first_block[lo])) * blockDim.x + threadIdx.x;
  stride = int64_t(end - b.first_block[lo]) * blockDim.x;
  return lo;
}

template <class T, class G, class L>
__global__ void sgd_multi_kernel(TensorBatch<SgdTensor<T, G, L>> b, ScalarInput lr, UpdateScalars u,
                                 SgdArgs<compute_t<T>> a) {
  using C = compute_t<T>;
  int64_t first = 0, stride = 0;
  const int t = tensor_of_block(b, first, stride);
  sgd_tensor<kVecWidth<T>>(b.t[t], first, stride, a, C(lr.load()), unscale_of<C>(u), u.skipped());
}

template <class T, class G, class L>
__global__ void adamw_multi_kernel(TensorBatch<AdamWTensor<T, G, L>> b, ScalarInput lr,
                                   ScalarInput step, UpdateScalars u, AdamWArgs<compute_t<T>> a) {
  int64_t first = 0, stride = 0;
  const int t = tensor_of_block(b, first, stride);
  adamw_tensor<kVecWidth<T>>(b.t[t], first, stride, a, adamw_step(a, lr, step),
                             unscale_of<compute_t<T>>(u), u.skipped());
}

// ---- f16 loss scaling ------------------------------------------------------------------

// Inputs per nonfinite_any launch (a kernel parameter of about 1 KB).
constexpr int kNonfiniteBatch = 32;

// Dense inputs as raw elements: a non-finite element has every bit of `mask` (its
// format's exponent field) set.
struct NonfiniteBatch {
  const void* data[kNonfiniteBatch];
  int64_t count[kNonfiniteBatch];
  uint64_t mask[kNonfiniteBatch];
  int bytes[kNonfiniteBatch];  // 2, 4 or 8
};

__device__ __forceinline__ uint64_t element_bits(const void* data, int bytes, int64_t i) {
  switch (bytes) {
    case 8:
      return static_cast<const uint64_t*>(data)[i];
    case 4:
      return static_cast<const uint32_t*>(data)[i];
    default:
      return static_cast<const uint16_t*>(data)[i];
  }
}

// Input blockIdx.y of the batch; sets *found to 1 when some element is not finite.
__global__ void nonfinite_kernel(NonfiniteBatch batch, float* found) {
  const int t = int(blockIdx.y);
  const void* data = batch.data[t];
  const uint64_t mask = batch.mask[t];
  const int bytes = batch.bytes[t];
  bool any = false;
  for (int64_t i = global_thread_index(); i < batch.count[t] && !any; i += grid_stride())
    any = (element_bits(data, bytes, i) & mask) == mask;
  if (__syncthreads_or(any) && threadIdx.x == 0) atomicExch(found, 1.0f);
}

// The exponent field of a float dtype.
uint64_t exponent_mask(const Node& n, DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 0x7ff0000000000000ull;
    case DType::f32:
      return 0x7f800000u;
    case DType::f16:
      return 0x7c00u;
    case DType::bf16:
      return 0x7f80u;
    case DType::i64:
    case DType::i32:
    case DType::boolean:
      break;
  }
  throw Error(node_label(n), cat("nonfinite_any takes float inputs, got ", dtype_name(dtype)));
}

__global__ void loss_scale_kernel(ScalarInput scale, ScalarInput tracker, ScalarInput found,
                                  ScalarInput skipped, ScalarOutput new_scale,
                                  ScalarOutput new_tracker, ScalarOutput new_skipped,
                                  LossScaleAttrs a, const int32_t* halt) {
  // Every input is read before any output is written: they may be the same bytes.
  const double s = scale.load();
  const bool counts = skipped.data != nullptr;
  if (halted(halt)) {  // a bad label (error_flags.h): the state stays as it is
    const double t = tracker.load(), k = counts ? skipped.load() : 0.0;
    new_scale.store(s);
    new_tracker.store(t);
    if (counts) new_skipped.store(k);
    return;
  }
  const LossScaleStep next = loss_scale_step(found.load() != 0.0, int64_t(tracker.load()),
                                             counts ? int64_t(skipped.load()) : 0, a.growth_factor,
                                             a.backoff_factor, a.growth_interval);
  const double grown = new_scale.store(s * next.factor);
  if (!(grown - grown == 0.0)) new_scale.store(s);  // not finite: inf - inf and NaN are NaN
  new_tracker.store(double(next.growth_tracker));
  if (counts) new_skipped.store(double(next.skipped));
}

// ---- host ------------------------------------------------------------------------------

// The input slot of an update's low copy (ops.h low_param): after the states, the scalars,
// grad_scale and skip.
size_t low_slot(size_t states, size_t scalars) {
  return states + scalars + 2;
}

// Whether the update has a low copy (input present, output last).
bool has_low_copy(Inputs in, size_t states, size_t scalars) {
  const size_t low = low_slot(states, scalars);
  return in.size() > low && in[low] != nullptr;
}

// The first `states` inputs and the first states - 1 outputs share param's type (grad its shape:
// its dtype may be a low one beside an f32 param), contiguous; the scalars (and the optional
// grad_scale and skip after them) are rank 0; low_param and its output last.
void check_update(const Node& n, Inputs in, size_t states, size_t scalars, Outputs out) {
  const bool low = has_low_copy(in, states, scalars);
  FUSEBOX_CHECK(in.size() >= states + scalars && in.size() <= low_slot(states, scalars) + 1 &&
                    out.size() == states - 1 + (low ? 1 : 0),
                node_label(n), "expects ", states, " tensors and ", scalars,
                " scalars (then grad_scale?, skip? and low_param?) in, ", states - 1,
                " out (and new_low_param)");
  const DeviceTensor& param = *in[0];
  for (size_t i = 0; i < states; ++i) {
    const bool grad_low = i == 1 && param.dtype == DType::f32 && is_low_float(in[i]->dtype);
    FUSEBOX_CHECK((in[i]->dtype == param.dtype || grad_low) && in[i]->shape == param.shape &&
                      in[i]->is_contiguous(),
                  node_label(n), "input ", i, " ", shape_str(in[i]->shape),
                  " does not match param ", shape_str(param.shape));
  }
  for (size_t o = 0; o < out.size(); ++o) {
    const DeviceTensor& t = out[o];
    const bool copy = o + 1 == states;
    FUSEBOX_CHECK(
        (copy ? param.dtype == DType::f32 && is_low_float(t.dtype) : t.dtype == param.dtype) &&
            t.shape == param.shape && t.is_contiguous(),
        node_label(n), "output ", shape_str(t.shape), " does not match param ",
        shape_str(param.shape));
  }
  for (size_t i = states; i < std::min(in.size(), low_slot(states, scalars)); ++i) {
    FUSEBOX_CHECK(in[i] == nullptr || in[i]->numel() == 1, node_label(n), op_info(n.op).roles[i],
                  " must be a scalar but is ", shape_str(in[i]->shape));
  }
}

// f(T{}, G{}, L{}): the param's, grad's and low copy's device types (L is bf16, unused, when
// there is no copy). Low gradients and copies only beside an f32 param (check_update).
template <class F>
void visit_update_types(const Node& n, DType param, DType grad, std::optional<DType> low, F&& f) {
  visit_device_float(n, param, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      auto with_low = [&](auto g) {
        if (low == DType::f16)
          f(T{}, g, __half{});
        else
          f(T{}, g, __nv_bfloat16{});
      };
      if (grad == DType::bf16)
        with_low(__nv_bfloat16{});
      else if (grad == DType::f16)
        with_low(__half{});
      else
        with_low(float{});
    } else {
      f(T{}, T{}, __nv_bfloat16{});
    }
  });
}

// True when every pointer allows 16-byte vector access.
bool all_aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (!is_aligned(p, kVecBytes)) return false;
  return true;
}

// The byte ranges of the inputs present; of the outputs.
BufferList ranges_of(Inputs in) {
  BufferList ranges;
  for (const DeviceTensor* t : in)
    if (t != nullptr) ranges.push_back(t->range());
  return ranges;
}
BufferList ranges_of(Outputs out) {
  BufferList ranges;
  for (const DeviceTensor& t : out) ranges.push_back(t.range());
  return ranges;
}

template <class C>
SgdArgs<C> sgd_args(const SgdAttrs& attrs) {
  return {C(attrs.momentum), C(1.0 - attrs.dampening), C(attrs.weight_decay), attrs.momentum != 0.0,
          attrs.nesterov};
}

template <class C>
AdamWArgs<C> adamw_args(const AdamWAttrs& attrs, ErrorRecord* error) {
  return {C(attrs.beta1),       C(attrs.beta2),       C(attrs.epsilon),
          C(1.0 - attrs.beta1), C(1.0 - attrs.beta2), attrs.beta1,
          attrs.beta2,          attrs.weight_decay,   error};
}

// One node's tensors (check_update has checked them).
template <class T, class G, class L>
SgdTensor<T, G, L> sgd_tensor_of(Inputs in, Outputs out, bool has_low) {
  return {in[0]->as<T>(), in[1]->as<G>(), in[2]->as<T>(),
          out[0].as<T>(), out[1].as<T>(), has_low ? out[2].as<L>() : nullptr,
          in[0]->numel()};
}
template <class T, class G, class L>
AdamWTensor<T, G, L> adamw_tensor_of(Inputs in, Outputs out, bool has_low) {
  return {in[0]->as<T>(), in[1]->as<G>(), in[2]->as<T>(), in[3]->as<T>(),
          out[0].as<T>(), out[1].as<T>(), out[2].as<T>(), has_low ? out[3].as<L>() : nullptr,
          in[0]->numel()};
}

// True when every pointer of the tensor allows 16-byte vector access.
template <class T, class G, class L>
bool aligned(const SgdTensor<T, G, L>& t) {
  return all_aligned({t.param, t.grad, t.buf, t.new_param, t.new_buf, t.low});
}
template <class T, class G, class L>
bool aligned(const AdamWTensor<T, G, L>& t) {
  return all_aligned({t.param, t.grad, t.m, t.v, t.new_param, t.new_m, t.new_v, t.low});
}

}  // namespace

// (param, grad, momentum_buf, lr, grad_scale?, skip?, low_param?) -> (new_param,
// new_momentum_buf, new_low_param?)
void sgd_update(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<SgdAttrs>(n.attrs);
  check_update(n, in, 3, 1, out);
  const int64_t count = in[0]->numel();
  if (count == 0) return;
  const bool has_low = has_low_copy(in, 3, 1);
  const std::optional<DType> low_dtype = has_low ? std::optional(out[2].dtype) : std::nullopt;
  visit_update_types(n, in[0]->dtype, in[1]->dtype, low_dtype, [&](auto tag, auto gtag, auto ltag) {
    using T = decltype(tag);
    using G = decltype(gtag);
    using L = decltype(ltag);
    using C = compute_t<T>;
    const SgdArgs<C> a = sgd_args<C>(attrs);
    const SgdTensor<T, G, L> t = sgd_tensor_of<T, G, L>(in, out, has_low);
    const ScalarInput lr{in[3]->data(), in[3]->dtype};
    BufferList reads = ranges_of(in);
    const UpdateScalars u{optional_scalar(in, 4), optional_scalar(in, 5), halt_read_by(ctx, reads)};
    BufferList writes = ranges_of(out);
    constexpr int W = kVecWidth<T>;
    if (aligned(t))
      ctx.encoder.launch(sgd_kernel<T, G, L, W>, launch_blocks(count / W + 1), kDefaultThreads, 0,
                         reads, writes, t, lr, u, a);
    else
      ctx.encoder.launch(sgd_kernel<T, G, L, 1>, launch_blocks(count), kDefaultThreads, 0, reads,
                         writes, t, lr, u, a);
  });
}

// (param, grad, m, v, lr, step, grad_scale?, skip?, low_param?) -> (new_param, new_m, new_v,
// new_low_param?)
void adamw_update(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<AdamWAttrs>(n.attrs);
  check_update(n, in, 4, 2, out);
  const int64_t count = in[0]->numel();
  if (count == 0) return;
  const ErrorSlot slot = ErrorFlags::of(ctx.encoder).reserve(node_label(n), [](int64_t, int64_t s) {
    return cat("step ", s, " must be >= 1 (it counts from 1)");
  });
  const bool has_low = has_low_copy(in, 4, 2);
  const std::optional<DType> low_dtype = has_low ? std::optional(out[3].dtype) : std::nullopt;
  visit_update_types(n, in[0]->dtype, in[1]->dtype, low_dtype, [&](auto tag, auto gtag, auto ltag) {
    using T = decltype(tag);
    using G = decltype(gtag);
    using L = decltype(ltag);
    using C = compute_t<T>;
    const AdamWArgs<C> a = adamw_args<C>(attrs, slot.record);
    const AdamWTensor<T, G, L> t = adamw_tensor_of<T, G, L>(in, out, has_low);
    const ScalarInput lr{in[4]->data(), in[4]->dtype}, step{in[5]->data(), in[5]->dtype};
    BufferList reads = ranges_of(in);
    const UpdateScalars u{optional_scalar(in, 6), optional_scalar(in, 7), halt_read_by(ctx, reads)};
    BufferList writes = ranges_of(out);
    writes.push_back(slot.range);
    constexpr int W = kVecWidth<T>;
    if (aligned(t))
      ctx.encoder.launch(adamw_kernel<T, G, L, W>, launch_blocks(count / W + 1), kDefaultThreads, 0,
                         reads, writes, t, lr, step, u, a);
    else
      ctx.encoder.launch(adamw_kernel<T, G, L, 1>, launch_blocks(count), kDefaultThreads, 0, reads,
                         writes, t, lr, step, u, a);
  });
}

namespace {

// Whether update b shares what a multi-tensor launch shares with update a: op, attributes, the
// scalar inputs (lr, step, grad_scale, skip: the same bytes) and the dtypes of param, grad and
// the low copy.
bool same_group(const NodeOperands& a, const NodeOperands& b, size_t states, size_t scalars) {
  if (a.node->op != b.node->op || a.in.size() != b.in.size() || a.out.size() != b.out.size())
    return false;
  if (a.node->op == OpKind::sgd_update) {
    const auto &x = std::get<SgdAttrs>(a.node->attrs), &y = std::get<SgdAttrs>(b.node->attrs);
    if (x.momentum != y.momentum || x.dampening != y.dampening ||
        x.weight_decay != y.weight_decay || x.nesterov != y.nesterov)
      return false;
  } else {
    const auto &x = std::get<AdamWAttrs>(a.node->attrs), &y = std::get<AdamWAttrs>(b.node->attrs);
    if (x.beta1 != y.beta1 || x.beta2 != y.beta2 || x.epsilon != y.epsilon ||
        x.weight_decay != y.weight_decay)
      return false;
  }
  for (size_t i = states; i < std::min(a.in.size(), low_slot(states, scalars)); ++i) {
    const DeviceTensor *p = a.in[i], *q = b.in[i];
    if ((p == nullptr) != (q == nullptr) ||
        (p != nullptr && (p->data() != q->data() || p->dtype != q->dtype)))
      return false;
  }
  if (a.in[0]->dtype != b.in[0]->dtype || a.in[1]->dtype != b.in[1]->dtype) return false;
  const bool low = has_low_copy(a.in, states, scalars);
  return low == has_low_copy(b.in, states, scalars) &&
         (!low || a.out.back().dtype == b.out.back().dtype);
}

// A node's operands with its param-shaped tensors as flat vectors of its elements.
struct FlatOperands {
  std::vector<DeviceTensor> in_tensors;
  std::vector<const DeviceTensor*> in;
  std::vector<DeviceTensor> out;
};

// x's operands flattened, where every param-shaped tensor lies as param does (dense: contiguous
// or channels-last, param's strides): an update is elementwise, so element i of each flat
// vector is the same parameter element (what run_node's channels-last path makes of it by
// permuting). False where they do not.
bool flatten(const NodeOperands& x, FlatOperands& f) {
  const DeviceTensor& param = *x.in[0];
  if (!param.is_contiguous() && !param.is_channels_last()) return false;
  auto flat = [&](const DeviceTensor& t) {
    DeviceTensor v = t;
    v.shape = {t.numel()};
    v.strides = {1};
    return v;
  };
  auto alike = [&](const DeviceTensor& t) {
    return t.shape == param.shape && t.strides == param.strides;
  };
  f.in_tensors.reserve(x.in.size());
  for (const DeviceTensor* t : x.in) {
    if (t == nullptr) {
      f.in.push_back(nullptr);
      continue;
    }
    if (t->rank() > 0 && !alike(*t)) return false;
    f.in_tensors.push_back(t->rank() > 0 ? flat(*t) : *t);
    f.in.push_back(&f.in_tensors.back());
  }
  for (const DeviceTensor& t : x.out) {
    if (!alike(t)) return false;
    f.out.push_back(flat(t));
  }
  return true;
}

// Calls launch(batch, blocks, first node) for each kMultiTensorBatch of `tensors` (W elements
// per vector): every tensor at least one block, kPacksPerThread vectors per thread.
template <class Tensor, class Launch>
void launch_batches(const std::vector<Tensor>& tensors, int W, Launch&& launch) {
  for (size_t begin = 0; begin < tensors.size(); begin += kMultiTensorBatch) {
    TensorBatch<Tensor> b{};
    b.count = int(std::min<size_t>(kMultiTensorBatch, tensors.size() - begin));
    int64_t blocks = 0;
    for (int k = 0; k < b.count; ++k) {
      b.t[k] = tensors[begin + size_t(k)];
      b.first_block[k] = int32_t(blocks);
      const int64_t packs = (b.t[k].n + W - 1) / W, per_block = kDefaultThreads * kPacksPerThread;
      blocks += std::max<int64_t>(1, (packs + per_block - 1) / per_block);
    }
    launch(b, unsigned(blocks), begin);
  }
}

}  // namespace

bool record_update_group(Context& ctx, std::span<const NodeOperands> given) {
  if (given.size() < 2) return false;
  const Node& first = *given[0].node;
  const bool sgd = first.op == OpKind::sgd_update;
  if (!sgd && first.op != OpKind::adamw_update) return false;
  const size_t states = sgd ? 3 : 4, scalars = sgd ? 1 : 2;
  std::vector<FlatOperands> flats(given.size());
  std::vector<NodeOperands> nodes;
  for (size_t k = 0; k < given.size(); ++k) {
    const NodeOperands& x = given[k];
    if (x.in.empty() || x.in[0] == nullptr || x.in[0]->numel() == 0 || !flatten(x, flats[k]))
      return false;
    nodes.push_back({x.node, flats[k].in, flats[k].out});
    check_update(*x.node, nodes.back().in, states, scalars, nodes.back().out);
    if (!same_group(nodes[0], nodes.back(), states, scalars)) return false;
  }
  Inputs in0 = nodes[0].in;
  const bool has_low = has_low_copy(in0, states, scalars);
  const std::optional<DType> low_dtype =
      has_low ? std::optional(nodes[0].out.back().dtype) : std::nullopt;
  // What a batch of nodes [begin, begin + count) reads and writes.
  auto ranges = [&](size_t begin, int count, BufferList& reads, BufferList& writes) {
    for (size_t k = begin; k < begin + size_t(count); ++k) {
      const BufferList r = ranges_of(nodes[k].in), w = ranges_of(nodes[k].out);
      reads.insert(reads.end(), r.begin(), r.end());
      writes.insert(writes.end(), w.begin(), w.end());
    }
  };
  bool recorded = false;
  visit_update_types(
      first, in0[0]->dtype, in0[1]->dtype, low_dtype, [&](auto tag, auto gtag, auto ltag) {
        using T = decltype(tag);
        using G = decltype(gtag);
        using L = decltype(ltag);
        using C = compute_t<T>;
        constexpr int W = kVecWidth<T>;
        if (sgd) {
          std::vector<SgdTensor<T, G, L>> tensors;
          for (const NodeOperands& x : nodes) {
            tensors.push_back(sgd_tensor_of<T, G, L>(x.in, x.out, has_low));
            if (!aligned(tensors.back())) return;
          }
          const SgdArgs<C> a = sgd_args<C>(std::get<SgdAttrs>(first.attrs));
          const ScalarInput lr{in0[3]->data(), in0[3]->dtype};
          launch_batches(
              tensors, W,
              [&](const TensorBatch<SgdTensor<T, G, L>>& b, unsigned blocks, size_t begin) {
                BufferList reads, writes;
                ranges(begin, b.count, reads, writes);
                const UpdateScalars u{optional_scalar(in0, 4), optional_scalar(in0, 5),
                                      halt_read_by(ctx, reads)};
                ctx.encoder.launch(sgd_multi_kernel<T, G, L>, blocks, kDefaultThreads, 0, reads,
                                   writes, b, lr, u, a);
              });
        } else {
          std::vector<AdamWTensor<T, G, L>> tensors;
          for (const NodeOperands& x : nodes) {
            tensors.push_back(adamw_tensor_of<T, G, L>(x.in, x.out, has_low));
            if (!aligned(tensors.back())) return;
          }
          const ErrorSlot slot =
              ErrorFlags::of(ctx.encoder)
                  .reserve(
                      cat(node_label(first), " (and the ", nodes.size() - 1, " updates after it)"),
                      [](int64_t, int64_t s) {
                        return cat("step ", s, " must be >= 1 (it counts from 1)");
                      });
          const AdamWArgs<C> a = adamw_args<C>(std::get<AdamWAttrs>(first.attrs), slot.record);
          const ScalarInput lr{in0[4]->data(), in0[4]->dtype}, step{in0[5]->data(), in0[5]->dtype};
          launch_batches(
              tensors, W,
              [&](const TensorBatch<AdamWTensor<T, G, L>>& b, unsigned blocks, size_t begin) {
                BufferList reads, writes;
                ranges(begin, b.count, reads, writes);
                writes.push_back(slot.range);
                const UpdateScalars u{optional_scalar(in0, 6), optional_scalar(in0, 7),
                                      halt_read_by(ctx, reads)};
                ctx.encoder.launch(adamw_multi_kernel<T, G, L>, blocks, kDefaultThreads, 0, reads,
                                   writes, b, lr, step, u, a);
              });
        }
        recorded = true;
      });
  return recorded;
}

// (x1, ..., xn) -> f32 []: 1 when some element is an infinity or a NaN, else 0.
void nonfinite_any(Context& ctx, const Node& n, Inputs in, Outputs out) {
  FUSEBOX_CHECK(out.size() == 1 && out[0].dtype == DType::f32 && out[0].numel() == 1, node_label(n),
                "expects one f32 scalar output");
  float* found = out[0].as<float>();
  const BufferList writes{out[0].range()};
  ctx.encoder.memset(out[0].range(), 0);  // 0.0f
  std::vector<DeviceTensor> dense;        // the inputs, as given or copied (kept alive below)
  dense.reserve(in.size());
  for (const DeviceTensor* t : in) {
    if (t->is_contiguous() || t->is_channels_last()) {
      dense.push_back(*t);
    } else {
      dense.push_back(temporary_tensor(ctx, t->dtype, t->shape));
      copy_strided(ctx, *t, dense.back());
    }
  }
  for (size_t first = 0; first < dense.size(); first += kNonfiniteBatch) {
    const size_t size = std::min<size_t>(kNonfiniteBatch, dense.size() - first);
    NonfiniteBatch batch{};
    BufferList reads;
    int64_t largest = 0;
    for (size_t k = 0; k < size; ++k) {
      const DeviceTensor& t = dense[first + k];
      batch.data[k] = t.data();
      batch.count[k] = t.numel();
      batch.mask[k] = exponent_mask(n, t.dtype);
      batch.bytes[k] = int(dtype_size(t.dtype));
      largest = std::max(largest, t.numel());
      if (t.numel() > 0) reads.push_back(t.range());
    }
    // At most about kMaxGridStrideBlocks blocks in all: the grid-stride loops take the rest.
    const unsigned per_input =
        std::min(launch_blocks(largest),
                 unsigned(std::max<int64_t>(1, kMaxGridStrideBlocks / int64_t(size))));
    ctx.encoder.launch(nonfinite_kernel, dim3(per_input, unsigned(size)), kDefaultThreads, 0, reads,
                       writes, batch, found);
  }
}

// (scale, growth_tracker, found_inf, skipped?) -> (new_scale, new_growth_tracker,
// new_skipped?)
void loss_scale_update(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const bool counts = in.size() > 3 && in[3] != nullptr;
  FUSEBOX_CHECK(out.size() == (counts ? 3u : 2u), node_label(n), "expects ", counts ? 3 : 2,
                " outputs, got ", out.size());
  for (size_t i = 0; i < in.size(); ++i)
    FUSEBOX_CHECK(in[i] == nullptr || in[i]->numel() == 1, node_label(n), op_info(n.op).roles[i],
                  " must be a scalar but is ", shape_str(in[i]->shape));
  auto output = [&](size_t i) {
    return i < out.size() ? ScalarOutput{out[i].data(), out[i].dtype}
                          : ScalarOutput{nullptr, DType::i64};
  };
  BufferList reads = ranges_of(in), writes;
  for (const DeviceTensor& t : out) writes.push_back(t.range());
  const int32_t* halt = halt_read_by(ctx, reads);
  ctx.encoder.launch(loss_scale_kernel, 1, 1, 0, reads, writes, optional_scalar(in, 0),
                     optional_scalar(in, 1), optional_scalar(in, 2), optional_scalar(in, 3),
                     output(0), output(1), output(2), std::get<LossScaleAttrs>(n.attrs), halt);
}

}  // namespace fusebox::cuda
