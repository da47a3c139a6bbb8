// Device-side element helpers of the CUDA kernels. Device-only: includes nothing outside
// device/ (host dtype dispatch is kernels/common/dtype_dispatch.cuh).
//
//   compute_t<T>       the type arithmetic runs in: f32 for __half/__nv_bfloat16, else T
//   convert<To>(v)     THE conversion rule between element types, identical to the CPU
//                      backend's (backends/cpu/kernel_util.h): float narrowing rounds to
//                      nearest even (f64 -> f16/bf16 directly, no double rounding);
//                      float -> integer truncates toward zero, NaN gives 0, out of range
//                      saturates; integer -> integer wraps; anything -> bool is (v != 0)
//   load_compute(p, i) / store_compute(p, i, c)
//                      read an element as compute_t<T> / round a computed value into T
//   Vec<T> / kVecWidth<T> / is_aligned(p, bytes)
//                      16-byte vector access: a kernel checks alignment of every pointer at
//                      run time and falls back to scalar accesses when it does not hold
//   dm::exp(v), dm::log, dm::sqrt, dm::tanh, dm::erf, dm::pow, dm::fabs
//                      f32 / f64 overloads of the CUDA math functions (expf / exp, ...),
//                      so that templates over the compute type pick the right precision
//   launch_blocks(n, threads)
//                      blocks for a grid-stride loop over n items: enough to fill the GPU
//                      several times over, never more than needed
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fusebox::cuda {

// ---- element types -------------------------------------------------------------------

template <class T>
constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <class T>
constexpr bool is_float_v = std::is_floating_point_v<T> || is_half_v<T>;

template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<__half> {
  using type = float;
};
template <>
struct compute_type<__nv_bfloat16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

// ---- the conversion rule -------------------------------------------------------------

template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half>) {
    return convert<To>(__half2float(v));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_same_v<To, __half>) {
    if constexpr (std::is_same_v<From, float>)
      return __float2half_rn(v);
    else
      return __double2half(double(v));  // one rounding from f64 (ints convert exactly or RNE)
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    if constexpr (std::is_same_v<From, float>)
      return __float2bfloat16_rn(v);
    else
      return __double2bfloat16(double(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    // numeric_limits is host-only; two's complement bounds spelt out.
    using U = std::make_unsigned_t<To>;
    constexpr To kMax = To(U(-1) >> 1);
    constexpr To kMin = To(-kMax - 1);
    if (v != v) return To(0);  // NaN
    if (v >= From(kMax)) return kMax;
    if (v <= From(kMin)) return kMin;
    return To(v);
  } else {
    return static_cast<To>(v);  // int -> int wraps (C++20), int/bool -> float rounds
  }
}

template <class T>
__device__ __forceinline__ compute_t<T> load_compute(const T* p, int64_t i) {
  return convert<compute_t<T>>(p[i]);
}
template <class T>
__device__ __forceinline__ void store_compute(T* p, int64_t i, compute_t<T> v) {
  p[i] = convert<T>(v);
}

// ---- math overloads ------------------------------------------------------------------

namespace dm {
__device__ __forceinline__ float exp(float v) {
  return ::expf(v);
}
__device__ __forceinline__ double exp(double v) {
  return ::exp(v);
}
__device__ __forceinline__ float log(float v) {
  return ::logf(v);
}
__device__ __forceinline__ double log(double v) {
  return ::log(v);
}
__device__ __forceinline__ float sqrt(float v) {
  return ::sqrtf(v);
}
__device__ __forceinline__ double sqrt(double v) {
  return ::sqrt(v);
}
__device__ __forceinline__ float tanh(float v) {
  return ::tanhf(v);
}
__device__ __forceinline__ double tanh(double v) {
  return ::tanh(v);
}
__device__ __forceinline__ float erf(float v) {
  return ::erff(v);
}
__device__ __forceinline__ double erf(double v) {
  return ::erf(v);
}
__device__ __forceinline__ float sin(float v) {
  return ::sinf(v);
}
__device__ __forceinline__ double sin(double v) {
  return ::sin(v);
}
__device__ __forceinline__ float cos(float v) {
  return ::cosf(v);
}
__device__ __forceinline__ double cos(double v) {
  return ::cos(v);
}
__device__ __forceinline__ float floor(float v) {
  return ::floorf(v);
}
__device__ __forceinline__ double floor(double v) {
  return ::floor(v);
}
__device__ __forceinline__ float ceil(float v) {
  return ::ceilf(v);
}
__device__ __forceinline__ double ceil(double v) {
  return ::ceil(v);
}
// Half to even (ONNX Round, torch.round).
__device__ __forceinline__ float round_even(float v) {
  return ::rintf(v);
}
__device__ __forceinline__ double round_even(double v) {
  return ::rint(v);
}
__device__ __forceinline__ float pow(float a, float b) {
  return ::powf(a, b);
}
__device__ __forceinline__ double pow(double a, double b) {
  return ::pow(a, b);
}
__device__ __forceinline__ float fabs(float v) {
  return ::fabsf(v);
}
__device__ __forceinline__ double fabs(double v) {
  return ::fabs(v);
}
__device__ __forceinline__ bool isnan(float v) {
  return v != v;
}
__device__ __forceinline__ bool isnan(double v) {
  return v != v;
}
}  // namespace dm

// ---- vector access -------------------------------------------------------------------

constexpr int kVecBytes = 16;
// Elements of T per 16-byte vector (4 f32, 8 f16/bf16, 2 f64/i64, 16 bool).
template <class T>
constexpr int kVecWidth = kVecBytes / int(sizeof(T));

// W elements of T in one aligned access of W * sizeof(T) bytes. Vec: the 16-byte one; a
// narrower pack reads the same W elements of a 16-bit operand beside f32 vectors.
template <class T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};
template <class T>
using Vec = Pack<T, kVecWidth<T>>;

__host__ __device__ __forceinline__ bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Vector i of p (p must be 16-byte aligned): one 128-bit load / store.
template <class T>
__device__ __forceinline__ Vec<T> load_vec(const T* p, int64_t i) {
  return reinterpret_cast<const Vec<T>*>(p)[i];
}
template <class T>
__device__ __forceinline__ void store_vec(T* p, int64_t i, const Vec<T>& v) {
  reinterpret_cast<Vec<T>*>(p)[i] = v;
}
// Pack i of p (p aligned to the pack's bytes).
template <int W, class T>
__device__ __forceinline__ Pack<T, W> load_pack(const T* p, int64_t i) {
  return reinterpret_cast<const Pack<T, W>*>(p)[i];
}
template <int W, class T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T, W>& v) {
  reinterpret_cast<Pack<T, W>*>(p)[i] = v;
}

// ---- launch sizing -------------------------------------------------------------------

constexpr int kDefaultThreads = 256;
// Grid-stride loops cap their grid at this many blocks: 132 SMs x 8 resident blocks of
// 256 threads x 2 waves. More only adds scheduling overhead.
constexpr int64_t kMaxGridStrideBlocks = 132 * 8 * 2;

inline unsigned launch_blocks(int64_t n, int threads = kDefaultThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxGridStrideBlocks) blocks = kMaxGridStrideBlocks;
  return unsigned(blocks);
}

// The grid-stride loop index of this thread and the loop's stride (64-bit: tensors may
// exceed 2^31 elements).
__device__ __forceinline__ int64_t global_thread_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return int64_t(gridDim.x) * blockDim.x;
}

}  // namespace fusebox::cuda
