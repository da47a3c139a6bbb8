// The device code every generated fused_pointwise kernel starts with (fused_codegen.h).
#include "backends/cuda/kernels/pointwise/fused_codegen.h"

namespace fusebox::cuda {

namespace {

// Everything a generated kernel uses besides its own instructions. Self-contained: NVRTC
// gets no include path, so f16/bf16 conversions are PTX (as cuda_fp16.h / cuda_bf16.h
// compile them on sm_80+) and the math functions are NVRTC's built-ins.
constexpr const char* kPreamble = R"CUDA(
struct FbParams {
  const void* in[16];
  void* out;
  long long n;
  long long extent[8];
  long long stride[16][8];
  unsigned div_mul[8];
  unsigned div_shift[8];
};
static_assert(sizeof(FbParams) == 1296, "FbParams must match the host's FusedParams");

__device__ __forceinline__ unsigned fb_fastdiv(unsigned n, unsigned mul, unsigned shift) {
  return mul == 0u ? n : (__umulhi(n, mul) >> shift);
}

// The compute type's precision (device/math.cuh's dm::).
__device__ __forceinline__ float fb_exp(float v) { return expf(v); }
__device__ __forceinline__ double fb_exp(double v) { return exp(v); }
__device__ __forceinline__ float fb_log(float v) { return logf(v); }
__device__ __forceinline__ double fb_log(double v) { return log(v); }
__device__ __forceinline__ float fb_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double fb_sqrt(double v) { return sqrt(v); }
__device__ __forceinline__ float fb_tanh(float v) { return tanhf(v); }
__device__ __forceinline__ double fb_tanh(double v) { return tanh(v); }
__device__ __forceinline__ float fb_erf(float v) { return erff(v); }
__device__ __forceinline__ double fb_erf(double v) { return erf(v); }
__device__ __forceinline__ float fb_sin(float v) { return sinf(v); }
__device__ __forceinline__ double fb_sin(double v) { return sin(v); }
__device__ __forceinline__ float fb_cos(float v) { return cosf(v); }
__device__ __forceinline__ double fb_cos(double v) { return cos(v); }
__device__ __forceinline__ float fb_floor(float v) { return floorf(v); }
__device__ __forceinline__ double fb_floor(double v) { return floor(v); }
__device__ __forceinline__ float fb_ceil(float v) { return ceilf(v); }
__device__ __forceinline__ double fb_ceil(double v) { return ceil(v); }
__device__ __forceinline__ float fb_round(float v) { return rintf(v); }
__device__ __forceinline__ double fb_round(double v) { return rint(v); }
__device__ __forceinline__ float fb_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double fb_pow(double a, double b) { return pow(a, b); }
__device__ __forceinline__ float fb_abs(float v) { return fabsf(v); }
__device__ __forceinline__ double fb_abs(double v) { return fabs(v); }
__device__ __forceinline__ float fb_add(float u, float v) { return __fadd_rn(u, v); }
__device__ __forceinline__ double fb_add(double u, double v) { return __dadd_rn(u, v); }
__device__ __forceinline__ float fb_sub(float u, float v) { return __fsub_rn(u, v); }
__device__ __forceinline__ double fb_sub(double u, double v) { return __dsub_rn(u, v); }
__device__ __forceinline__ float fb_mul(float u, float v) { return __fmul_rn(u, v); }
__device__ __forceinline__ double fb_mul(double u, double v) { return __dmul_rn(u, v); }
__device__ __forceinline__ float fb_div(float u, float v) { return __fdiv_rn(u, v); }
__device__ __forceinline__ double fb_div(double u, double v) { return __ddiv_rn(u, v); }

// The formulas of kernels/pointwise/unary.cu and binary.cu.
template <class C> __device__ __forceinline__ C fb_sigmoid(C v) {
  if (v >= C(0)) return C(1) / (C(1) + fb_exp(-v));
  const C e = fb_exp(v);
  return e / (C(1) + e);
}
template <class C> __device__ __forceinline__ C fb_relu(C v) { return v < C(0) ? C(0) : v; }
template <class C> __device__ __forceinline__ C fb_leaky_relu(C v, C alpha) {
  return v < C(0) ? alpha * v : v;
}
template <class C> __device__ __forceinline__ C fb_gelu(C v) {
  return C(0.5) * v * (C(1) + fb_erf(v * C(0.70710678118654752440)));
}
// backends/common/activation.h's gelu_tanh_ (the unfused kernel's): in f32, x * sigmoid(2u)
// by exp2 and an approximate reciprocal.
__device__ __forceinline__ float fb_gelu_tanh(float v) {
  const float e = exp2f(-2.302208198144325f * (v + 0.044715f * v * v * v));
  return __fdividef(v, 1.0f + e);
}
__device__ __forceinline__ double fb_gelu_tanh(double v) {
  const double k = 0.79788456080286535588;
  return 0.5 * v * (1.0 + fb_tanh(k * (v + 0.044715 * v * v * v)));
}
template <class C> __device__ __forceinline__ C fb_silu(C v) { return v * fb_sigmoid(v); }
template <class C> __device__ __forceinline__ C fb_rsqrt(C v) { return C(1) / fb_sqrt(v); }
template <class C> __device__ __forceinline__ C fb_reciprocal(C v) { return C(1) / v; }
template <class C> __device__ __forceinline__ C fb_clip(C v, C lo, C hi) {
  const C w = v < lo ? lo : v;
  return hi < w ? hi : w;
}
// unary_backward's derivatives, kernels/pointwise/backward.cu's formulas (the instruction is
// fb_mul(dy, f'(x)), as UnaryGrad's dy * df(x)). The double literals are the C++ constants
// backward.cu converts (std::numbers::sqrt2, inv_sqrtpi, and their products in double).
template <class C> __device__ __forceinline__ C fb_relu_grad(C v) { return v > C(0) ? C(1) : C(0); }
template <class C> __device__ __forceinline__ C fb_leaky_relu_grad(C v, C alpha) {
  return v > C(0) ? C(1) : alpha;
}
template <class C> __device__ __forceinline__ C fb_logistic(C v) {
  return C(1) / (C(1) + fb_exp(-v));
}
template <class C> __device__ __forceinline__ C fb_silu_grad(C v) {
  const C s = fb_logistic(v);
  return s * (C(1) + v * (C(1) - s));
}
template <class C> __device__ __forceinline__ C fb_sigmoid_grad(C v) {
  const C s = fb_logistic(v);
  return s * (C(1) - s);
}
template <class C> __device__ __forceinline__ C fb_tanh_grad(C v) {
  const C t = fb_tanh(v);
  return C(1) - t * t;
}
template <class C> __device__ __forceinline__ C fb_gelu_tanh_grad(C v) {
  const C k = C(1.4142135623730951) * C(0.5641895835477563);
  const C t = fb_tanh(k * (v + C(0.044715) * v * v * v));
  return C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * k * (C(1) + C(0.134145) * v * v);
}
template <class C> __device__ __forceinline__ C fb_gelu_grad(C v) {
  const C cdf = C(0.5) * (C(1) + fb_erf(v * C(0.7071067811865476)));
  const C pdf = fb_exp(C(-0.5) * v * v) * C(0.3989422804014327);
  return cdf + v * pdf;
}
template <class C> __device__ __forceinline__ C fb_max(C u, C v) { return (u > v || u != u) ? u : v; }
template <class C> __device__ __forceinline__ C fb_min(C u, C v) { return (u < v || u != u) ? u : v; }

// Element types: S as stored, C as computed. load (exact), store (rounds to nearest even),
// round (to S and back); unpack / pack: W lanes from / to their 32-bit words as stored
// (pack rounds, two 16-bit lanes per cvt). The 16-bit types also compute on packed words
// (add2 .. abs2, sm_80+): with both operands of the type, f32 arithmetic rounded to it
// gives what one rounding of the exact result gives (f32 has more than 2p + 2 bits: the
// double rounding is innocuous for + - *), so a packed fma is the unfused op's value, zero
// signs and NaN payloads aside.
template <class T> struct fb_plain_type {  // stored as computed: f32, f64
  typedef T S;
  typedef T C;
  static __device__ __forceinline__ T load(T s) { return s; }
  static __device__ __forceinline__ T store(T v) { return v; }
  static __device__ __forceinline__ T round(T v) { return v; }
};
struct fb_f32 : fb_plain_type<float> {
  template <int W> static __device__ __forceinline__ void unpack(const unsigned* w, float (&v)[W]) {
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = __uint_as_float(w[j]);
  }
  template <int W> static __device__ __forceinline__ void pack(const float (&v)[W], unsigned* w) {
#pragma unroll
    for (int j = 0; j < W; ++j) w[j] = __float_as_uint(v[j]);
  }
};
struct fb_f64 : fb_plain_type<double> {
  template <int W> static __device__ __forceinline__ void unpack(const unsigned* w, double (&v)[W]) {
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = __hiloint2double((int)w[2 * j + 1], (int)w[2 * j]);
  }
  template <int W> static __device__ __forceinline__ void pack(const double (&v)[W], unsigned* w) {
#pragma unroll
    for (int j = 0; j < W; ++j) {
      w[2 * j] = (unsigned)__double2loint(v[j]);
      w[2 * j + 1] = (unsigned)__double2hiint(v[j]);
    }
  }
};

// What the 16-bit types share: lanes as words, and packed arithmetic (E supplies lo, hi,
// pack2 and the packed fma / max / min of its PTX type).
template <class E> struct fb_half_type {
  typedef unsigned short S;
  typedef float C;
  static __device__ __forceinline__ float round(float v) { return E::load(E::store(v)); }
  template <int W> static __device__ __forceinline__ void unpack(const unsigned* w, float (&v)[W]) {
#pragma unroll
    for (int j = 0; j < W / 2; ++j) {
      v[2 * j] = E::lo(w[j]);
      v[2 * j + 1] = E::hi(w[j]);
    }
  }
  template <int W> static __device__ __forceinline__ void pack(const float (&v)[W], unsigned* w) {
#pragma unroll
    for (int j = 0; j < W / 2; ++j) w[j] = E::pack2(v[2 * j], v[2 * j + 1]);
  }
  static __device__ __forceinline__ unsigned add2(unsigned a, unsigned b) { return E::fma2(a, E::kOne, b); }
  static __device__ __forceinline__ unsigned sub2(unsigned a, unsigned b) { return E::fma2(b, E::kMinusOne, a); }
  static __device__ __forceinline__ unsigned mul2(unsigned a, unsigned b) { return E::fma2(a, b, 0x80008000u); }
  static __device__ __forceinline__ unsigned relu2(unsigned a) { return E::max2(a, 0u); }
  static __device__ __forceinline__ unsigned neg2(unsigned a) { return a ^ 0x80008000u; }
  static __device__ __forceinline__ unsigned abs2(unsigned a) { return a & 0x7fff7fffu; }
#if !(__CUDA_ARCH__ >= 800)  // no packed 16-bit PTX: each lane in f32, then rounded
  static __device__ __forceinline__ unsigned fma2(unsigned a, unsigned b, unsigned c) {
    return E::pack2(__fmaf_rn(E::lo(a), E::lo(b), E::lo(c)), __fmaf_rn(E::hi(a), E::hi(b), E::hi(c)));
  }
  static __device__ __forceinline__ unsigned max2(unsigned a, unsigned b) {
    return E::pack2(fb_max(E::lo(a), E::lo(b)), fb_max(E::hi(a), E::hi(b)));
  }
  static __device__ __forceinline__ unsigned min2(unsigned a, unsigned b) {
    return E::pack2(fb_min(E::lo(a), E::lo(b)), fb_min(E::hi(a), E::hi(b)));
  }
#endif
};

// pack2, fma2, max2 and min2 of a 16-bit type in its packed PTX type T ("bf16x2", "f16x2");
// before sm_80, pack2 by two stores and the others in f32 (fb_half_type).
#if __CUDA_ARCH__ >= 800
#define FB_PACKED_PTX(T)                                                                   \
  static __device__ __forceinline__ unsigned pack2(float lo, float hi) {                  \
    unsigned r;                                                                            \
    asm("cvt.rn." T ".f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));                     \
    return r;                                                                              \
  }                                                                                        \
  static __device__ __forceinline__ unsigned fma2(unsigned a, unsigned b, unsigned c) {   \
    unsigned r;                                                                            \
    asm("fma.rn." T " %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));               \
    return r;                                                                              \
  }                                                                                        \
  static __device__ __forceinline__ unsigned max2(unsigned a, unsigned b) {               \
    unsigned r;                                                                            \
    asm("max.NaN." T " %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));                          \
    return r;                                                                              \
  }                                                                                        \
  static __device__ __forceinline__ unsigned min2(unsigned a, unsigned b) {               \
    unsigned r;                                                                            \
    asm("min.NaN." T " %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));                          \
    return r;                                                                              \
  }
#else
#define FB_PACKED_PTX(T)                                                                   \
  static __device__ __forceinline__ unsigned pack2(float lo, float hi) {                  \
    return (unsigned)store(lo) | ((unsigned)store(hi) << 16);                              \
  }
#endif

struct fb_bf16 : fb_half_type<fb_bf16> {
  static constexpr unsigned kOne = 0x3f803f80u, kMinusOne = 0xbf80bf80u;
  static __device__ __forceinline__ float load(unsigned short s) {
    return __uint_as_float(((unsigned)s) << 16);
  }
  static __device__ __forceinline__ float lo(unsigned w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
  static __device__ __forceinline__ unsigned short store(float v) {
#if __CUDA_ARCH__ >= 800
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
#else
    const unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
  }
  FB_PACKED_PTX("bf16x2")
  // Rounded to odd in f32 first, then to nearest even: one rounding from f64, as the CPU's
  // BFloat16(double).
  static __device__ __forceinline__ float from_double(double d) {
    float f = __double2float_rz(d);
    if ((double)f != d && d == d) f = __uint_as_float(__float_as_uint(f) | 1u);
    return round(f);
  }
};
struct fb_f16 : fb_half_type<fb_f16> {
  static constexpr unsigned kOne = 0x3c003c00u, kMinusOne = 0xbc00bc00u;
  static __device__ __forceinline__ float load(unsigned short s) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(s));
    return r;
  }
  static __device__ __forceinline__ float lo(unsigned w) { return load((unsigned short)(w & 0xffffu)); }
  static __device__ __forceinline__ float hi(unsigned w) { return load((unsigned short)(w >> 16)); }
  static __device__ __forceinline__ unsigned short store(float v) {
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
  }
  FB_PACKED_PTX("f16x2")
  static __device__ __forceinline__ float from_double(double d) {
    unsigned short r;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(r) : "d"(d));
    return load(r);
  }
};

// N 32-bit words at p (16-byte aligned), by 16-byte loads and stores. The loads take the
// read-only path (ld.global.nc): the compiler may then issue an unrolled step's loads before
// the previous step's stores, which it must not with plain loads (the output may be an
// input's buffer; each element is still read before it is written, by the same thread).
template <int N> __device__ __forceinline__ void fb_load_words(const void* p, unsigned (&w)[N]) {
  const uint4* src = static_cast<const uint4*>(p);
#pragma unroll
  for (int c = 0; c < N / 4; ++c) {
    const uint4 v = __ldg(src + c);
    w[4 * c] = v.x;
    w[4 * c + 1] = v.y;
    w[4 * c + 2] = v.z;
    w[4 * c + 3] = v.w;
  }
}
template <int N> __device__ __forceinline__ void fb_store_words(void* p, const unsigned (&w)[N]) {
  uint4* dst = static_cast<uint4*>(p);
#pragma unroll
  for (int c = 0; c < N / 4; ++c) dst[c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
}
)CUDA";

}  // namespace

const char* fused_kernel_preamble() {
  return kPreamble;
}

}  // namespace fusebox::cuda
