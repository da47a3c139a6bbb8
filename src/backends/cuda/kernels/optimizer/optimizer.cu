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
//
// 16-byte vectors when every pointer is aligned (one load per operand per W elements), a
// scalar tail; grid-stride loops.
#include "backends/cuda/kernels/common/elementwise.cuh"
#include "backends/cuda/runtime/error_flags.h"

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

// A rank-0 input (lr, step) of any dtype, read as f64.
struct ScalarInput {
  const void* data;
  DType dtype;

  __device__ __forceinline__ double load() const {
    switch (dtype) {
      case DType::f64:
        return *static_cast<const double*>(data);
      case DType::f32:
        return double(*static_cast<const float*>(data));
      case DType::f16:
        return double(__half2float(*static_cast<const __half*>(data)));
      case DType::bf16:
        return double(__bfloat162float(*static_cast<const __nv_bfloat16*>(data)));
      case DType::i64:
        return double(*static_cast<const int64_t*>(data));
      case DType::i32:
        return double(*static_cast<const int32_t*>(data));
      case DType::boolean:
        return *static_cast<const bool*>(data) ? 1.0 : 0.0;
    }
    return 0.0;
  }
};

// ---- sgd -------------------------------------------------------------------------------

template <class C>
struct SgdArgs {
  C momentum, keep, decay;  // keep = 1 - dampening
  bool use_momentum, nesterov;
};

// One element: (param, grad, buf) -> (new_param, new_buf).
template <class T>
__device__ __forceinline__ void sgd_element(const SgdArgs<compute_t<T>>& a, compute_t<T> rate,
                                            T param, T grad, T buf, T& new_param, T& new_buf) {
  using C = compute_t<T>;
  const C p = convert<C>(param);
  C g = add_rn(convert<C>(grad), mul_rn(a.decay, p));
  const C b = add_rn(mul_rn(a.momentum, convert<C>(buf)), mul_rn(a.keep, g));
  if (a.use_momentum) g = a.nesterov ? add_rn(g, mul_rn(a.momentum, b)) : b;
  new_param = convert<T>(sub_rn(p, mul_rn(rate, g)));
  new_buf = convert<T>(b);
}

// W elements per step (16-byte vectors) when W > 1, then the scalar tail.
template <class T, int W>
__global__ void sgd_kernel(const T* param, const T* grad, const T* buf, ScalarInput lr,
                           T* new_param, T* new_buf, int64_t n, SgdArgs<compute_t<T>> a) {
  using C = compute_t<T>;
  const C rate = C(lr.load());
  const int64_t packs = W > 1 ? n / W : 0;
  for (int64_t v = global_thread_index(); v < packs; v += grid_stride()) {
    const Vec<T> p = load_vec(param, v), g = load_vec(grad, v), b = load_vec(buf, v);
    Vec<T> np, nb;
#pragma unroll
    for (int j = 0; j < W; ++j) sgd_element(a, rate, p.v[j], g.v[j], b.v[j], np.v[j], nb.v[j]);
    store_vec(new_param, v, np);
    store_vec(new_buf, v, nb);
  }
  for (int64_t i = packs * W + global_thread_index(); i < n; i += grid_stride())
    sgd_element(a, rate, param[i], grad[i], buf[i], new_param[i], new_buf[i]);
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

template <class T>
__device__ __forceinline__ void adamw_element(const AdamWArgs<compute_t<T>>& a,
                                              const AdamWStep<compute_t<T>>& s, T param, T grad,
                                              T m_in, T v_in, T& new_param, T& m_out, T& v_out) {
  using C = compute_t<T>;
  const C g = convert<C>(grad);
  const C m = add_rn(mul_rn(a.beta1, convert<C>(m_in)), mul_rn(a.one_minus_beta1, g));
  const C v = add_rn(mul_rn(a.beta2, convert<C>(v_in)), mul_rn(mul_rn(a.one_minus_beta2, g), g));
  const C p = mul_rn(convert<C>(param), s.decay);
  const C denominator = add_rn(div_rn(dm::sqrt(v), s.correction2_sqrt), a.eps);
  new_param = convert<T>(sub_rn(p, div_rn(mul_rn(s.size, m), denominator)));
  m_out = convert<T>(m);
  v_out = convert<T>(v);
}

template <class T, int W>
__global__ void adamw_kernel(const T* param, const T* grad, const T* m, const T* v, ScalarInput lr,
                             ScalarInput step, T* new_param, T* new_m, T* new_v, int64_t n,
                             AdamWArgs<compute_t<T>> a) {
  const AdamWStep<compute_t<T>> s = adamw_step(a, lr, step);
  const int64_t packs = W > 1 ? n / W : 0;
  for (int64_t i = global_thread_index(); i < packs; i += grid_stride()) {
    const Vec<T> p = load_vec(param, i), g = load_vec(grad, i);
    const Vec<T> mv = load_vec(m, i), vv = load_vec(v, i);
    Vec<T> np, nm, nv;
#pragma unroll
    for (int j = 0; j < W; ++j)
      adamw_element(a, s, p.v[j], g.v[j], mv.v[j], vv.v[j], np.v[j], nm.v[j], nv.v[j]);
    store_vec(new_param, i, np);
    store_vec(new_m, i, nm);
    store_vec(new_v, i, nv);
  }
  for (int64_t i = packs * W + global_thread_index(); i < n; i += grid_stride())
    adamw_element(a, s, param[i], grad[i], m[i], v[i], new_param[i], new_m[i], new_v[i]);
}

// ---- host ------------------------------------------------------------------------------

// The first `states` inputs and every output share param's type; the scalars are rank 0.
void check_update(const Node& n, Inputs in, size_t states, size_t scalars, Outputs out) {
  FUSEBOX_CHECK(in.size() == states + scalars && out.size() == states - 1, node_label(n),
                "expects ", states, " tensors and ", scalars, " scalars in, ", states - 1, " out");
  for (size_t i = 0; i < states; ++i) {
    FUSEBOX_CHECK(
        in[i]->dtype == in[0]->dtype && in[i]->shape == in[0]->shape && in[i]->is_contiguous(),
        node_label(n), "input ", i, " ", shape_str(in[i]->shape), " does not match param ",
        shape_str(in[0]->shape));
  }
  for (const DeviceTensor& t : out) {
    FUSEBOX_CHECK(t.dtype == in[0]->dtype && t.shape == in[0]->shape && t.is_contiguous(),
                  node_label(n), "output ", shape_str(t.shape), " does not match param ",
                  shape_str(in[0]->shape));
  }
  for (size_t i = states; i < states + scalars; ++i) {
    FUSEBOX_CHECK(in[i]->numel() == 1, node_label(n), i == states ? "lr" : "step",
                  " must be a scalar but is ", shape_str(in[i]->shape));
  }
}

// True when every pointer allows 16-byte vector access.
bool all_aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (!is_aligned(p, kVecBytes)) return false;
  return true;
}

}  // namespace

// (param, grad, momentum_buf, lr) -> (new_param, new_momentum_buf)
void sgd_update(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<SgdAttrs>(n.attrs);
  check_update(n, in, 3, 1, out);
  const int64_t count = in[0]->numel();
  if (count == 0) return;
  visit_device_float(n, in[0]->dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const SgdArgs<C> a{C(attrs.momentum), C(1.0 - attrs.dampening), C(attrs.weight_decay),
                       attrs.momentum != 0.0, attrs.nesterov};
    const T *param = in[0]->as<T>(), *grad = in[1]->as<T>(), *buf = in[2]->as<T>();
    T *new_param = out[0].as<T>(), *new_buf = out[1].as<T>();
    const ScalarInput lr{in[3]->data(), in[3]->dtype};
    const BufferList reads{in[0]->range(), in[1]->range(), in[2]->range(), in[3]->range()};
    const BufferList writes{out[0].range(), out[1].range()};
    constexpr int W = kVecWidth<T>;
    if (all_aligned({param, grad, buf, new_param, new_buf}))
      ctx.encoder.launch(sgd_kernel<T, W>, launch_blocks(count / W + 1), kDefaultThreads, 0, reads,
                         writes, param, grad, buf, lr, new_param, new_buf, count, a);
    else
      ctx.encoder.launch(sgd_kernel<T, 1>, launch_blocks(count), kDefaultThreads, 0, reads, writes,
                         param, grad, buf, lr, new_param, new_buf, count, a);
  });
}

// (param, grad, m, v, lr, step) -> (new_param, new_m, new_v)
void adamw_update(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<AdamWAttrs>(n.attrs);
  check_update(n, in, 4, 2, out);
  const int64_t count = in[0]->numel();
  if (count == 0) return;
  const ErrorSlot slot = ErrorFlags::of(ctx.encoder).reserve(node_label(n), [](int64_t, int64_t s) {
    return cat("step ", s, " must be >= 1 (it counts from 1)");
  });
  visit_device_float(n, in[0]->dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const AdamWArgs<C> a{C(attrs.beta1),       C(attrs.beta2),       C(attrs.epsilon),
                         C(1.0 - attrs.beta1), C(1.0 - attrs.beta2), attrs.beta1,
                         attrs.beta2,          attrs.weight_decay,   slot.record};
    const T *param = in[0]->as<T>(), *grad = in[1]->as<T>();
    const T *m = in[2]->as<T>(), *v = in[3]->as<T>();
    T *new_param = out[0].as<T>(), *new_m = out[1].as<T>(), *new_v = out[2].as<T>();
    const ScalarInput lr{in[4]->data(), in[4]->dtype}, step{in[5]->data(), in[5]->dtype};
    const BufferList reads{in[0]->range(), in[1]->range(), in[2]->range(),
                           in[3]->range(), in[4]->range(), in[5]->range()};
    const BufferList writes{out[0].range(), out[1].range(), out[2].range(), slot.range};
    constexpr int W = kVecWidth<T>;
    if (all_aligned({param, grad, m, v, new_param, new_m, new_v}))
      ctx.encoder.launch(adamw_kernel<T, W>, launch_blocks(count / W + 1), kDefaultThreads, 0,
                         reads, writes, param, grad, m, v, lr, step, new_param, new_m, new_v, count,
                         a);
    else
      ctx.encoder.launch(adamw_kernel<T, 1>, launch_blocks(count), kDefaultThreads, 0, reads,
                         writes, param, grad, m, v, lr, step, new_param, new_m, new_v, count, a);
  });
}

}  // namespace fusebox::cuda
