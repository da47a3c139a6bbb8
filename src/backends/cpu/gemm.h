// The CPU backend's one matrix-multiply routine, shared by matmul, gemm and the
// convolution kernels (which lower to it through im2col / col2im).
//
//   C = alpha * op(A) op(B) + beta * C      op(A) is [M, K], op(B) is [K, N], C is [M, N]
//
// Everything is row-major with leading dimensions in elements (the distance between
// the starts of two consecutive stored rows):
//   A stored [M, K] (lda >= K), or [K, M] when trans_a (lda >= M), and likewise
//   B stored [K, N] (ldb >= N), or [N, K] when trans_b (ldb >= K);
//   C stored [M, N] (ldc >= N).
// beta == 0 means C is only written, never read (it may hold NaN garbage). K == 0
// gives C = beta * C. Accumulation is in T (f32 for float, f64 for double).
//
// Threading: the work is split over blocks of C with fusebox::parallel_for; called
// from inside a parallel_for body it runs on the calling thread (the pool's rule for
// nested calls), so callers may parallelise over their own outer loop instead.
#pragma once

#include <cstdint>

namespace fusebox::cpu {

template <class T>
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// `batch` independent products: problem i reads a + i*stride_a and b + i*stride_b and
// writes c + i*stride_c (strides in elements; a stride of 0 broadcasts that operand).
// The C matrices must not overlap. Parallelised over batch and blocks together.
template <class T>
void blas_gemm_batched(int64_t batch, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       T alpha, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb,
                       int64_t stride_b, T beta, T* c, int64_t ldc, int64_t stride_c);

extern template void blas_gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                      int64_t, const float*, int64_t, float, float*, int64_t);
extern template void blas_gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                       int64_t, const double*, int64_t, double, double*, int64_t);
extern template void blas_gemm_batched<float>(int64_t, bool, bool, int64_t, int64_t, int64_t, float,
                                              const float*, int64_t, int64_t, const float*, int64_t,
                                              int64_t, float, float*, int64_t, int64_t);
extern template void blas_gemm_batched<double>(int64_t, bool, bool, int64_t, int64_t, int64_t,
                                               double, const double*, int64_t, int64_t,
                                               const double*, int64_t, int64_t, double, double*,
                                               int64_t, int64_t);

}  // namespace fusebox::cpu
